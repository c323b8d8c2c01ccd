"""Batch-level decorrelation losses: Barlow Twins and VICReg (torch only).

Both are statistics of the WHOLE batch (cross-correlation, variance and covariance of each
embedding dimension over the batch), not sums of per-sample terms. So:

- ``reduction`` accepts only ``"mean"``: the paper's value for the batch. There is no
  per-sample value to return (``"none"``) or to add up (``"sum"``); both raise ``ValueError``.
- The batch must be the GLOBAL batch: gather every process's embeddings with gradient
  (:func:`contrastive.nn.distributed.gather_with_grad`) before calling, as the official code
  all-reduces the cross-correlation (Barlow Twins) or all-gathers the embeddings (VICReg).
  On a local batch the statistics, hence the loss, differ from one process with the same
  global batch.
- The maths runs in float32 (float64 when an input is float64) with autocast disabled, as the
  other losses of the registry.

Defaults follow the authors' code, cited per function.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from .functional import _check_float, _full_precision, _math_dtype, _shape, check_reduction
from .modules import BaseLoss, _pair_inputs
from .registry import register_loss

__all__ = ["BarlowTwinsLoss", "VICRegLoss", "barlow_twins", "vicreg", "vicreg_terms"]


def _check_batch_pair(fn: str, z1: Tensor, z2: Tensor, reduction: str) -> None:
    if reduction != "mean":
        raise ValueError(f"{fn}: `reduction` must be 'mean' (a batch-level loss has no "
                         f"per-sample values to return or sum), got {reduction!r}")
    _check_float(fn, "z1", z1, 2, "(N, D)")
    _check_float(fn, "z2", z2, 2, "(N, D)")
    if z1.shape != z2.shape or z1.shape[0] < 2:
        raise ValueError(f"{fn}: `z1` and `z2` must have the same shape (N, D) with N >= 2 (batch "
                         f"statistics need two samples); got z1 {_shape(z1)} and z2 {_shape(z2)}")


def _off_diagonal(c: Tensor) -> Tensor:
    """The D*(D-1) off-diagonal entries of a square (D, D) matrix."""
    d = c.shape[0]
    return c.flatten()[:-1].view(d - 1, d + 1)[:, 1:].flatten()


def barlow_twins(z1: Tensor, z2: Tensor, *, lambd: float = 0.0051, eps: float = 1e-5,
                 reduction: str = "mean") -> Tensor:
    r"""Barlow Twins (Zbontar et al., ICML 2021, arXiv 2103.03230), eq. (1).

    Each embedding dimension is standardised over the batch (mean 0, biased variance, ``eps``
    as ``BatchNorm1d(affine=False)`` in training mode, which the official code applies), then
    ``C = z1n^T z2n / N`` (D, D) and

    .. math:: L = \sum_i (1 - C_{ii})^2 + \lambda \sum_i \sum_{j \ne i} C_{ij}^2

    ``lambd``: the paper writes 5e-3, the official code (facebookresearch/barlowtwins,
    ``main.py``: ``--lambd 0.0051``) trains with 0.0051; we follow the code, which produced the
    published numbers. solo-learn's CIFAR setups add a global scale (0.1): multiply the result.

    Args:
        z1, z2: (N, D) projections of the two views of the same N images (the global batch).
    Returns:
        A scalar.
    """
    fn = "barlow_twins"
    _check_batch_pair(fn, z1, z2, reduction)
    if not lambd >= 0:
        raise ValueError(f"{fn}: `lambd` must be >= 0, got {lambd!r}")
    with _full_precision(z1.device):
        dtype = _math_dtype(z1, z2)
        a, b = z1.to(dtype), z2.to(dtype)
        n = a.shape[0]
        var_a, mean_a = torch.var_mean(a, dim=0, correction=0)
        var_b, mean_b = torch.var_mean(b, dim=0, correction=0)
        a = (a - mean_a) / torch.sqrt(var_a + eps)
        b = (b - mean_b) / torch.sqrt(var_b + eps)
        c = a.T @ b / n
        on_diag = (torch.diagonal(c) - 1).pow(2).sum()
        off_diag = _off_diagonal(c).pow(2).sum()
        return on_diag + lambd * off_diag


def vicreg(z1: Tensor, z2: Tensor, *, sim_coeff: float = 25.0, std_coeff: float = 25.0,
           cov_coeff: float = 1.0, eps: float = 1e-4, reduction: str = "mean") -> Tensor:
    r"""VICReg (Bardes, Ponce & LeCun, ICLR 2022, arXiv 2105.04906), eq. (6).

    .. math::
        L = \lambda\, \mathrm{MSE}(z_1, z_2)
          + \mu\, [v(z_1) + v(z_2)] / 2 + \nu\, [c(z_1) + c(z_2)]

    with the variance term ``v(z) = mean_j relu(1 - sqrt(Var(z_j) + eps))`` (unbiased variance
    over the batch) and the covariance term ``c(z) = sum_{i != j} Cov(z)_{ij}^2 / D``
    (``Cov = z_c^T z_c / (N - 1)``, z_c centred). The weights (lambda, mu, nu) = (25, 25, 1)
    and eps = 1e-4 are the paper's (Sec. 4.1) and the official code's (facebookresearch/vicreg,
    ``main_vicreg.py``: ``--sim-coeff 25 --std-coeff 25 --cov-coeff 1``; the code halves the sum
    of the two variance terms, as here). The MSE is the mean over N x D entries.

    Args:
        z1, z2: (N, D) expander outputs of the two views (the global batch).
    Returns:
        A scalar. :func:`vicreg_terms` gives the three unweighted terms.
    """
    inv, var, cov = vicreg_terms(z1, z2, eps=eps, reduction=reduction)
    return sim_coeff * inv + std_coeff * var + cov_coeff * cov


def vicreg_terms(z1: Tensor, z2: Tensor, *, eps: float = 1e-4,
                 reduction: str = "mean") -> tuple[Tensor, Tensor, Tensor]:
    """VICReg's unweighted invariance, variance and covariance terms (see :func:`vicreg`):
    cheap metrics for a run (the variance term rises towards 1 when the embeddings collapse)."""
    fn = "vicreg"
    _check_batch_pair(fn, z1, z2, reduction)
    with _full_precision(z1.device):
        dtype = _math_dtype(z1, z2)
        a, b = z1.to(dtype), z2.to(dtype)
        n, d = a.shape
        invariance = (a - b).pow(2).mean()
        a, b = a - a.mean(dim=0), b - b.mean(dim=0)
        va, vb = (torch.relu(1 - torch.sqrt(x.var(dim=0) + eps)).mean() for x in (a, b))
        ca, cb = (_off_diagonal(x.T @ x / (n - 1)).pow(2).sum() / d for x in (a, b))
        variance, covariance = (va + vb) / 2, ca + cb
        return invariance, variance, covariance


class _BatchLevelLoss(BaseLoss):
    """A loss of the whole batch (``reduction`` is ``"mean"`` only; see the module docstring)."""

    batch_level: ClassVar[bool] = True
    scale_invariant: ClassVar[bool] = False  # batch standardisation has an eps; VICReg has none

    def __init__(self, *, reduction: str = "mean") -> None:
        check_reduction(type(self).__name__, reduction)  # unknown names: the usual message
        if reduction != "mean":
            raise ValueError(f"{type(self).__name__}: `reduction` must be 'mean' (a batch-level "
                             f"loss has no per-sample values), got {reduction!r}")
        super().__init__(reduction=reduction)

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return _pair_inputs(n, dim, dtype, generator)


@register_loss("barlow_twins", "barlowtwins")
class BarlowTwinsLoss(_BatchLevelLoss):
    """Barlow Twins; see :func:`barlow_twins`. ``forward(z1 (N, D), z2 (N, D))`` -> scalar."""

    def __init__(self, lambd: float = 0.0051, *, eps: float = 1e-5,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        if not lambd >= 0:
            raise ValueError(f"BarlowTwinsLoss: `lambd` must be >= 0, got {lambd!r}")
        self.lambd, self.eps = float(lambd), float(eps)

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return barlow_twins(z1, z2, lambd=self.lambd, eps=self.eps)

    def extra_repr(self) -> str:
        return f"lambd={self.lambd}, eps={self.eps}"


@register_loss("vicreg")
class VICRegLoss(_BatchLevelLoss):
    """VICReg; see :func:`vicreg`. ``forward(z1 (N, D), z2 (N, D))`` -> scalar."""

    def __init__(self, sim_coeff: float = 25.0, std_coeff: float = 25.0, cov_coeff: float = 1.0,
                 *, eps: float = 1e-4, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        for name, v in (("sim_coeff", sim_coeff), ("std_coeff", std_coeff),
                        ("cov_coeff", cov_coeff)):
            if not v >= 0:
                raise ValueError(f"VICRegLoss: `{name}` must be >= 0, got {v!r}")
        self.sim_coeff, self.std_coeff = float(sim_coeff), float(std_coeff)
        self.cov_coeff, self.eps = float(cov_coeff), float(eps)

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return vicreg(z1, z2, sim_coeff=self.sim_coeff, std_coeff=self.std_coeff,
                      cov_coeff=self.cov_coeff, eps=self.eps)

    def extra_repr(self) -> str:
        return (f"sim_coeff={self.sim_coeff}, std_coeff={self.std_coeff}, "
                f"cov_coeff={self.cov_coeff}, eps={self.eps}")
