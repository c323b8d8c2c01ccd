"""MSN's loss and PMSN's prior-matching variant (torch only).

- MSN: Assran et al., "Masked Siamese Networks for Label-Efficient Learning", ECCV 2022 (arXiv
  2204.07141); the authors' facebookresearch/msn ``src/losses.py`` (``init_msn_loss``,
  ``distributed_sinkhorn``).
- PMSN: Assran et al., "The Hidden Uniform Cluster Prior in Self-Supervised Learning", ICLR 2023
  (arXiv 2210.07277): MSN with the mean-entropy term replaced by a divergence from a chosen
  prior over the prototypes, a power law for long-tailed data.

Both read the cosine similarities of each view with the K (unit) prototypes, sample-first:
the V anchor views' ``(B, V, K)`` and the target view's ``(B, K)`` (the EMA teacher's)::

    p_v    = softmax(anchor_scores[:, v] / tau)                  anchors, v = 1..V
    t      = softmax(target_scores / (tau * T))                  target: the code's sharpen(p, T),
                                                                 p ** (1/T) renormalised
    t      = SinkhornKnopp(t), 3 iterations (optional)           over the GLOBAL batch
    loss   = mean_b mean_v H(t_b, p_bv) + lambda * R(p_bar)      p_bar = mean of p over the
                                                                 GLOBAL batch and the anchors
    R      = sum_k p_bar_k log p_bar_k + log K = KL(p_bar || uniform)     MSN's me-max
    R      = KL(p_bar || prior), prior_k ~ k ** -exponent                   PMSN

The target (:func:`msn_targets`) is computed without gradient (the code's ``torch.no_grad``),
even from scores that carry one (the prototypes are shared with the anchors); :func:`msn` takes
it as the caller's, as every loss of the registry takes its targets. Sinkhorn-Knopp on the sharpened
probabilities is :func:`~contrastive.losses.clustering.sinkhorn_knopp` of their logarithm at
epsilon 1 (exp(log t) = t; the global maximum it subtracts cancels in the first normalisation).
The mean prediction ``p_bar`` is all-reduced over the processes with an identity backward (the
code's ``AllReduce``): with gradients averaged over the processes (DDP), two processes of B
images then train as one process of 2B. The uniform prior makes PMSN's term MSN's me-max exactly.

PMSN's direction, KL(p_bar || prior), is our choice, not a transcription: the authors released
no PMSN code (the facebookresearch/msn repository has MSN only) and the paper's text was not
readable here. It is the divergence that gives back MSN's me-max exactly under a uniform prior,
which is how the paper introduces PMSN (MSN with another prior). lightly 1.6's ``PMSNLoss``
computes the other direction, KL(prior || p_bar) (``F.kl_div(p_bar.log(), prior)``), which
under a uniform prior is ``-mean_k log p_bar_k - log K``, a log barrier rather than MSN's
entropy: the two agree at the optimum (p_bar = prior) and differ in their gradients away from it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .clustering import _world, sinkhorn_knopp
from .decorrelation import _BatchLevelLoss
from .functional import _check_float, _full_precision, _math_dtype, _shape, check_temperature
from .registry import register_loss

__all__ = ["MSNLoss", "PMSNLoss", "msn", "msn_targets", "msn_terms", "power_law_prior"]


class _GlobalMean(torch.autograd.Function):
    """The mean of the processes' ``x`` (all-reduce / world); the gradient passes unchanged
    (the code's ``AllReduce``: the processes' gradient average supplies the 1 / world)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, world: int) -> Tensor:
        out = x.detach().clone()
        dist.all_reduce(out)
        return out / world

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def power_law_prior(k: int, exponent: float = 0.25, *, dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None) -> Tensor:
    """(K,) PMSN's power-law prior: prior_i proportional to i ** -exponent, i = 1..K, summing
    to 1 (0: uniform, MSN's me-max)."""
    if k < 1 or not exponent >= 0:
        raise ValueError(f"power_law_prior: need k >= 1 and exponent >= 0, got {k}, {exponent}")
    p = torch.arange(1, k + 1, dtype=torch.float64, device=device).pow(-float(exponent))
    return (p / p.sum()).to(dtype)


def _check_temperatures(fn: str, temperature: float, sharpen_temperature: float) -> None:
    check_temperature(fn, temperature)
    if not 0 < sharpen_temperature <= 1:
        raise ValueError(f"{fn}: `sharpen_temperature` must be in (0, 1] (MSN: 0.25), got "
                         f"{sharpen_temperature!r}")


@torch.no_grad()
def msn_targets(target_scores: Tensor, *, temperature: float = 0.1,
                sharpen_temperature: float = 0.25, sinkhorn_iterations: int = 3,
                distributed: bool | None = None) -> Tensor:
    """(B, K) MSN targets of the target view's (B, K) cosines with the prototypes, without
    gradient (the code's ``torch.no_grad``; the cosines may carry one through the shared
    prototypes): the sharpened softmax(scores / (temperature * sharpen_temperature)), then
    ``sinkhorn_iterations`` of Sinkhorn-Knopp over the global batch (0: none)."""
    fn = "msn_targets"
    _check_float(fn, "target_scores", target_scores, 2, "(B, K)")
    _check_temperatures(fn, temperature, sharpen_temperature)
    if sinkhorn_iterations < 0:
        raise ValueError(f"{fn}: `sinkhorn_iterations` must be >= 0 (0: no Sinkhorn), got "
                         f"{sinkhorn_iterations!r}")
    with _full_precision(target_scores.device):
        s = target_scores.to(_math_dtype(target_scores))
        log_t = F.log_softmax(s / (temperature * sharpen_temperature), dim=1)
        if sinkhorn_iterations:
            return sinkhorn_knopp(log_t, epsilon=1.0, iterations=sinkhorn_iterations,
                                  distributed=distributed).to(log_t.dtype)
        return log_t.exp()


def msn_terms(anchor_scores: Tensor, targets: Tensor, *, temperature: float = 0.1,
              prior: Tensor | None = None,
              distributed: bool | None = None) -> tuple[Tensor, Tensor]:
    """MSN's two terms (see the module docstring): the cross-entropy of the anchors'
    predictions with the targets, and R(p_bar) (prior None: me-max, else KL(p_bar || prior)).

    Args:
        anchor_scores: (B, V, K) cosines of the V anchor views with the K prototypes.
        targets: (B, K) target probabilities, the caller's without gradient
            (:func:`msn_targets`), each image's shared by its V anchors.
        prior: (K,) probabilities (PMSN: :func:`power_law_prior`); None: uniform.
    Returns:
        Two float32 (float64 with a float64 input) scalars.
    """
    fn = "msn"
    _check_float(fn, "anchor_scores", anchor_scores, 3, "(B, V, K)")
    _check_float(fn, "targets", targets, 2, "(B, K)")
    b, v, k = anchor_scores.shape
    if b == 0 or v == 0 or k == 0 or tuple(targets.shape) != (b, k):
        raise ValueError(f"{fn}: `anchor_scores` must be non-empty (B, V, K) and `targets` "
                         f"(B, K); got {_shape(anchor_scores)}, {_shape(targets)}")
    check_temperature(fn, temperature)
    if prior is not None and tuple(prior.shape) != (k,):
        raise ValueError(f"{fn}: `prior` must be (K,) = ({k},) probabilities, got "
                         f"{_shape(prior)}")
    with _full_precision(anchor_scores.device):
        dtype = _math_dtype(anchor_scores, targets)
        log_p = F.log_softmax(anchor_scores.to(dtype) / temperature, dim=2)  # B x V x K
        ce = -(targets.to(dtype).unsqueeze(1) * log_p).sum(2).mean()
        mean_p = log_p.exp().mean(dim=(0, 1))  # (K,) this process's mean prediction
        world = _world(distributed)
        if world > 1:
            mean_p = _GlobalMean.apply(mean_p, world)
        log_prior = (torch.full_like(mean_p, -math.log(k)) if prior is None
                     else prior.to(mean_p).log())
        reg = (torch.xlogy(mean_p, mean_p) - mean_p * log_prior).sum()
    return ce, reg


def msn(anchor_scores: Tensor, targets: Tensor, *, temperature: float = 0.1,
        regularization_weight: float = 1.0, prior: Tensor | None = None,
        distributed: bool | None = None, reduction: str = "mean") -> Tensor:
    """MSN's loss, ``ce + regularization_weight * R`` (:func:`msn_terms`, the module
    docstring); PMSN with a ``prior``. Defaults: the code's ``configs/pretrain/msn_vits16.yaml``
    (temperature 0.1, me-max weight 1; :func:`msn_targets`: sharpen 0.25, Sinkhorn on).

    A statistic of the whole batch (the mean prediction): ``reduction="mean"`` only.

    Examples:
        >>> import torch, torch.nn.functional as F
        >>> from contrastive.losses.masked_siamese import msn, msn_targets
        >>> prototypes = F.normalize(torch.randn(32, 16), dim=1)
        >>> target = F.normalize(torch.randn(8, 16), dim=1)        # the teacher's view
        >>> anchors = F.normalize(torch.randn(8, 2, 16), dim=2)    # 2 masked / focal views
        >>> loss = msn(anchors @ prototypes.T, msn_targets(target @ prototypes.T))
    """
    if reduction != "mean":
        raise ValueError(f"msn: `reduction` must be 'mean' (a batch-level loss has no "
                         f"per-sample values to return or sum), got {reduction!r}")
    if not regularization_weight >= 0:
        raise ValueError(f"msn: `regularization_weight` must be >= 0 (MSN: 1), got "
                         f"{regularization_weight!r}")
    ce, reg = msn_terms(anchor_scores, targets, temperature=temperature, prior=prior,
                        distributed=distributed)
    return ce + regularization_weight * reg


@register_loss("msn")
class MSNLoss(_BatchLevelLoss):
    """MSN; see :func:`msn`. ``forward(anchor_scores (B, V, K), targets (B, K))``; the targets
    from :meth:`targets` (the target view's cosines, sharpened and balanced, no gradient).

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> loss_fn = get_loss("msn")
        >>> g = torch.Generator().manual_seed(0)
        >>> targets = loss_fn.targets(torch.randn(4, 8, generator=g).tanh())  # the target view's cosines
        >>> targets.sum(dim=1)  # sharpened, balanced distributions over the 8 prototypes
        tensor([1., 1., 1., 1.])
        >>> anchor_scores = torch.randn(4, 2, 8, generator=g).tanh()  # (B, V, K): 2 masked anchor views
        >>> loss = loss_fn(anchor_scores, targets)
        >>> loss.shape, bool(loss.isfinite())
        (torch.Size([]), True)
    """

    def __init__(self, temperature: float = 0.1, *, sharpen_temperature: float = 0.25,
                 sinkhorn_iterations: int = 3, regularization_weight: float = 1.0,
                 distributed: bool | None = None, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        _check_temperatures(type(self).__name__, temperature, sharpen_temperature)
        self.temperature, self.sharpen_temperature = float(temperature), float(sharpen_temperature)
        self.sinkhorn_iterations = int(sinkhorn_iterations)
        self.regularization_weight, self.distributed = float(regularization_weight), distributed

    def prior(self, k: int, like: Tensor) -> Tensor | None:
        """The prior over ``k`` prototypes; None: uniform (me-max)."""
        return None

    def targets(self, target_scores: Tensor) -> Tensor:
        """:func:`msn_targets` with this loss's options."""
        return msn_targets(target_scores, temperature=self.temperature,
                           sharpen_temperature=self.sharpen_temperature,
                           sinkhorn_iterations=self.sinkhorn_iterations,
                           distributed=self.distributed)

    def forward(self, anchor_scores: Tensor, targets: Tensor) -> Tensor:
        return msn(anchor_scores, targets, temperature=self.temperature,
                   regularization_weight=self.regularization_weight,
                   prior=self.prior(anchor_scores.shape[-1], anchor_scores),
                   distributed=self.distributed)

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """(n, 2, dim) cosines in [-1, 1] of 2 anchor views with dim prototypes, (n, dim)
        target probabilities."""
        scores = torch.tanh(cls._randn(n, 2, dim, dtype=torch.float64, generator=generator))
        targets = torch.softmax(3 * cls._randn(n, dim, dtype=torch.float64,
                                               generator=generator), dim=1)
        return scores.to(dtype), targets.to(dtype)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, sharpen_temperature="
                f"{self.sharpen_temperature}, sinkhorn_iterations={self.sinkhorn_iterations}, "
                f"regularization_weight={self.regularization_weight}")


@register_loss("pmsn")
class PMSNLoss(MSNLoss):
    """PMSN: :func:`msn` with :func:`power_law_prior` (``power_law_exponent``, 0.25: lightly's
    ``PMSNLoss`` default; the paper's value for long-tailed data is not read here).

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> g = torch.Generator().manual_seed(0)
        >>> anchor_scores, targets = get_loss("pmsn").example_inputs(n=4, dim=8, generator=g)
        >>> loss = get_loss("pmsn")(anchor_scores, targets)  # MSN with a power-law prior
        >>> loss.shape, bool(loss.isfinite())
        (torch.Size([]), True)
    """

    def __init__(self, temperature: float = 0.1, *, power_law_exponent: float = 0.25,
                 sharpen_temperature: float = 0.25, sinkhorn_iterations: int = 3,
                 regularization_weight: float = 1.0, distributed: bool | None = None,
                 reduction: str = "mean") -> None:
        super().__init__(temperature, sharpen_temperature=sharpen_temperature,
                         sinkhorn_iterations=sinkhorn_iterations,
                         regularization_weight=regularization_weight, distributed=distributed,
                         reduction=reduction)
        power_law_prior(1, power_law_exponent)  # checks the exponent
        self.power_law_exponent = float(power_law_exponent)

    def prior(self, k: int, like: Tensor) -> Tensor | None:
        return power_law_prior(k, self.power_law_exponent, dtype=_math_dtype(like),
                               device=like.device)
