"""Case of tests/losses/test_clustering.py for the one worker, tests/dist_worker.py.

Rank 0 first computes
the one-process SwAV codes and DINO centre on the whole batch (8 rows); then each rank computes
them on its 4 rows with the sums all-reduced over gloo, and once without (the mutation check).
"""

from __future__ import annotations

import torch

from contrastive.losses.clustering import dino_center, sinkhorn_knopp


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores (8, 5), teacher outputs (8, 2, 5) and a zero centre (5,), float64."""
    g = torch.Generator().manual_seed(0)
    scores = torch.tanh(torch.randn(8, 5, generator=g, dtype=torch.float64))
    teacher = torch.randn(8, 2, 5, generator=g, dtype=torch.float64)
    return scores, teacher, torch.zeros(5, dtype=torch.float64)


def reference(world: int) -> dict:
    scores, teacher, center = data()
    return {"full": {"codes": sinkhorn_knopp(scores, epsilon=0.3),
                     "center": dino_center(center, teacher)}}


def distributed(rank: int, world: int) -> dict:
    scores, teacher, center = data()
    rows = slice(rank * 4, (rank + 1) * 4)
    return {"codes": sinkhorn_knopp(scores[rows], epsilon=0.3),
            "codes_local": sinkhorn_knopp(scores[rows], epsilon=0.3, distributed=False),
            "center": dino_center(center, teacher[rows])}
