"""Cosine regression losses of the negative-free methods: BYOL and SimSiam (torch only).

Per-sample losses between a prediction ``p`` and a target ``z`` of the same image (other view),
with the registry's conventions (``reduction`` over samples, float32 maths under bf16, unit
normalisation clamped at ``EPS``). Nothing is detached here: the stop-gradient on the target,
which both methods need, is the caller's (``z.detach()``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .functional import (
    _check_float,
    _embed,
    _full_precision,
    _math_dtype,
    _reduce,
    _shape,
    check_reduction,
)
from .modules import BaseLoss, _pair_inputs
from .registry import register_loss

__all__ = ["BYOLLoss", "SimSiamLoss", "byol", "negative_cosine"]


def _cosine(fn: str, p: Tensor, z: Tensor, reduction: str) -> Tensor:
    check_reduction(fn, reduction)
    _check_float(fn, "p", p, 2, "(N, D)")
    _check_float(fn, "z", z, 2, "(N, D)")
    if p.shape != z.shape or p.shape[0] == 0:
        raise ValueError(f"{fn}: `p` and `z` must have the same non-empty shape (N, D); got p "
                         f"{_shape(p)} and z {_shape(z)}")
    dtype = _math_dtype(p, z)
    return (_embed(p, dtype, True) * _embed(z, dtype, True)).sum(dim=1)  # N cosines


def byol(p: Tensor, z: Tensor, *, reduction: str = "mean") -> Tensor:
    """BYOL's regression loss (Grill et al., NeurIPS 2020, arXiv 2006.07733, eq. 2):
    ``|p/|p| - z/|z||^2 = 2 - 2 cos(p, z)`` per sample, in [0, 4]. The official code
    (deepmind-research ``byol/byol_experiment.py``, ``regression_loss``) sums the two symmetric
    terms and averages over the batch: ``byol(p1, z2) + byol(p2, z1)``.

    Args: p (N, D) online predictions, z (N, D) target projections (detach them).
    Returns: a scalar, or (N,) with ``reduction="none"``.
    """
    with _full_precision(p.device):
        return _reduce(2 - 2 * _cosine("byol", p, z, reduction), reduction)


def negative_cosine(p: Tensor, z: Tensor, *, reduction: str = "mean") -> Tensor:
    """SimSiam's D(p, z) = -cos(p, z) per sample (Chen & He, CVPR 2021, arXiv 2011.10566,
    eq. 1), in [-1, 1]. The paper and the official code (facebookresearch/simsiam,
    ``main_simsiam.py``: ``-(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5``) take
    ``0.5 * (D(p1, z2) + D(p2, z1))`` with z detached.

    Args: p (N, D) predictions, z (N, D) projections of the other view (detach them).
    Returns: a scalar, or (N,) with ``reduction="none"``.
    """
    with _full_precision(p.device):
        return _reduce(-_cosine("negative_cosine", p, z, reduction), reduction)


class _CosineLoss(BaseLoss):
    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return _pair_inputs(n, dim, dtype, generator)


@register_loss("byol", "normalized_mse")
class BYOLLoss(_CosineLoss):
    """BYOL's ``2 - 2 cos(p, z)``; see :func:`byol`. ``forward(p (N, D), z (N, D))``."""

    def forward(self, p: Tensor, z: Tensor) -> Tensor:
        return byol(p, z, reduction=self.reduction)


@register_loss("simsiam", "negative_cosine")
class SimSiamLoss(_CosineLoss):
    """SimSiam's ``-cos(p, z)``; see :func:`negative_cosine`. ``forward(p (N, D), z (N, D))``."""

    def forward(self, p: Tensor, z: Tensor) -> Tensor:
        return negative_cosine(p, z, reduction=self.reduction)
