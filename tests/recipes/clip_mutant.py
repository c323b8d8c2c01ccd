"""recipes/clip.py with the bug the 2-process test must catch: CLIP's gather keeps only the
local rows' gradient (a gather without gradient for the other processes' rows). Run as
``accelerate launch ... tests/recipes/clip_mutant.py <recipe flags>``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: gather_mutant

from gather_mutant import run_mutant  # noqa: E402

import contrastive.methods.clip as clip_module  # noqa: E402

run_mutant(clip_module, "clip")
