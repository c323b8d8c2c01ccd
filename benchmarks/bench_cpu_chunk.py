#!/usr/bin/env python
"""CPU batched augmentation: chunks of 2 samples (the old default) vs ``cpu_chunk`` (chunks
holding the pixels of two 224 px images), interleaved in one process, median of 7.

    OMP_NUM_THREADS=2 python benchmarks/bench_cpu_chunk.py

Prints, per image size, both times, the ratio and whether the views are identical.
"""

from __future__ import annotations

import statistics
import time

import torch

from contrastive.augment import get_pipeline
from contrastive.augment.batched import cpu_chunk
from contrastive.hardware import cpu_kind_line


def main() -> None:
    print(f"{cpu_kind_line()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for size, batch in ((24, 128), (32, 256), (96, 64), (224, 32)):
        _, augment = get_pipeline("mocov2", image_size=size).split()
        views = [torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
                 for _ in range(2)]

        def once(chunk: int | None, augment=augment, views=views
                 ) -> tuple[float, list[torch.Tensor]]:
            augment.chunk_size = chunk
            t = time.perf_counter()
            out = augment(views, torch.Generator().manual_seed(0))
            return time.perf_counter() - t, out

        once(2), once(None)  # warm-up
        old, new = [], []
        for _ in range(7):
            old.append(once(2)[0])
            new.append(once(None)[0])
        same = all(torch.equal(a, b) for a, b in zip(once(2)[1], once(None)[1]))
        a, b = statistics.median(old), statistics.median(new)
        print(f"{size} px x {batch}: chunk 2 {a * 1e3:.1f} ms, chunk {cpu_chunk((size, size))} "
              f"{b * 1e3:.1f} ms, {a / b:.2f}x, identical views: {same}")


if __name__ == "__main__":
    main()
