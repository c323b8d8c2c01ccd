#!/usr/bin/env python
"""Main-process loading time of the engine's loader: ms per batch of 32 (30 batches), for
comparing trees side by side (``PYTHONPATH=<tree> python benchmarks/bench_item_seeding.py``;
benchmarks/results/issue15.md). What the item seeding (``SeededDataset``) costs shows here."""

from __future__ import annotations

import time


def main() -> None:
    from contrastive.augment import get_pipeline
    from contrastive.data import get_dataset
    from contrastive.engine.loader import GlobalBatchSampler, build_train_loader
    from contrastive.hardware import cpu_kind_line

    worker_fn, _ = get_pipeline("mocov2", image_size=32).split()
    ds = get_dataset("synthetic:n=1024,size=32", "train", transform=worker_fn)
    loader = build_train_loader(ds, GlobalBatchSampler(len(ds), 32, seed=0), seed=0,
                                num_workers=0, pin_memory=False)
    t, n = time.perf_counter(), 0
    for _ in loader:
        n += 1
        if n == 30:
            break
    print(f"{(time.perf_counter() - t) / n * 1000:.1f} ms per batch ({cpu_kind_line()})")


if __name__ == "__main__":
    main()
