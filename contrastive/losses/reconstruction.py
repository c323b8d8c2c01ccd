"""Masked reconstruction: MAE's and SimMIM's losses on the pixels of the masked patches (torch
only).

He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022 (arXiv 2111.06377),
sec. 3 ("Reconstruction target": mean squared error on the masked patches only; per-patch
normalised pixels as the better target, Table 1c) and the authors' facebookresearch/mae
``models_mae.py``, ``forward_loss``::

    target = (target - mean_patch) / sqrt(var_patch + 1e-6)     # norm_pix_loss; var unbiased
    loss = sum over masked patches of mean_pixels (pred - target)^2 / number of masked patches

Per sample: that sum and count over the sample's own masked patches. ``reduction="mean"``
averages the samples, which equals the code's global ratio when every sample has the same
number of masked patches (MAE's random masking: always).

SimMIM (Xie et al., "SimMIM: A Simple Framework for Masked Image Modeling", CVPR 2022, sec. 3,
"prediction targets": an l1 loss on the masked pixels; the authors' microsoft/SimMIM
``models/simmim.py``, ``SimMIM.forward``) is the same reduction with the absolute error and raw (dataset-normalised)
pixels as the target::

    loss = sum over masked pixels and channels |x - x_rec| / (masked pixels + 1e-5) / channels

which is the mean over masked patches of mean_pixels |pred - target| (a masked patch holds
p^2 pixels); the code's 1e-5 only guards an empty mask (here: ``clamp_min(1)`` of the count).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .functional import _check_float, _full_precision, _math_dtype, _reduce, _shape, check_reduction
from .modules import BaseLoss
from .registry import register_loss

__all__ = ["DISTANCES", "MAELoss", "SimMIMLoss", "masked_reconstruction"]

#: the per-pixel error: squared (MAE) or absolute (SimMIM)
DISTANCES = ("l2", "l1")


def masked_reconstruction(pred: Tensor, target: Tensor, mask: Tensor, *, norm_pix: bool = True,
                          eps: float = 1e-6, distance: str = "l2",
                          reduction: str = "mean") -> Tensor:
    """MAE's (``distance="l2"``) or SimMIM's (``"l1"``, ``norm_pix=False``) reconstruction loss
    (see the module docstring).

    Args:
        pred: (N, L, P) predicted patches (P = patch_size^2 x channels).
        target: (N, L, P) the image's patches (:func:`contrastive.nn.masking.patchify`).
        mask: (N, L) bool (or 0/1), True where the loss is taken (MAE: the removed patches).
        norm_pix: normalise each target patch by its mean and unbiased std (MAE's
            ``--norm_pix_loss``, used for its reported results).
        eps: added to the variance (the code's 1e-6).
        distance: ``"l2"`` squared error (MAE) or ``"l1"`` absolute error (SimMIM).
    Returns: a scalar, or (N,) with ``reduction="none"`` (0 for a sample with an empty mask).
    """
    fn = "masked_reconstruction"
    check_reduction(fn, reduction)
    if distance not in DISTANCES:
        raise ValueError(f"{fn}: distance must be one of {DISTANCES}, got {distance!r}")
    _check_float(fn, "pred", pred, 3, "(N, L, P)")
    _check_float(fn, "target", target, 3, "(N, L, P)")
    if pred.shape != target.shape or mask.shape != pred.shape[:2]:
        raise ValueError(f"{fn}: pred and target must be (N, L, P) and mask (N, L); got pred "
                         f"{_shape(pred)}, target {_shape(target)}, mask {_shape(mask)}")
    if norm_pix and target.shape[-1] < 2:
        raise ValueError(f"{fn}: norm_pix needs patches of >= 2 values, got {target.shape[-1]}")
    with _full_precision(pred.device):
        dtype = _math_dtype(pred, target)
        t = target.to(dtype)
        if norm_pix:
            t = (t - t.mean(dim=-1, keepdim=True)) / (t.var(dim=-1, keepdim=True) + eps).sqrt()
        error = pred.to(dtype) - t
        per_patch = (error.pow(2) if distance == "l2" else error.abs()).mean(dim=-1)  # N x L
        weight = mask.to(dtype)
        per_sample = (per_patch * weight).sum(1) / weight.sum(1).clamp_min(1)
        return _reduce(per_sample, reduction)


@register_loss("mae", "masked_reconstruction")
class MAELoss(BaseLoss):
    """MAE's loss; see :func:`masked_reconstruction`. ``forward(pred, target, mask)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> target = torch.zeros(1, 3, 4)  # (N, L patches, P pixels per patch)
        >>> pred = target + 1
        >>> mask = torch.tensor([[True, False, True]])  # the patches the encoder did not see
        >>> get_loss("mae", norm_pix=False)(pred, target, mask)  # squared error 1 on the masked patches
        tensor(1.)
        >>> get_loss("mae", norm_pix=False)(pred, target, torch.zeros_like(mask))  # none masked: 0
        tensor(0.)
    """

    scale_invariant = False
    distance = "l2"

    def __init__(self, *, norm_pix: bool = True, eps: float = 1e-6,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        if not eps > 0:
            raise ValueError(f"{type(self).__name__}: eps must be > 0, got {eps}")
        self.norm_pix, self.eps = norm_pix, float(eps)

    def forward(self, pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
        return masked_reconstruction(pred, target, mask, norm_pix=self.norm_pix, eps=self.eps,
                                     distance=self.distance, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"norm_pix={self.norm_pix}, eps={self.eps}, reduction={self.reduction!r}"

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """pred and target (n, 4, dim), mask (n, 4) with 3 patches masked per sample."""
        target = cls._randn(n, 4, dim, dtype=dtype, generator=generator)
        pred = cls._randn(n, 4, dim, dtype=dtype, generator=generator)
        noise = torch.rand(n, 4, generator=generator)
        mask = noise.argsort(1).argsort(1) >= 1  # the smallest of each row is kept
        return pred, target, mask


@register_loss("simmim")
class SimMIMLoss(MAELoss):
    """SimMIM's loss: :func:`masked_reconstruction` with the absolute error on raw pixels (the
    authors' code has no per-patch normalisation; ``norm_pix=True`` adds MAE's).
    ``forward(pred, target, mask)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> target = torch.zeros(1, 3, 4)  # (N, L patches, P pixels per patch)
        >>> pred = target - 2
        >>> mask = torch.tensor([[True, False, True]])
        >>> get_loss("simmim")(pred, target, mask)  # absolute error 2 on the masked patches
        tensor(2.)
    """

    distance = "l1"

    def __init__(self, *, norm_pix: bool = False, eps: float = 1e-6,
                 reduction: str = "mean") -> None:
        super().__init__(norm_pix=norm_pix, eps=eps, reduction=reduction)
