"""The image-text learning checks (slow): recipes/clip.py and recipes/siglip.py with their
defaults (shapes-captions, 300 steps at batch 128, through the engine; the same towers, data,
optimiser and budget, only the loss differs), 3 seeds each. Zero-shot top-1 on the held-out
shapes test split (class-name prompts, 10 classes, chance 10 %) must reach FLOOR for every seed
and beat the random-init model (the same run's ``--eval-at-start`` record) by more than the
spread of the seeds. Figures: MEASURED below and benchmarks/results/clip.md (CLIP, SigLIP)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from contrastive.engine import reset_accelerate_state

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

#: every seed's zero-shot top-1 % must reach this (chance is 10 %)
FLOOR = 25.0
# recipe -> (random init, trained) zero-shot top-1 % for seeds 0, 1, 2 (fp32, 1 thread, the
# AVX-512-bf16 kind); see benchmarks/results/clip.md
MEASURED = {
    "clip": ((10.0, 73.7), (9.9, 72.5), (10.7, 71.3)),  # 2026-11-26: spread 2.4
    # 2026-11-27: spread 3.9. Below CLIP at CLIP's budget: no defect found (t and b are not
    # decayed, get the weights' lr; their lr, init and the loss's scale do not change seed 0's
    # figure): benchmarks/results/clip.md, "Why SigLIP trails CLIP here"
    "siglip": ((10.0, 60.0), (9.9, 56.1), (10.7, 57.7)),
}


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}",
                                                  ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("recipe", sorted(MEASURED))
def test_learns_zero_shot_shapes_over_three_seeds(recipe, tmp_path, fresh_accelerate):
    pytest.importorskip("transformers")
    trained, random = [], []
    for seed in (0, 1, 2):
        out = tmp_path / f"s{seed}"
        reset_accelerate_state()
        _recipe(recipe).main(["--output-dir", str(out), "--seed", str(seed), "--eval-at-start",
                              "--mixed-precision", "no", "--progress", "false"])
        reset_accelerate_state()
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        top1 = {r["zeroshot_when"]: r["zeroshot_top1"] for r in recs if "zeroshot_when" in r}
        trained.append(top1["end"])
        random.append(top1["start"])
    spread = max(trained) - min(trained)
    assert min(trained) >= FLOOR, (recipe, trained)
    assert min(trained) - max(random) > spread, (recipe, trained, random)

