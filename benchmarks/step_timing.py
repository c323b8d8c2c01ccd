"""The timing main of the benchmarks that race our training step against a peer library's on the
same model and inputs (bench_mae.py, bench_ibot.py); not a benchmark itself.

Each implementation is built afresh per precision; they alternate step by step in ONE process
(the same load for both), and the median ms/step after ``--warmup`` steps is printed, in fp32 and
under bf16 autocast (worth it where the CPU computes bf16 natively), with the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

#: a training step on the benchmark's inputs (forward, loss, backward, optimiser step)
Step = Callable[[Any], torch.Tensor]


def timing_parser(description: str, batch_size: int, steps: int) -> argparse.ArgumentParser:
    """The options every such benchmark has; a script adds its own before parsing."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--precisions", default="fp32,bf16")
    return p


def backward_step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> torch.Tensor:
    """The end of every raced step: clear the gradients, backward, one optimiser step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def setting_line(*packages: str) -> str:
    """The CPU kind (model, torch's capability, native bf16 or not), the versions of torch and of
    ``packages`` and the load averages: printed before and after a race, as a shared machine's
    absolute figures mean little without them."""
    from importlib.metadata import version

    from contrastive.hardware import cpu_kind_line

    versions = ", ".join(f"{name} {version(name)}" for name in ("torch", *packages))
    return f"# {cpu_kind_line()}; {versions}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


def race(args: argparse.Namespace, inputs: Any, ours: Callable[[], Step],
         lightly: Callable[[], Step], setting: str = "") -> dict[str, dict[str, float]]:
    """Time the steps that ``ours()`` and ``lightly()`` build on ``inputs``, alternated, per
    precision of ``--precisions``; print the machine line (``setting`` appended) and one line
    per precision. Returns the median ms/step by precision, then by ``"ours"`` / ``"lightly"``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}, batch "
          f"{args.batch_size}{setting}")
    medians: dict[str, dict[str, float]] = {}
    for precision in args.precisions.split(","):
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
               else contextlib.nullcontext())
        steps = {"ours": ours(), "lightly": lightly()}
        times: dict[str, list[float]] = {k: [] for k in steps}
        for i in range(args.steps):
            for name, step in steps.items():
                t = time.perf_counter()
                with ctx:
                    step(inputs)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        ratios = [theirs / mine for mine, theirs in zip(times["ours"], times["lightly"])]
        print(f"{precision}: ours {med['ours']:.1f} ms/step, lightly {med['lightly']:.1f} "
              f"ms/step, lightly / ours = {med['lightly'] / med['ours']:.2f} (step by step "
              f"{min(ratios):.2f}-{max(ratios):.2f}; load {os.getloadavg()[0]:.2f})")
        medians[precision] = med
    return medians
