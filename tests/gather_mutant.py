"""The bug the recipe-level 2-process tests must catch, shared by their runs files
(tests/recipes/clip_dist_runs.py, tests/text/simcse_dist_runs.py): a method's gather keeps only
the local rows' gradient (the other processes' rows gathered without it); planted as the
method module's ``gather_with_grad``."""

from __future__ import annotations

import torch

from contrastive.nn import distributed as D


def gather_local_grad(z: torch.Tensor) -> torch.Tensor:
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])
