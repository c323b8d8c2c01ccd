"""recipes/simcse.py with the bug the 2-process test must catch: SimCSE's keys (positives and
hard negatives) gathered with the gradient of the local rows only (the other processes' rows
without gradient). Run as ``accelerate launch ... tests/text/simcse_mutant.py <recipe flags>``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: gather_mutant

from gather_mutant import run_mutant  # noqa: E402

import contrastive.methods.simcse as simcse_module  # noqa: E402

run_mutant(simcse_module, "simcse")
