#!/usr/bin/env python
"""The cost of one gradient clip of a ViT-S/16 DINO / iBOT (``Updater.clip``, max norm 3.0) per
``clip_mode``: all parameters together, each part, each parameter (one ``clip_grad_norm_`` per
trainable student parameter, fused: ``clip_parts_``), side by side in one process with
alternated repeats; with the per-parameter clip as one ``clip_grad_norm_`` call per parameter
(the Updater's loop before ``clip_parts_``; the two are checked equal bit for bit on these
gradients) and the authors' per-parameter loop (``utils.clip_gradients`` written out: a norm, a
host read and a multiply per parameter) as references.

    hold_nice .venv/bin/python benchmarks/bench_clip_modes.py [--repeats 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from contrastive.engine.step import Updater
from contrastive.hardware import cpu_kind_line
from contrastive.methods import DINO, IBOT

MODES = ("all", "part", "parameter")


def _accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def codes_loop(params: list[torch.nn.Parameter], clip: float) -> None:
    """The authors' per-parameter clip, written out (the reference)."""
    for p in params:
        if p.grad is not None:
            norm = p.grad.norm(2)
            coef = clip / (norm.item() + 1e-6)
            if coef < 1:
                p.grad.mul_(coef)


def call_each(parts: list[list[torch.nn.Parameter]], clip: float) -> None:
    """One ``clip_grad_norm_`` per part (the Updater's loop before ``clip_parts_``)."""
    for part in parts:
        torch.nn.utils.clip_grad_norm_(part, clip)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(cpu_kind_line(), f"threads {args.threads}")
    acc = _accelerator()
    for cls in (DINO, IBOT):
        torch.manual_seed(0)
        method = cls.from_preset("vit_small")
        params = [p for p in method.parameters() if p.requires_grad]
        grads = [torch.randn_like(p) for p in params]  # norms >> 3: every clip scales
        opt = acc.prepare(torch.optim.SGD(params, lr=0.0))
        ups = {}
        for mode in MODES:
            method.clip_mode = mode
            ups[mode] = Updater(method, opt, acc, method=method)
        per_call = ups["parameter"].clip_lists or []
        refs = {"parameter, a call each": functools.partial(call_each, per_call, 3.0),
                "codes' loop": functools.partial(codes_loop, params, 3.0)}
        times: dict[str, list[float]] = {m: [] for m in (*MODES, *refs)}
        out: dict[str, list[torch.Tensor]] = {}
        for _ in range(args.repeats):
            for name in times:
                for p, g in zip(params, grads):
                    p.grad = g.clone()
                start = time.perf_counter()
                if name in ups:
                    ups[name].clip(3.0)
                else:
                    refs[name]()
                times[name].append(time.perf_counter() - start)
                out[name] = [p.grad for p in params]
        same = all(torch.equal(a, b) for a, b in zip(out["parameter"],
                                                      out["parameter, a call each"]))
        print(f"  parameter (fused) == a clip_grad_norm_ call each, bit for bit: {same}")
        n = sum(p.numel() for p in params)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{cls.__name__} vit_small: {len(params)} trainable tensors, {n / 1e6:.1f} M "
              f"parameters; median ms per clip over {args.repeats} alternated repeats:")
        for k, v in med.items():
            print(f"  {k:23s} {v:8.2f} ms  ({v / med['all']:.2f} x all)")


if __name__ == "__main__":
    main()
