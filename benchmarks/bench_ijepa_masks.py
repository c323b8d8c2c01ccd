#!/usr/bin/env python
"""I-JEPA's multi-block masks of one batch: ours (``contrastive.nn.masking.multiblock_masks``,
tensor ops over the batch, drawn in the method's forward) against lightly's
``IJEPAMaskCollator`` (``lightly.data.ijepa_collate``: the authors' collator, a Python loop over
images and blocks, run in the loader's workers), with the authors' ViT-H/14 settings
(``configs/in1k_vith14_ep300.yaml``: a 16 x 16 patch grid, 4 targets 0.15-0.2 with aspect
0.75-1.5, one context 0.85-1.0, min_keep 10). The two alternate call by call in one process;
the median ms per batch after a warm-up. lightly is not a dependency: ``pip install lightly``
(its collator needs nothing beyond torch).

    python benchmarks/bench_ijepa_masks.py --batch-size 128 --calls 30 --threads 1

Measured 2026-11-29, AMD EPYC (AVX2 Zen 3), 1 thread, lightly 1.6.0, load 11 (other sessions'
processes): ours 19.2 ms, lightly 484.9 ms per batch of 128 (25x). The figure is the cost of the
masks only: the authors' and lightly's run in loader workers
beside the training step, ours in the step (on the host, before the forward).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from lightly.data.ijepa_collate import IJEPAMaskCollator

    from contrastive.nn.masking import multiblock_masks

    theirs = IJEPAMaskCollator(input_size=224, patch_size=14, enc_mask_scale=(0.85, 1.0),
                               pred_mask_scale=(0.15, 0.2), aspect_ratio=(0.75, 1.5), nenc=1,
                               npred=4, min_keep=10)
    items = [(torch.zeros(1), 0)] * args.batch_size
    positions = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"ours": [], "lightly": []}
    for call in range(args.warmup + args.calls):
        for name in times:
            t = time.perf_counter()
            if name == "ours":
                multiblock_masks(args.batch_size, 16, 16,
                                 sizes=torch.Generator().manual_seed(call), positions=positions)
            else:
                theirs(items)
            if call >= args.warmup:
                times[name].append(1e3 * (time.perf_counter() - t))
    ours, lightly = (statistics.median(times[n]) for n in ("ours", "lightly"))
    print(f"batch {args.batch_size}, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}: "
          f"ours {ours:.2f} ms, lightly {lightly:.2f} ms per batch ({lightly / ours:.1f}x)")


if __name__ == "__main__":
    main()
