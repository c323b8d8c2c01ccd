#!/usr/bin/env python
"""Split BN's memory formats: one forward + backward of the CIFAR ResNet-18 per step, with
plain BatchNorm2d in NCHW and in channels_last (what the layout gains without split BN),
SplitBatchNorm2d in NCHW (the MoCo CIFAR demo's default) and SplitBatchNorm2d in channels_last
(regrouped with two row copies per layer, never NCHW). The variants alternate step by step in
one process; the median ms per step after the warm-up.

    OMP_NUM_THREADS=1 python benchmarks/bench_split_bn.py --batch-size 64 --steps 5
    python benchmarks/bench_split_bn.py --device cuda --dtype bf16 --batch-size 512

Prints a markdown table: ms per step and speed against split BN in NCHW.

Measured 2026-11-30, split 8, speed against split BN in NCHW:
- Intel Xeon (family 6 model 207, AVX-512), 1 thread, torch 2.14.1, batch 64, fp32, load ~2.5
  (other jobs): split BN channels_last 0.85x (2,198 against 1,861 ms), BatchNorm2d NCHW 1.09x.
- One H200, batch 512, torch on the device machine, same comparison run from a scratch copy of
  this code (the script's own variants): split BN channels_last bf16 0.81-0.91x (20.7-23.8
  against 18.8-19.2 ms), fp32 0.87-0.94x; BatchNorm2d channels_last 2.0x (bf16) and 1.7x
  (fp32). A closed-form per-group BN without copies ran 0.63x (bf16) / 0.77x (fp32) there,
  0.82x against this path's 0.84x on a CPU block: hence the copies. So channels_last stays
  off by default with split BN on CUDA (``default_channels_last``): the convolutions gain,
  the split BN layers lose more.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from contrastive.hardware import cpu_kind_line
from contrastive.nn import create_encoder
from contrastive.nn.norm import convert_to_split_bn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--splits", type=int, default=8, help="split BN's num_splits")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"),
                        help="bf16 = autocast (parameters stay float32)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    plain = create_encoder("cifar_resnet18").to(device)
    split = convert_to_split_bn(copy.deepcopy(plain), args.splits)
    x = torch.randn(args.batch_size, 3, 32, 32, device=device)
    cl = torch.channels_last
    variants: dict[str, tuple[nn.Module, torch.Tensor]] = {
        "BatchNorm2d, NCHW": (plain, x),
        "SplitBatchNorm2d, NCHW": (split, x),
        "SplitBatchNorm2d, channels_last": (copy.deepcopy(split).to(memory_format=cl),
                                            x.contiguous(memory_format=cl)),
        "BatchNorm2d, channels_last": (copy.deepcopy(plain).to(memory_format=cl),
                                       x.contiguous(memory_format=cl)),
    }
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) \
        if args.dtype == "bf16" else contextlib.nullcontext

    def step(model: nn.Module, inp: torch.Tensor) -> float:
        model.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        with autocast():
            out = model(inp)
        out.float().square().mean().backward()
        sync()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.warmup + args.steps):
        for name, (model, inp) in variants.items():
            t = step(model, inp)
            if i >= args.warmup:
                times[name].append(t)
    kind = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{cpu_kind_line()} (torch capability "
                 f"{torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} thread(s)")
    print(f"CIFAR ResNet-18, batch {args.batch_size}, split BN {args.splits}, {args.dtype}, "
          f"{kind}, torch {torch.__version__}, median of {args.steps} steps\n")
    ref = statistics.median(times["SplitBatchNorm2d, NCHW"])
    print("| variant | ms per step (fwd + bwd) | speed vs split BN NCHW |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {1e3 * med:.1f} | {ref / med:.2f}x |")


if __name__ == "__main__":
    main()
