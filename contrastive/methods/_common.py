"""Small helpers shared by the methods: unit rows, cheap metrics."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["unit", "wide", "width", "queue_metrics", "in_batch_metrics"]


def width(encoder: nn.Module) -> int:
    """The encoder's output width, its int ``num_features`` (the encoder contract of
    :func:`contrastive.nn.resolve_encoder`, which checks it; checked again here because
    ``nn.Module`` attributes are untyped)."""
    n = getattr(encoder, "num_features", None)
    if not isinstance(n, int):
        raise TypeError(f"encoder {type(encoder).__name__} must have an int attribute "
                        f"`num_features` (its output width), got {n!r}")
    return n


def wide(x: Tensor) -> Tensor:
    """``x`` in float32 when it is in a narrower float type; float64 stays float64.

    The losses follow the same rule (float32 maths under bf16/fp16, float64 kept), so a method
    run in float64 computes in float64 throughout: that is how the tests compare several
    training steps with the formula written plainly, free of float32 rounding.
    """
    return x if x.dtype == torch.float64 else x.float()


def unit(x: Tensor) -> Tensor:
    """L2-normalise rows in float32 or wider (also under autocast), (N, D) -> (N, D)."""
    return F.normalize(wide(x), dim=1)



def _metrics(pos: Tensor, neg_max: Tensor, neg_sum: Tensor, neg_count: Tensor | int) -> dict:
    return {
        "pos_acc": (pos >= neg_max).float().mean() * 100.0,
        "pos_sim": pos.mean(),
        "neg_sim": neg_sum / neg_count,
    }


def _exact(fn: Callable[..., dict[str, Tensor]]) -> Callable[..., dict[str, Tensor]]:
    """Run a metric without gradient and without autocast (fp32 similarities, as the loss)."""

    @functools.wraps(fn)
    def wrapper(first: Tensor, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        with torch.no_grad(), torch.autocast(first.device.type, enabled=False):
            return fn(first, *args, **kwargs)

    return wrapper


@_exact
def queue_metrics(q: Tensor, k: Tensor, queue: Tensor) -> dict[str, Tensor]:
    """Metrics of MoCo's logits ``[q.k+, q.queue^T]`` (q, k: (N, D), queue: (K, D), unit rows).

    ``pos_acc``: % of queries whose positive is top-1 (>= every negative); ``pos_sim`` /
    ``neg_sim``: mean cosine similarity to the positive / to the negatives. On the device, no
    host sync.
    """
    pos = (wide(q) * wide(k)).sum(dim=1)
    neg = wide(q) @ wide(queue).T  # N x K
    return _metrics(pos, neg.max(dim=1).values, neg.sum(), neg.numel())


@_exact
def in_batch_metrics(
    anchors: Tensor, candidates: Tensor, pos_col: Tensor, self_col: Tensor | None = None
) -> dict[str, Tensor]:
    """The same metrics for in-batch negatives (SimCLR, MoCo v3).

    anchors (A, D), candidates (C, D) unit rows; ``candidates[pos_col[a]]`` is anchor a's
    positive, ``candidates[self_col[a]]`` the anchor itself (excluded); every other candidate
    is a negative.
    """
    sim = wide(anchors) @ wide(candidates).T  # A x C
    rows = torch.arange(sim.shape[0], device=sim.device)
    pos = sim[rows, pos_col]
    neg_mask = torch.ones_like(sim, dtype=torch.bool)
    neg_mask[rows, pos_col] = False
    if self_col is not None:
        neg_mask[rows, self_col] = False
    neg_max = sim.masked_fill(~neg_mask, float("-inf")).max(dim=1).values
    return _metrics(pos, neg_max, (sim * neg_mask).sum(), neg_mask.sum().clamp(min=1))
