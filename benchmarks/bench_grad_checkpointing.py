"""Activation checkpointing (``--grad-checkpointing``): peak memory against step time.

A training step (forward, a loss on the features, backward) of a timm ViT at 224 px, with and
without :func:`contrastive.nn.checkpointing.enable_grad_checkpointing`, each setting in a FRESH
subprocess (its peak resident set, ``ru_maxrss``, is that setting's alone). Reported per model:
the resident set before the first step (model, inputs), the peak over the steps, their
difference (what the step adds: activations and gradients), and the median step time of
``--steps`` timed steps after one warm-up step. The settings alternate (plain, checkpointed,
plain, ...) over ``--rounds`` so that a change in the machine's load falls on both.

Usage::

    python benchmarks/bench_grad_checkpointing.py --models vit_small_patch16_224:32 vit_base_patch16_224:16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(model_name: str, batch: int, checkpointed: bool, steps: int) -> dict[str, float]:
    """One setting, in this process: resident sets and step times."""
    import torch

    from contrastive.nn import create_encoder
    from contrastive.nn.checkpointing import enable_grad_checkpointing

    torch.manual_seed(0)
    model = create_encoder(f"timm:{model_name}").train()
    if checkpointed:
        enable_grad_checkpointing(model)
    x = torch.randn(batch, 3, 224, 224)
    before = _rss_mb()
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)
        if step:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"before_mb": before, "peak_mb": peak, "step_s": statistics.median(times)}


def run(model_name: str, batch: int, checkpointed: bool, steps: int, threads: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--child", model_name, str(batch),
                          str(int(checkpointed)), str(steps)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["vit_small_patch16_224:32", "vit_base_patch16_224:16"],
                   help="timm model names with their batch, NAME:BATCH")
    p.add_argument("--steps", type=int, default=2, help="timed steps per process (after one warm-up)")
    p.add_argument("--rounds", type=int, default=1, help="processes per setting, alternated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        name, batch, checked, steps = args.child
        print(json.dumps(child(name, int(batch), bool(int(checked)), int(steps))))
        return
    import torch

    print(f"CPU: {platform.processor() or platform.machine()}, capability "
          f"{torch.backends.cpu.get_cpu_capability()}, threads {args.threads}, "
          f"load {os.getloadavg()[0]:.1f}, torch {torch.__version__}\n")
    print("| model | batch | checkpointing | resident before step (MB) | peak (MB) | added by the step (MB) | step (s) |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.models:
        name, batch = spec.split(":")
        results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for checked in (False, True):
                results[checked].append(run(name, int(batch), checked, args.steps, args.threads))
        for checked, rows in results.items():
            before = statistics.median(r["before_mb"] for r in rows)
            peak = statistics.median(r["peak_mb"] for r in rows)
            step = statistics.median(r["step_s"] for r in rows)
            print(f"| {name} | {batch} | {'on' if checked else 'off'} | {before:.0f} | {peak:.0f} | "
                  f"{peak - before:.0f} | {step:.2f} |")


if __name__ == "__main__":
    main()
