"""Case of tests/methods/test_vicregl_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains VICRegL in one process on the whole batch (2B images, three views: two of
8 px, one of 4 px, with their crop boxes); then both ranks train the same steps on their half
with gloo + DDP; then again with a gather that keeps only this process's gradient (the bug a
batch-statistics loss must not have). Float64, BN in eval mode (its running statistics make
every sample independent; the losses' own batch statistics are what is compared).
"""

from __future__ import annotations

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods import VICRegL
from contrastive.methods import vicregl as vicregl_module
from contrastive.nn import distributed as D

B, STEPS, SIZES = 4, 3, (8, 8, 4)  # 4 x 4 and 2 x 2 maps of the two-block small CNN


def batches(world: int):
    g = torch.Generator().manual_seed(123)
    out = []
    for _ in range(STEPS):
        views = [torch.randn(world * B, 3, s, s, generator=g, dtype=torch.float64) for s in SIZES]
        corner = torch.rand(world * B, len(SIZES), 2, generator=g, dtype=torch.float64) * 20
        side = 8 + torch.rand(world * B, len(SIZES), 2, generator=g, dtype=torch.float64) * 12
        out.append((views, torch.cat([corner, side], dim=2)))
    return out


def _gather_local_grad(z):
    """Every row gathered, but only this process's rows keep their gradient."""
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])


def train(rank: int, world: int, mutate: bool = False) -> dict:
    torch.manual_seed(0)
    method = VICRegL("small_cnn", encoder_kwargs=dict(widths=(4, 6)), dim=5, mlp_hidden=7, maps_dim=4, maps_hidden=6,
                     num_matches=(4, 2)).double().eval()
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD(method.parameters(), lr=0.05)
    record = SGDRecord()
    original = vicregl_module.gather_with_grad
    if mutate:
        vicregl_module.gather_with_grad = _gather_local_grad
    try:
        for views, boxes in batches(2):
            rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
            out = model({"views": [v[rows] for v in views], "crop_boxes": boxes[rows]})
            record.step(out["loss"], method, opt)
    finally:
        vicregl_module.gather_with_grad = original
    return record.finish(method)


def reference(world: int) -> dict:
    return {"reference": train(0, 1)}


def distributed(rank: int, world: int) -> dict:
    return {"distributed": train(rank, world), "mutated": train(rank, world, mutate=True)}
