"""LRC-BERT learning checks on the generated task.

Fast (default suite): COS-NCE training makes a student layer pick out its own sentence's teacher
representation among the batch's on HELD-OUT sentences (pos_acc, 16 per batch: chance 6 %).

Slow (``-m slow``, ~10 CPU minutes per seed): the protocol of benchmarks/RESULTS.md (LRC-BERT
section, contrastive.text.lrc_check) for seeds 0, 1, 2: the teacher beats the CE-only student on
every seed; the paper's claim that the LRC-BERT student beats that CE-only student at the same
steps did NOT hold here (negative result, figures in RESULTS.md): kept as a strict xfail so a
change that makes it hold is noticed; without gradient perturbation, or with its norm scaled to
the student's width, it holds on every seed.
"""

from __future__ import annotations

import statistics

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from contrastive.data.text_tasks import generated_tokenizer, load_task  # noqa: E402
from contrastive.methods.lrc_bert import LRCBert  # noqa: E402
from contrastive.methods.text_classifier import TextClassifier  # noqa: E402
from contrastive.nn.text_encoders import build_text_encoder  # noqa: E402
from contrastive.text.loop import TextTrainConfig, train_text  # noqa: E402


def test_cosnce_aligns_student_layers_on_held_out_sentences() -> None:
    tok = generated_tokenizer()
    task = load_task("generated", n_train=640, n_dev=64)
    torch.manual_seed(0)  # a random teacher: its layers still tell sentences apart
    teacher = TextClassifier(build_text_encoder(num_layers=2, hidden_size=32, num_heads=2,
                                                vocab_size=tok.vocab_size,
                                                max_position_embeddings=64), 2)
    torch.manual_seed(1)
    student = build_text_encoder(num_layers=1, hidden_size=16, num_heads=2,
                                 vocab_size=tok.vocab_size, max_position_embeddings=64)
    method = LRCBert(teacher, student)
    held_out = tok.collate([task.dev[i] for i in range(32)])

    def pos_acc() -> float:
        method.eval()
        with torch.no_grad():
            out = method({**held_out, "stage": 1})
        method.train()
        return float(out["pos_acc"])

    before = pos_acc()
    train_text(method, task.train, tok.collate,
               TextTrainConfig(steps=40, batch_size=16, lr=1e-3, log_every=40))
    after = pos_acc()
    assert before < 30.0 and after > 80.0, (before, after)  # measured 12.5 -> 96.9


@pytest.fixture(scope="module")
def three_seeds():
    from contrastive.text.lrc_check import learning_check

    variants = ("lrc", "no_perturb", "perturb_width_scaled")
    return [learning_check(seed, variants=variants) for seed in (0, 1, 2)]


@pytest.mark.slow
def test_teacher_beats_ce_only_student(three_seeds) -> None:
    for r in three_seeds:
        assert r["teacher"] > r["ce_student"] + 5.0, r


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["no_perturb", "perturb_width_scaled"])
def test_lrc_variant_beats_ce_only_student(three_seeds, variant: str) -> None:
    """Measured: 93.4 (no perturbation), 91.7 (eps scaled to the width) vs 83.2 (means)."""
    for r in three_seeds:
        assert r[variant] > r["ce_student"], r


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="negative result at this budget: the full method (with "
                   "gradient perturbation) does not beat the CE-only student; RESULTS.md")
def test_lrc_student_beats_ce_only_student(three_seeds) -> None:
    lrc = statistics.mean(r["lrc"] for r in three_seeds)
    ce = statistics.mean(r["ce_student"] for r in three_seeds)
    assert lrc > ce, three_seeds
