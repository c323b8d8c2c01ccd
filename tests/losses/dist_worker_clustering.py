"""Worker for tests/losses/test_clustering.py (not a test module itself).

Run as ``python dist_worker_clustering.py RANK WORLD INIT_FILE OUT_DIR``: rank 0 first computes
the one-process SwAV codes and DINO centre on the whole batch (8 rows); then each rank computes
them on its 4 rows with the sums all-reduced over gloo, and once without (the mutation check).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from contrastive.losses.clustering import dino_center, sinkhorn_knopp


def main() -> None:
    rank, world, init_file, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    g = torch.Generator().manual_seed(0)
    scores = torch.tanh(torch.randn(8, 5, generator=g, dtype=torch.float64))
    teacher = torch.randn(8, 2, 5, generator=g, dtype=torch.float64)
    center = torch.zeros(5, dtype=torch.float64)
    result: dict = {}
    if rank == 0:
        result["full"] = {"codes": sinkhorn_knopp(scores, epsilon=0.3),
                          "center": dino_center(center, teacher)}
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        rows = slice(rank * 4, (rank + 1) * 4)
        result["codes"] = sinkhorn_knopp(scores[rows], epsilon=0.3)
        result["codes_local"] = sinkhorn_knopp(scores[rows], epsilon=0.3, distributed=False)
        result["center"] = dino_center(center, teacher[rows])
    finally:
        dist.destroy_process_group()
    torch.save(result, f"{out_dir}/rank{rank}.pt")


if __name__ == "__main__":
    main()
