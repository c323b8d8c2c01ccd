"""What both linear-probe protocols share: label checks, low-shot subsets, scoring a head."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from contrastive.eval.knn import topk_accuracy

__all__ = ["check_labels", "check_classes", "label_fraction_indices", "evaluate_head"]


def check_labels(labels: Tensor, num_classes: int | None, what: str) -> int:
    """Validate integer labels (N,) for a head with ``num_classes`` outputs; return C.

    Raises ValueError for an empty split, unlabelled data (-1) and labels >= num_classes.
    """
    if labels.numel() == 0:
        raise ValueError(f"{what}: the split is empty (0 samples); check the --data spec")
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0:
        raise ValueError(
            f"{what}: found label {lo}; a linear probe needs labelled data (-1 means unlabelled)"
        )
    if num_classes is None:
        return hi + 1
    if hi >= num_classes:
        raise ValueError(
            f"{what}: found label {hi} but the head has num_classes={num_classes} outputs "
            f"(labels must lie in [0, {num_classes})): the evaluation data has classes the "
            "training data lacks, or the head is too small"
        )
    return num_classes


def check_classes(labels: Tensor, what: str) -> int:
    """Refuse labels (N,) with fewer than two distinct classes; return the number present.

    A classifier trained on one class predicts it everywhere: top-1 is 100 % on an evaluation
    split of that class and means nothing, so the probes refuse instead of printing it.
    """
    present = int(labels.unique().numel()) if labels.numel() else 0
    if present < 2:
        raise ValueError(
            f"{what}: {present} class{'es' if present != 1 else ''} present; a linear probe or kNN "
            "needs labelled data of at least 2 classes (one subfolder per class) to mean anything"
        )
    return present


def label_fraction_indices(labels: Tensor, fraction: float, seed: int = 0) -> Tensor:
    """Indices of a class-balanced subset holding ``fraction`` of each class (at least one).

    The low-shot setting of SimCLR / BYOL (1 % and 10 % of ImageNet labels). Deterministic for a
    seed. Returns sorted int64 indices.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"label fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return torch.arange(labels.numel())
    gen = torch.Generator().manual_seed(seed)
    keep = []
    for c in labels.unique().tolist():
        members = (labels == c).nonzero().flatten()
        n = max(1, round(fraction * members.numel()))
        keep.append(members[torch.randperm(members.numel(), generator=gen)[:n]])
    return torch.cat(keep).sort().values


@torch.no_grad()
def evaluate_head(head: nn.Module, features: Tensor, labels: Tensor, batch_size: int = 8192) -> dict[str, float]:
    """Top-1 / top-5 accuracy (percent) of a classifier on cached features (N, D), labels (N,)."""
    check_labels(labels, getattr(head, "out_features", None) or _num_outputs(head), "evaluation labels")
    device = next(head.parameters()).device
    preds = []
    for start in range(0, features.shape[0], batch_size):
        logits = head(features[start : start + batch_size].to(device))
        preds.append(logits.topk(min(5, logits.shape[1]), dim=1).indices.cpu())
    return topk_accuracy(torch.cat(preds), labels)


def _num_outputs(head: nn.Module) -> int | None:
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    return linears[-1].out_features if linears else None
