"""The bug the 2-process tests must catch, shared by the recipes' mutant scripts: a method's
gather keeps only the local rows' gradient (the other processes' rows gathered without it).
``run_mutant(module, recipe)`` patches ``module.gather_with_grad`` and runs ``recipes/<recipe>.py``
as ``__main__`` with the script's command line."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from types import ModuleType

import torch

from contrastive.nn import distributed as D


def gather_local_grad(z: torch.Tensor) -> torch.Tensor:
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])


def run_mutant(module: ModuleType, recipe: str) -> None:
    module.gather_with_grad = gather_local_grad  # type: ignore[attr-defined]
    path = Path(__file__).resolve().parents[1] / "recipes" / f"{recipe}.py"
    sys.argv[0] = str(path)
    runpy.run_path(str(path), run_name="__main__")
