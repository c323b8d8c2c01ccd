"""The CLIP learning check (slow): recipes/clip_shapes.py with its defaults, 3 seeds. Zero-shot
top-1 on the held-out shapes test split (class-name prompts, 10 classes, chance 10 %) must
reach 25 % for every seed and beat the random-init model (the same recipe with --steps 0) by
more than the spread of the seeds. Figures: benchmarks/RESULTS.md (CLIP on shapes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("clip_shapes", ROOT / "recipes" / "clip_shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_clip_learns_zero_shot_shapes_over_three_seeds(tmp_path):
    pytest.importorskip("transformers")
    recipe = _recipe()
    trained, random = [], []
    for seed in (0, 1, 2):
        for steps, into in (("300", trained), ("0", random)):
            args = recipe.parse_args(["--output-dir", str(tmp_path / f"s{seed}_{steps}"),
                                      "--seed", str(seed), "--steps", steps])
            into.append(recipe.run(args)["top1"])
    spread = max(trained) - min(trained)
    assert min(trained) >= 25.0, trained
    assert min(trained) - max(random) > spread, (trained, random)
