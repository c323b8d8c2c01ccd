"""Regression losses of the negative-free methods: BYOL's and SimSiam's cosine ones, I-JEPA's
feature regression (torch only).

Per-sample losses between a prediction ``p`` and a target ``z`` of the same image (other view,
or for I-JEPA the target encoder's features of the predicted patches), with the registry's
conventions (``reduction`` over samples, float32 maths under bf16, unit normalisation clamped
at ``EPS``). Nothing is detached here: the stop-gradient on the target, which all three methods
need, is the caller's (``z.detach()``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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

__all__ = ["IJEPALoss", "BYOLLoss", "SimSiamLoss", "byol", "ijepa", "negative_cosine"]

#: I-JEPA's per-element distance: the authors' code's smooth l1, or the paper's squared l2
IJEPA_DISTANCES = ("smooth_l1", "l2")


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
    """BYOL's ``2 - 2 cos(p, z)``; see :func:`byol`. ``forward(p (N, D), z (N, D))``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> p = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
        >>> z = torch.tensor([[0.0, 3.0], [2.0, 2.0]])  # orthogonal, then parallel: 2 - 2 cos = 2, 0
        >>> get_loss("byol", reduction="none")(p, z).round(decimals=4)
        tensor([2., 0.])
    """

    def forward(self, p: Tensor, z: Tensor) -> Tensor:
        return byol(p, z, reduction=self.reduction)


@register_loss("simsiam", "negative_cosine")
class SimSiamLoss(_CosineLoss):
    """SimSiam's ``-cos(p, z)``; see :func:`negative_cosine`. ``forward(p (N, D), z (N, D))``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> p = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
        >>> z = torch.tensor([[-2.0, 0.0], [2.0, 2.0]])  # opposite, then parallel: -cos = 1, -1
        >>> get_loss("simsiam", reduction="none")(p, z)
        tensor([ 1.0000, -1.0000])
    """

    def forward(self, p: Tensor, z: Tensor) -> Tensor:
        return negative_cosine(p, z, reduction=self.reduction)


def ijepa(p: Tensor, z: Tensor, *, distance: str = "smooth_l1", beta: float = 1.0,
          reduction: str = "mean") -> Tensor:
    """I-JEPA's loss between predicted and target patch features (Assran et al., CVPR 2023,
    arXiv 2301.08243, sec. 3, eq. 1: the average squared l2 distance over the M target blocks'
    patches; the authors' facebookresearch/ijepa ``src/train.py`` line 311 takes
    ``F.smooth_l1_loss(z, h)`` instead, beta 1, the mean over every element)::

        loss_i = mean over patches k and channels d of smooth_l1_beta(p[i, k, d] - z[i, k, d])

    ``smooth_l1_beta(e) = e^2 / (2 beta)`` where ``|e| < beta``, else ``|e| - beta / 2``;
    ``distance="l2"``: ``e^2``. The mean over samples equals the code's mean over all elements
    (every sample has the same number of patches). The target is the layer-normed target
    encoder output (the caller's, detached).

    Args: p (N, K, D) predictions, z (N, K, D) targets (N: images x target blocks).
    Returns: a scalar, or (N,) with ``reduction="none"``.

    Examples:
        >>> p, z = torch.randn(2, 8, 6, 16, generator=torch.Generator().manual_seed(0))
        >>> torch.isclose(ijepa(p, z), F.smooth_l1_loss(p, z))  # the code's mean of all elements
        tensor(True)
    """
    fn = "ijepa"
    check_reduction(fn, reduction)
    if distance not in IJEPA_DISTANCES:
        raise ValueError(f"{fn}: distance must be one of {IJEPA_DISTANCES}, got {distance!r}")
    if not beta > 0:
        raise ValueError(f"{fn}: beta must be > 0 (the code's smooth_l1 default: 1.0), got {beta}")
    _check_float(fn, "p", p, 3, "(N, K, D)")
    _check_float(fn, "z", z, 3, "(N, K, D)")
    if p.shape != z.shape or p.numel() == 0:
        raise ValueError(f"{fn}: `p` and `z` must have the same non-empty shape (N, K, D); got p "
                         f"{_shape(p)} and z {_shape(z)}")
    with _full_precision(p.device):
        dtype = _math_dtype(p, z)
        a, b = p.to(dtype), z.to(dtype)
        error = (F.smooth_l1_loss(a, b, reduction="none", beta=beta) if distance == "smooth_l1"
                 else (a - b).pow(2))
        return _reduce(error.mean(dim=(1, 2)), reduction)


@register_loss("ijepa")
class IJEPALoss(BaseLoss):
    """I-JEPA's feature regression; see :func:`ijepa`. ``forward(p (N, K, D), z (N, K, D))``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> z = torch.zeros(2, 3, 4)  # (N, K, D): the targets of K patches
        >>> get_loss("ijepa")(z + 0.5, z)  # smooth L1, beta 1: 0.5 * 0.5^2 per element
        tensor(0.1250)
        >>> get_loss("ijepa", distance="l2")(z + 0.5, z).item()
        0.25
    """

    scale_invariant = False

    def __init__(self, *, distance: str = "smooth_l1", beta: float = 1.0,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        if distance not in IJEPA_DISTANCES or not beta > 0:
            raise ValueError(f"IJEPALoss: distance must be one of {IJEPA_DISTANCES} and beta > 0, "
                             f"got {distance!r}, {beta}")
        self.distance, self.beta = distance, float(beta)

    def forward(self, p: Tensor, z: Tensor) -> Tensor:
        return ijepa(p, z, distance=self.distance, beta=self.beta, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"distance={self.distance!r}, beta={self.beta}, reduction={self.reduction!r}"

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """p and z (n, 3, dim)."""
        return (cls._randn(n, 3, dim, dtype=dtype, generator=generator),
                cls._randn(n, 3, dim, dtype=dtype, generator=generator))
