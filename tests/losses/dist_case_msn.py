"""Case of tests/losses/test_msn_loss.py for the one worker, tests/dist_worker.py.

Rank 0 first computes the one-process MSN loss and its gradient on the whole batch (8 images);
then each rank on its 4 images with the mean prediction and Sinkhorn-Knopp over gloo, and once
per process (distributed=False: the mutation the test must see). ``me_max``: without Sinkhorn,
so that only the mean prediction crosses the processes.
"""

from __future__ import annotations

import torch

from contrastive.losses.masked_siamese import msn, msn_targets

CONFIGS = {"sinkhorn": dict(sinkhorn_iterations=3), "me_max": dict(sinkhorn_iterations=0)}


def _loss(rows: slice, distributed: bool | None, **kw) -> dict:
    g = torch.Generator().manual_seed(0)
    scores = torch.tanh(torch.randn(8, 3, 5, generator=g, dtype=torch.float64))[rows]
    targets = msn_targets(scores[:, 0], distributed=distributed, **kw)
    scores.requires_grad_()
    loss = msn(scores[:, 1:], targets, distributed=distributed)
    loss.backward()
    return {"loss": loss.detach(), "grad": scores.grad}


def reference(world: int) -> dict:
    return {"full": {name: _loss(slice(None), None, **kw) for name, kw in CONFIGS.items()}}


def distributed(rank: int, world: int) -> dict:
    rows = slice(rank * 4, (rank + 1) * 4)
    out = {name: _loss(rows, None, **kw) for name, kw in CONFIGS.items()}
    out.update({f"{name}_local": _loss(rows, False, **kw) for name, kw in CONFIGS.items()})
    return out
