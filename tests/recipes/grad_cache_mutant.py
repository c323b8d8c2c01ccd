"""recipes/clip.py with the bug the 2-process gradient-cache test must catch: the cached step's
gradients not averaged over the processes (DDP's hooks are off in a cached step, so the engine
averages them itself). Run as ``accelerate launch ... tests/recipes/grad_cache_mutant.py <flags>``."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import contrastive.engine.step as step_module

step_module.all_reduce_grads = lambda params, world: None  # type: ignore[assignment]
path = Path(__file__).resolve().parents[2] / "recipes" / "clip.py"
sys.argv[0] = str(path)
runpy.run_path(str(path), run_name="__main__")
