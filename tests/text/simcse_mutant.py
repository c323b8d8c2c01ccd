"""recipes/simcse.py with the bug the 2-process test must catch: SimCSE's keys (positives and
hard negatives) gathered with the gradient of the local rows only (the other processes' rows
without gradient). Run as ``accelerate launch ... tests/text/simcse_mutant.py <recipe flags>``."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

import contrastive.methods.simcse as simcse_module
from contrastive.nn import distributed as D


def _gather_local_grad(z: torch.Tensor) -> torch.Tensor:
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])


simcse_module.gather_with_grad = _gather_local_grad  # type: ignore[assignment]
recipe = Path(__file__).resolve().parents[2] / "recipes" / "simcse.py"
sys.argv[0] = str(recipe)
runpy.run_path(str(recipe), run_name="__main__")
