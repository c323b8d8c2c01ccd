"""The LRC-BERT learning check on the generated task (tests and benchmarks/bench_lrc_bert.py).

:func:`learning_check` trains, for one seed, on the generated sentiment task:

1. a teacher (encoder + classifier, cross-entropy) of ``TEACHER`` size;
2. a student of ``STUDENT`` size with cross-entropy alone (the baseline);
3. students distilled from the teacher by LRC-BERT, one per variant: ``lrc`` (the paper's
   method), ``no_two_stage`` (1:1:3 from the first step), ``no_perturb`` and ``mse`` (MSE
   instead of COS-NCE on the intermediate layers): the paper's ablations (its Table 4), and
   ``perturb_width_scaled`` (not in the paper: eps = sqrt(32 / 312), the size the paper's eps = 1
   has relative to a 312-wide embedding, for our 32-wide student);

every student with the same optimiser steps, batch, learning rate and initial encoder weights, and
returns each model's dev accuracy. The sizes are small CPU stand-ins for the paper's 12 x 768
teacher and 4 x 312 student (3 : 1 in layers, 4 : 1 in width here).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from contrastive.data.text_tasks import generated_tokenizer, load_task
from contrastive.methods.lrc_bert import LRCBert
from contrastive.methods.text_classifier import TextClassifier, evaluate
from contrastive.nn.text_encoders import build_text_encoder
from contrastive.text.loop import TextTrainConfig, train_text

__all__ = ["STUDENT", "TEACHER", "VARIANTS", "learning_check"]

log = logging.getLogger(__name__)

TEACHER: dict[str, Any] = {"num_layers": 6, "hidden_size": 128, "num_heads": 4}
STUDENT: dict[str, Any] = {"num_layers": 2, "hidden_size": 32, "num_heads": 2}
VARIANTS: dict[str, dict[str, Any]] = {
    "lrc": {},
    "no_two_stage": {"stage_weights": ((1.0, 1.0, 3.0), (1.0, 1.0, 3.0))},
    "no_perturb": {"perturb": False},
    "mse": {"intermediate": "mse"},
    # not in the paper: eps scaled to this student's width, sqrt(32 / 312) = 0.32, so that the
    # perturbation has the size relative to the embeddings that eps = 1 has for a 312-wide one
    "perturb_width_scaled": {"perturb_scale": (32 / 312) ** 0.5},
}


def _encoder(size: dict[str, Any], vocab: int, seed: int) -> Any:
    torch.manual_seed(seed)
    return build_text_encoder(**size, vocab_size=vocab, max_position_embeddings=64)


def learning_check(seed: int = 0, *, variants: tuple[str, ...] = ("lrc",), teacher_steps: int = 600,
                   student_steps: int = 300, n_train: int = 4000, n_dev: int = 1000,
                   teacher_lr: float = 5e-4, student_lr: float = 1e-3, batch_size: int = 32,
                   teacher: dict[str, Any] | None = None, student: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """Dev accuracies (%) of the teacher, the CE-only student and each LRC-BERT variant."""
    torch.set_num_threads(1)
    tok = generated_tokenizer()
    task = load_task("generated", n_train=n_train, n_dev=n_dev, seed=seed)
    t_size, s_size = teacher or TEACHER, student or STUDENT
    result: dict[str, Any] = {"seed": seed, "seconds": {}}

    def fit(name: str, model: Any, steps: int, lr: float) -> float:
        t0 = time.perf_counter()
        cfg = TextTrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                              log_every=max(1, steps // 4))
        train_text(model, task.train, tok.collate, cfg)
        acc = 100.0 * evaluate(model, task.dev, tok, task.metric_task)["accuracy"]
        result[name] = round(acc, 2)
        result["seconds"][name] = round(time.perf_counter() - t0, 1)
        log.info("seed %d %s: dev accuracy %.2f %%", seed, name, acc)
        return acc

    t_model = TextClassifier(_encoder(t_size, tok.vocab_size, seed), task.num_labels)
    fit("teacher", t_model, teacher_steps, teacher_lr)
    fit("ce_student", TextClassifier(_encoder(s_size, tok.vocab_size, seed + 1), task.num_labels),
        student_steps, student_lr)
    for v in variants:
        method = LRCBert(t_model, _encoder(s_size, tok.vocab_size, seed + 1), **VARIANTS[v])
        fit(v, method, student_steps, student_lr)
    return result
