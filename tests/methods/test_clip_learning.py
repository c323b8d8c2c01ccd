"""The CLIP learning check (slow): recipes/clip.py with its defaults (shapes-captions, 300 steps
at batch 128, through the engine), 3 seeds. Zero-shot top-1 on the held-out shapes test split
(class-name prompts, 10 classes, chance 10 %) must reach 25 % for every seed and beat the
random-init model (the same run's ``--eval-at-start`` record) by more than the spread of the
seeds. Figures: benchmarks/results/clip.md."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("recipe_clip", ROOT / "recipes" / "clip.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_clip_learns_zero_shot_shapes_over_three_seeds(tmp_path, fresh_accelerate):
    pytest.importorskip("transformers")
    trained, random = [], []
    for seed in (0, 1, 2):
        out = tmp_path / f"s{seed}"
        _reset()
        _recipe().main(["--output-dir", str(out), "--seed", str(seed), "--eval-at-start",
                        "--mixed-precision", "no", "--progress", "false"])
        _reset()
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        top1 = {r["zeroshot_when"]: r["zeroshot_top1"] for r in recs if "zeroshot_when" in r}
        trained.append(top1["end"])
        random.append(top1["start"])
    spread = max(trained) - min(trained)
    assert min(trained) >= 25.0, trained
    assert min(trained) - max(random) > spread, (trained, random)


def _reset() -> None:
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
