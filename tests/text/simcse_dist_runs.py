"""The runs of tests/text/test_simcse_recipe.py's two-process check (not a test module; the
``two_process_runs`` fixture launches it, tests/launch_worker.py): recipes/simcse.py,
supervised with hard negatives (3 sentences per example), dropout 0 (its masks are per
process), the MLP on [CLS], no evaluator, 3 AdamW steps with the gradient clip and linear
decay, in float64. The bug the comparison must catch: SimCSE's keys (positives and hard
negatives) gathered with the gradient of the local rows only."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from gather_mutant import gather_local_grad  # noqa: E402
from launch_worker import run_recipe_main  # noqa: E402

DIST = ["--mode", "sup", "--n-train", "64", "--batch-size", "16", "--steps", "3", "--layers",
        "1", "--hidden", "16", "--heads", "2", "--intermediate-size", "32", "--vocab-size", "100",
        "--dropout", "0", "--lr", "1e-3", "--float64", "--eval", "none", "--keep-best", "",
        "--log-every", "1", "--progress", "false", "--mixed-precision", "no",
        "--num-workers", "0", "--save-every-steps", "0"]


def run(folder: Path, name: str) -> None:
    run_recipe_main("simcse", DIST, folder / name)


def mutations() -> list[tuple[object, str, object]]:
    import contrastive.methods.simcse as simcse_module

    return [(simcse_module, "gather_with_grad", gather_local_grad)]
