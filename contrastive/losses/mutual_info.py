"""Deep InfoMax's local-global mutual-information losses (torch only).

Hjelm et al., "Learning deep representations by mutual information estimation and
maximization", ICLR 2019 (arXiv 1808.06670), Sec. 3.2 (local MI) and 3.1 (estimators); the
authors' code is rdevon/DIM (``cortex_DIM/functions/dim_losses.py``: ``infonce_loss`` and
``fenchel_dual_loss``).

The scores are dot products ``T(g_i, l_j,p) = g_i . l_j,p`` of an image's global feature
``g_i`` (N, D) with the local features ``l_j,p`` (N, D, P) of every image j at every location
p, both after the method's own small encoders (the paper's 1x1-conv "network-in-network"
score function). For image i and location p the pair (g_i, l_i,p) is drawn from the joint;
(g_i, l_j,p') with j != i (every location p') from the product of marginals.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import _check_float, _full_precision, _math_dtype, _reduce, _shape, check_reduction
from .modules import BaseLoss
from .registry import register_loss

__all__ = ["DIMLoss", "dim_local_global"]

_ESTIMATORS = ("infonce", "jsd")


def dim_local_global(global_feat: Tensor, local_feat: Tensor, *, estimator: str = "infonce",
                     reduction: str = "mean") -> Tensor:
    """Local-global MI loss of Deep InfoMax, per image (the mean over its locations).

    - ``"infonce"`` (the paper's best local-DIM results): for image i and location p,
      ``-log softmax`` of the positive score among {the positive, every (g_i, l_j,p') with
      j != i}. The authors' code keeps the masked same-image pairs in the softmax at a score of
      -10; we exclude them exactly (the estimator as written in the paper, eq. 5).
    - ``"jsd"`` (eq. 4, the Jensen-Shannon estimator): ``softplus(-T_pos)`` averaged over the
      positives plus ``softplus(T_neg)`` averaged over the negatives, minus ``2 log 2`` (so the
      value equals the authors' ``E_neg - E_pos``; 0 means no information).

    Args:
        global_feat: (N, D); local_feat: (N, D, P) or (N, D, H, W) (flattened to P = H W).
    Returns:
        A scalar, or (N,) with ``reduction="none"``.
    """
    fn = "dim_local_global"
    check_reduction(fn, reduction)
    if estimator not in _ESTIMATORS:
        raise ValueError(f"{fn}: `estimator` must be one of {_ESTIMATORS}, got {estimator!r}")
    _check_float(fn, "global_feat", global_feat, 2, "(N, D)")
    if not isinstance(local_feat, Tensor) or local_feat.dim() not in (3, 4):
        raise ValueError(f"{fn}: `local_feat` must have shape (N, D, P) or (N, D, H, W), got "
                         f"{_shape(local_feat)}")
    _check_float(fn, "local_feat", local_feat, local_feat.dim(), "(N, D, P) or (N, D, H, W)")
    n, d = global_feat.shape
    if local_feat.shape[:2] != (n, d) or n < 2:
        raise ValueError(f"{fn}: `local_feat` must start with the (N, D) of `global_feat` and "
                         f"N >= 2 (negatives come from other images); got global "
                         f"{_shape(global_feat)}, local {_shape(local_feat)}")
    with _full_precision(global_feat.device):
        dtype = _math_dtype(global_feat, local_feat)
        g = global_feat.to(dtype)
        local = local_feat.to(dtype).flatten(2)  # N x D x P
        p = local.shape[2]
        scores = torch.einsum("id,jdp->ijp", g, local)  # N x N x P: T(g_i, l_j,p)
        eye = torch.eye(n, dtype=torch.bool, device=g.device)
        pos = scores[eye]  # N x P
        neg = scores[~eye].view(n, (n - 1) * p)  # per image i: every other image's locations
        if estimator == "infonce":
            neg_lse = torch.logsumexp(neg, dim=1, keepdim=True)  # N x 1, shared by i's locations
            loss = (torch.logaddexp(pos, neg_lse) - pos).mean(dim=1)
        else:
            loss = F.softplus(-pos).mean(dim=1) + F.softplus(neg).mean(dim=1) - 2 * math.log(2)
    return _reduce(loss, reduction)


@register_loss("dim", "deep_infomax")
class DIMLoss(BaseLoss):
    """Deep InfoMax local-global loss; see :func:`dim_local_global`.
    ``forward(global_feat (N, D), local_feat (N, D, P) or (N, D, H, W))``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> global_feat = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))  # (N, D)
        >>> local_feat = global_feat[:, :, None].expand(4, 8, 9)  # (N, D, P): 9 locations agreeing
        >>> matched = get_loss("dim")(global_feat, local_feat)
        >>> shuffled = get_loss("dim")(global_feat, local_feat.roll(1, dims=0))  # other images' locations
        >>> bool(matched < shuffled)
        True
    """

    scale_invariant: ClassVar[bool] = False

    def __init__(self, estimator: str = "infonce", *, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        if estimator not in _ESTIMATORS:
            raise ValueError(f"DIMLoss: `estimator` must be one of {_ESTIMATORS}, got "
                             f"{estimator!r}")
        self.estimator = estimator

    def forward(self, global_feat: Tensor, local_feat: Tensor) -> Tensor:
        return dim_local_global(global_feat, local_feat, estimator=self.estimator,
                                reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"estimator={self.estimator!r}, reduction={self.reduction!r}"

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        g = cls._randn(n, dim, dtype=dtype, generator=generator)
        local = cls._randn(n, dim, 3, 3, dtype=dtype, generator=generator)
        return g, local
