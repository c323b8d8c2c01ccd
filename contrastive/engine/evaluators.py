"""Evaluators: the monitors' protocol, and keep-best.

An evaluator measures the live model every ``every`` epochs or optimiser steps (``per``), before
training when ``at_start``, and at the end; the loop writes its metrics into ``metrics.jsonl``
as a record of their own (``{"step", "epoch", <metrics>, "<name>_when": "start" | "epoch 3" |
"step 200" | "end"}``), which the curves picture (:mod:`contrastive.eval.plot`) draws. Each
kit has its own (:mod:`contrastive.engine.kits`):

- :class:`~contrastive.engine.kits.image.KNNEvaluator` (image runs): weighted-kNN top-1 on the
  held-out labelled split (:func:`contrastive.eval.runner.knn_on_splits`,
  ``contrastive-knn-eval``'s computation); metric ``knn_top1``.
- :class:`~contrastive.engine.kits.image_text.ZeroShotEvaluator` (image-text runs): zero-shot
  top-1 / top-5 over the held-out split's class names and image-text retrieval recall@1/5 both
  ways (:mod:`contrastive.eval.zeroshot`); metrics ``zeroshot_top1`` ... ``text_to_image_R@5``.
- :class:`~contrastive.engine.kits.sentences.STSEvaluator` (text runs): Spearman (and Pearson)
  of the cosine similarities of sentence embeddings with the gold scores of STS pairs,
  SimCSE's protocol (:mod:`contrastive.eval.sts`); metrics ``sts_spearman``, ``sts_pearson``.
  SimCSE selects its checkpoint on STS-B dev Spearman (the official ``run_sup_example.sh``:
  ``--metric_for_best_model stsb_spearman --load_best_model_at_end``): ``--keep-best
  sts_spearman``.
- :class:`~contrastive.engine.kits.labelled_text.GlueEvaluator` (labelled-text runs:
  fine-tuning, LRC-BERT): the official GLUE dev metric(s) of the task
  (:func:`contrastive.data.glue.glue_metrics`) of the method's ``predict`` on the dev set;
  metrics ``glue_accuracy``, ``glue_f1``, ``glue_mcc``, ``glue_pearson``, ``glue_spearman``
  (those the task has) and ``glue_score`` (their mean, GLUE's task score): ``--keep-best
  glue_score``.
- :class:`BestKeeper` (``--keep-best METRIC``): the best value of one metric and its step,
  checkpointed with the run (a resume keeps it); the loop writes the run's artefacts into
  ``best/`` when the value improves.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from torch import nn

__all__ = ["Evaluator", "BestKeeper"]

logger = logging.getLogger(__name__)


class Evaluator(Protocol):
    """A monitor the loop runs (module docstring)."""

    name: str  # the "<name>_when" key of its records
    every: int  # 0: only at the start (if at_start) and at the end
    per: str  # "epoch" or "step"
    at_start: bool

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]: ...



class BestKeeper:
    """The best value of ``metric`` so far (higher is better) and its step; an extra of the
    checkpoint (``checkpoint_state`` / ``load_checkpoint_state``), so a resume keeps it."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.value: float | None = None
        self.step: int | None = None

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Whether ``metrics`` holds a new best (then it is remembered)."""
        v = metrics.get(self.metric)
        if v is None or (self.value is not None and v <= self.value):
            return False
        self.value, self.step = float(v), step
        return True

    def checkpoint_state(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "step": self.step}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        if state.get("metric") == self.metric:
            self.value, self.step = state.get("value"), state.get("step")
