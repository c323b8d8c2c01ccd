"""LRC-BERT learning checks on the generated task, through the recipes and the engine.

Fast (default suite): ``recipes/lrc_bert.py`` trains a student whose layer then picks out its
own sentence's teacher representation among the batch's on HELD-OUT sentences (pos_acc, 32 per
batch: chance 3 %), from a random teacher.

Slow (``-m slow``, ~3 CPU minutes per seed at load 3): the protocol of
benchmarks/results/lrc_bert.md (benchmarks/lrc_check.py: ``recipes/bert_finetune.py`` and
``recipes/lrc_bert.py`` in this process) for seeds 0, 1, 2. Measured through the engine
(fp32): teacher 98.3 / 99.4 / 99.6, CE-only student 78.5 / 85.1 / 79.2, LRC-BERT 82.1 / 82.1 /
79.0, without perturbation 85.2 / 90.2 / 94.0, eps scaled to the width 87.0 / 90.9 / 89.1. The
teacher beats the CE-only student on every seed; the paper's claim that the LRC-BERT student
beats that CE-only student at the same steps does NOT hold on every seed (negative result:
kept as a strict xfail so that a change that makes it hold is noticed); without gradient
perturbation, or with its norm scaled to the student's width, it holds on every seed by 5
points or more.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from contrastive.data.text_tasks import generated_tokenizer, load_task  # noqa: E402
from contrastive.eval.classifier_folder import save_classifier  # noqa: E402
from contrastive.methods.text_classifier import TextClassifier  # noqa: E402
from contrastive.nn.text_encoders import build_text_encoder  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_cosnce_aligns_student_layers_on_held_out_sentences(tmp_path: Path) -> None:
    from lrc_check import recipe, run_recipe
    from safetensors.torch import load_file

    from contrastive.engine import data_info, parse_config

    tok = generated_tokenizer()
    torch.manual_seed(0)  # a random teacher: its layers still tell sentences apart
    teacher = TextClassifier(build_text_encoder(num_layers=2, hidden_size=32, num_heads=2,
                                                vocab_size=tok.vocab_size,
                                                max_position_embeddings=64), 2)
    save_classifier(tmp_path / "teacher", teacher, tok)
    argv = ["--teacher", str(tmp_path / "teacher"), "--task", "generated", "--n-train", "640",
            "--n-dev", "64", "--layers", "1", "--hidden", "16", "--heads", "2",
            "--intermediate-size", "0", "--steps", "40", "--batch-size", "16", "--lr", "1e-3",
            "--mixed-precision", "no", "--progress", "false", "--num-workers", "0",
            "--save-every-steps", "0", "--log-every", "40"]
    run_recipe("lrc_bert", argv, tmp_path / "run")
    # the method as the recipe builds it (seeded as the engine seeds it), before and after
    cls, build_method, adapter = recipe("lrc_bert").make()
    cfg = parse_config(cls, [*argv, "--output-dir", str(tmp_path / "run")])
    adapter.prepare(cfg)
    torch.manual_seed(cfg.seed)
    method = build_method(cfg, data_info(cfg, len(adapter.task.train), kit=adapter.handoff()))
    task = load_task("generated", n_train=640, n_dev=64)
    held_out = tok.collate([task.dev[i] for i in range(32)])

    def pos_acc() -> float:
        method.eval()
        with torch.no_grad():
            out = method({**held_out, "stage": 1})
        return float(out["pos_acc"])

    before = pos_acc()
    method.load_state_dict(load_file(str(tmp_path / "run" / "checkpoints" / "step_00000040" /
                                         "model.safetensors")))
    after = pos_acc()
    print(f"pos_acc before {before:.1f}, after {after:.1f}")
    assert before < 30.0 and after > 80.0, (before, after)  # measured 0.0 -> 96.9


@pytest.fixture(scope="module")
def three_seeds():
    from lrc_check import learning_check

    variants = ("lrc", "no_perturb", "perturb_width_scaled")
    return [learning_check(seed, variants=variants) for seed in (0, 1, 2)]


@pytest.mark.slow
def test_teacher_beats_ce_only_student(three_seeds) -> None:
    for r in three_seeds:
        assert r["teacher"] > r["ce_student"] + 5.0, r


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["no_perturb", "perturb_width_scaled"])
def test_lrc_variant_beats_ce_only_student(three_seeds, variant: str) -> None:
    """Measured (means): 89.8 (no perturbation), 89.0 (eps scaled to the width) vs 80.9; the
    smallest margin on a seed 5.1 points (seed 1): 2 points asserted."""
    for r in three_seeds:
        assert r[variant] > r["ce_student"] + 2.0, r


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="negative result at this budget: the full method (with "
                   "gradient perturbation) does not beat the CE-only student on every seed (seeds "
                   "1, 2; means 81.1 vs 80.9); benchmarks/results/lrc_bert.md")
def test_lrc_student_beats_ce_only_student(three_seeds) -> None:
    for r in three_seeds:
        assert r["lrc"] > r["ce_student"], r
