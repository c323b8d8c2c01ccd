"""Fine-tuning an encoder on a sentence (pair) task: the LRC-BERT teacher, and the CE-only baseline.

:class:`TextClassifier` is a :class:`~contrastive.methods.base.Method`: a :class:`TextEncoder`
plus a prediction layer (dropout, then a linear map of the pooled output to ``num_labels``
logits, or to one score for a regression task such as STS-B), trained with cross-entropy
(MSE for regression), as BERT is fine-tuned on GLUE (Devlin et al. 2019, section 4.1).

Evaluation's modules save and load a fine-tuned classifier as a folder that loads without
running code (:mod:`contrastive.eval.classifier_folder`) and score any model with a
``predict(batch) -> logits`` on GLUE (:mod:`contrastive.eval.glue`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.methods._common import batch_accuracy, wide
from contrastive.methods.base import Method, read
from contrastive.methods.registry import register_method
from contrastive.nn.text_encoders import TextEncoder

__all__ = [
    "TEXT_KEYS",
    "TextClassifier",
    "as_classifier",
    "task_loss",
]

TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels")
"""The batch a text method reads (what :meth:`TextTokenizer.collate` produces)."""


def task_loss(logits: Tensor, labels: Tensor, regression: bool) -> Tensor:
    """Cross-entropy of (N, C) logits against (N,) class ids, or MSE of (N, 1) scores."""
    if regression:
        return F.mse_loss(wide(logits).squeeze(-1), labels.to(wide(logits).dtype))
    return F.cross_entropy(wide(logits), labels.long())


def encoder_inputs(batch: Mapping[str, Any], method: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """``input_ids`` (B, T), ``attention_mask`` (B, T) and ``token_type_ids`` (or None); a
    batch of one-sentence examples as the sentences kit gives it, (B, 1, T), is read as (B, T)."""
    ids = read(batch, "input_ids", method)
    if isinstance(ids, Tensor) and ids.dim() == 3 and ids.shape[1] == 1:
        batch = {k: v.squeeze(1) if isinstance(v, Tensor) and v.dim() == 3 else v
                 for k, v in batch.items()}
        ids = batch["input_ids"]
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        raise ValueError(f"{method}: batch['input_ids'] must be a (batch, tokens) tensor of token "
                         f"ids (TextTokenizer.collate makes it), got {getattr(ids, 'shape', ids)}")
    mask = batch.get("attention_mask")
    return ids, torch.ones_like(ids) if mask is None else mask, batch.get("token_type_ids")


@register_method("text_classifier")
class TextClassifier(Method):
    """A text encoder with a prediction layer, trained on labels (the teacher / CE baseline).

    Args:
        encoder: a :class:`~contrastive.nn.text_encoders.TextEncoder`.
        num_labels: classes, or 1 with ``regression=True``.
        regression: MSE on a score (STS-B) instead of cross-entropy.
        dropout: on the pooled output before the linear layer (BERT: 0.1).

    ``forward(batch)``: ``input_ids``, ``attention_mask``, ``token_type_ids`` (optional) and
    ``labels``; returns ``loss``, ``accuracy`` (classification) and ``logits`` (detached).
    """

    needs = TEXT_KEYS
    backbones = ()  # no --grad-cache-chunk: accumulation stays plain (a per-sample loss)

    def __init__(self, encoder: TextEncoder, num_labels: int, *, regression: bool = False,
                 dropout: float = 0.1) -> None:
        super().__init__()
        if num_labels < 1 or (regression and num_labels != 1):
            raise ValueError(f"TextClassifier: num_labels must be >= 1 (1 for regression), got "
                             f"{num_labels}")
        self.encoder: TextEncoder = encoder
        self.num_labels, self.regression = int(num_labels), bool(regression)
        self.dropout: nn.Module = nn.Dropout(dropout)
        self.head: nn.Linear = nn.Linear(encoder.num_features, num_labels)

    def predict(self, batch: Mapping[str, Any]) -> Tensor:
        """Logits (B, C), or scores (B, 1) for regression."""
        ids, mask, types = encoder_inputs(batch, type(self).__name__)
        return self.head(self.dropout(self.encoder.encode(ids, mask, types).pooled))

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        logits = self.predict(batch)
        labels = read(batch, "labels", type(self).__name__)
        out = {"loss": task_loss(logits, labels, self.regression), "logits": logits.detach()}
        if not self.regression:
            out["accuracy"] = batch_accuracy(logits, labels)
        return out


def as_classifier(method: nn.Module) -> TextClassifier:
    """``method`` as a :class:`TextClassifier` (what :func:`save_classifier` writes): itself, or
    a distilled student (LRC-BERT: ``encoder``, its prediction layer ``head`` and the
    ``teacher`` whose task it learnt) sharing the student's modules, without dropout. Draws no
    random numbers (a run that saves its best model mid-training continues unchanged)."""
    if isinstance(method, TextClassifier):
        return method
    encoder, head = getattr(method, "encoder", None), getattr(method, "head", None)
    teacher = getattr(method, "teacher", None)
    if not (isinstance(encoder, TextEncoder) and isinstance(head, nn.Linear)
            and isinstance(teacher, TextClassifier)):
        raise TypeError(f"as_classifier: {type(method).__name__} is neither a TextClassifier nor "
                        "a distilled student (encoder, head and teacher)")
    with torch.random.fork_rng(devices=[]):
        model = TextClassifier(encoder, head.out_features, regression=teacher.regression,
                               dropout=0.0)
    model.head = head
    return model
