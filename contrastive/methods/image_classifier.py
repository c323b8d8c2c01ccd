"""Fine-tuning an image encoder with a classification head (``contrastive-finetune``).

:class:`ImageClassifier` is a :class:`~contrastive.methods.base.Method`: a backbone (any
``create_encoder`` model, ``num_features`` wide) and a linear head to ``num_classes`` logits,
trained with cross-entropy on the whole network. The labels come either as class ids (N,)
(cross-entropy, with label smoothing when ``smoothing`` > 0: timm's
``LabelSmoothingCrossEntropy``) or as soft targets (N, C) from mixup / cutmix (timm's
``SoftTargetCrossEntropy``), as MAE's ``main_finetune.py`` chooses its criterion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.methods._common import batch_accuracy, wide
from contrastive.methods.base import Method, read
from contrastive.methods.registry import register_method

__all__ = ["ImageClassifier", "classification_loss"]


def classification_loss(logits: Tensor, labels: Tensor, smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of (N, C) logits against (N,) class ids (smoothed by ``smoothing``) or
    (N, C) soft targets (mixup / cutmix, whose targets carry the smoothing already)."""
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    logits = wide(logits)
    if labels.dim() == 2:
        return SoftTargetCrossEntropy()(logits, labels.to(logits.dtype))
    if smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing)(logits, labels.long())
    return F.cross_entropy(logits, labels.long())


@register_method("image_classifier")
class ImageClassifier(Method):
    """An image backbone with a linear classification head, fine-tuned end to end.

    Args:
        encoder: a backbone with ``num_features`` (``create_encoder``).
        num_classes: classes of the labelled data.
        smoothing: label smoothing of hard labels (MAE / DeiT: 0.1).

    ``forward(batch)``: ``views`` (one view, (N, 3, H, W)) and ``labels`` ((N,) ids, or (N, C)
    soft targets); returns ``loss``, ``accuracy`` (hard labels) and ``logits`` (detached).
    """

    needs = ("views", "labels")
    backbones = ()  # a per-sample loss: accumulation stays plain

    def __init__(self, encoder: nn.Module, num_classes: int, *, smoothing: float = 0.0) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"ImageClassifier: num_classes must be >= 2, got {num_classes}")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"ImageClassifier: smoothing must be in [0, 1), got {smoothing}")
        self.encoder: nn.Module = encoder
        self.num_classes, self.smoothing = int(num_classes), float(smoothing)
        features: Any = encoder.num_features
        self.head: nn.Linear = nn.Linear(int(features), self.num_classes)

    def predict(self, images: Tensor) -> Tensor:
        """Logits (N, C) of a batch of images."""
        return self.head(self.encoder(images))

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = read(batch, "views", type(self).__name__)
        labels = read(batch, "labels", type(self).__name__)
        logits = self.predict(views[0])
        out = {"loss": classification_loss(logits, labels, self.smoothing),
               "logits": logits.detach()}
        if labels.dim() == 1:
            out["accuracy"] = batch_accuracy(logits, labels)
        return out
