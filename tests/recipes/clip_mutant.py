"""recipes/clip.py with the bug the 2-process test must catch: CLIP's gather keeps only the
local rows' gradient (a gather without gradient for the other processes' rows). Run as
``accelerate launch ... tests/recipes/clip_mutant.py <recipe flags>``."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

import contrastive.methods.clip as clip_module
from contrastive.nn import distributed as D


def _gather_local_grad(z: torch.Tensor) -> torch.Tensor:
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])


clip_module.gather_with_grad = _gather_local_grad  # type: ignore[assignment]
recipe = Path(__file__).resolve().parents[2] / "recipes" / "clip.py"
sys.argv[0] = str(recipe)
runpy.run_path(str(recipe), run_name="__main__")
