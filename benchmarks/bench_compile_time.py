#!/usr/bin/env python
"""How long ``torch.compile`` takes for the CIFAR ResNet-18's training step, with plain BN and
with split BN (the MoCo CIFAR demo's), each in a fresh process with its own empty inductor
cache: the first forward + backward (tracing, AOT autograd, code generation and the kernels'
compilation) against a later one.

    python benchmarks/bench_compile_time.py                  # CPU, batch 16
    python benchmarks/bench_compile_time.py --device cuda --batch-size 512

Why: on an H200 (2026-12-01) ``moco_cifar --compile`` logged no step window in the 146 s after
compiling began; on the CPU the split-BN step compiles 3.6-5.3x slower than the plain one (below),
so the GPU run most likely needs a longer first step, not a fix for a recompilation loop.

Measured 2026-12-01, Intel Xeon (family 6 model 207, AVX-512), 2 threads, torch 2.14.1, batch
16, fp32, beside two nice-19 jobs, two runs of the pair: plain BN 73.4 / 50.9 s first step,
later steps 2.1 / 0.85 s; split BN (8 groups) 261.1 / 268.2 s, later 0.96 s: 3.6x / 5.3x.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def one(variant: str, device: str, batch: int, splits: int) -> dict[str, float]:
    """The measurement, in this (fresh) process."""
    import torch

    from contrastive.nn import create_encoder
    from contrastive.nn.norm import convert_to_split_bn

    torch.manual_seed(0)
    model = create_encoder("cifar_resnet18").to(device)
    if variant == "split":
        convert_to_split_bn(model, splits)
    model.train().compile()
    x = torch.randn(batch, 3, 32, 32, device=device)

    def step() -> float:
        t = time.perf_counter()
        model(x).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    first = step()
    later = min(step() for _ in range(3))
    return {"first_s": round(first, 1), "later_s": round(later, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--splits", type=int, default=8)
    p.add_argument("--one", choices=("plain", "split"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.device, a.batch_size, a.splits)))
        return
    from contrastive.hardware import cpu_kind_line

    print(f"{cpu_kind_line()}; device {a.device}, batch {a.batch_size}\n")
    print("| BN | first step: compile (s) | later step (s) |\n|---|---|---|")
    for variant in ("plain", "split"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            out = subprocess.run([sys.executable, __file__, "--one", variant, "--device", a.device,
                                  "--batch-size", str(a.batch_size), "--splits", str(a.splits)],
                                 env=env, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        name = "plain" if variant == "plain" else f"split ({a.splits} groups)"
        print(f"| {name} | {r['first_s']} | {r['later_s']} |", flush=True)


if __name__ == "__main__":
    main()
