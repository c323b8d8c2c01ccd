"""GLUE scoring of a text model: its predictions on a data set and the task's official metric.

Any model with a ``predict(batch) -> logits`` is scored (a fine-tuned
:class:`~contrastive.methods.text_classifier.TextClassifier`, an LRC-BERT student), in eval mode,
with :func:`contrastive.data.glue.glue_metrics` (Wang et al. 2019: accuracy, F1, Matthews
correlation, Pearson / Spearman by task).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["evaluate", "predict_all"]


@torch.no_grad()
def predict_all(model: nn.Module, dataset: Any, tokenizer: Any, *,
                batch_size: int = 64) -> tuple[Tensor, Tensor]:
    """``model.predict`` on every item of ``dataset`` (items ``{"text_a", ["text_b"],
    "label"}``) in eval mode, in order: ``(logits (N, C) float32, labels (N,))`` on the CPU."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    preds, golds = [], []
    try:
        for start in range(0, len(dataset), batch_size):
            items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
            batch = {k: v.to(device) for k, v in tokenizer.collate(items).items()}
            preds.append(getattr(model, "predict")(batch).float().cpu())  # noqa: B009
            golds.append(batch["labels"].cpu())
    finally:
        model.train(was_training)
    return torch.cat(preds), torch.cat(golds)


def evaluate(model: nn.Module, dataset: Any, tokenizer: Any, task: str, *,
             batch_size: int = 64) -> dict[str, float]:
    """The official metric of ``task`` (a GLUE name: ``sst2``, ``mnli``, ``stsb``, ...) of
    ``model.predict`` on ``dataset`` (items ``{"text_a", ["text_b"], "label"}``), eval mode."""
    from contrastive.data.glue import glue_metrics

    preds, golds = predict_all(model, dataset, tokenizer, batch_size=batch_size)
    return glue_metrics(task, preds.numpy(), np.asarray(golds.numpy()))
