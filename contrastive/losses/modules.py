"""The registered loss modules: thin ``nn.Module`` wrappers of :mod:`contrastive.losses.functional`.

Each class keeps its options (temperature, normalize, reduction...) from ``__init__`` and takes
tensors in ``forward``; the formulas, shapes and papers are in the docstrings of the functions.
Every class also has ``example_inputs(n, dim)``: small valid inputs, used by the generic tests
that iterate the registry (and handy to try a loss in a notebook).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from . import functional as LF
from .registry import register_loss

__all__ = [
    "BaseLoss",
    "CosNCELoss",
    "DCLLoss",
    "DCLWLoss",
    "InfoNCELoss",
    "KDLoss",
    "NTXentLoss",
    "SigLIPLoss",
    "SupConLoss",
]


class BaseLoss(nn.Module):
    """Common surface of the built-in losses (user losses need not derive from it).

    Class attributes:
        scale_invariant: True when the loss L2-normalises its inputs by default, so multiplying
            every floating-point input by a positive number leaves it unchanged.
        batch_level: True for a statistic of the whole batch (Barlow Twins, VICReg): no
            per-sample values, ``reduction="mean"`` only, invariant to permuting the samples.
    """

    scale_invariant: ClassVar[bool] = True
    batch_level: ClassVar[bool] = False

    def __init__(self, *, reduction: str = "mean") -> None:
        super().__init__()
        LF.check_reduction(type(self).__name__, reduction)
        self.reduction = reduction

    @classmethod
    def example_inputs(
        cls,
        n: int = 6,
        dim: int = 8,
        *,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, ...]:
        """Small valid positional inputs for ``forward``. Every tensor is indexed by the sample
        along dim 0, so permuting dim 0 of all of them permutes the samples. Default: two
        (n, dim) tensors (a two-view or two-tower loss); other losses override it."""
        return _pair_inputs(n, dim, dtype, generator)

    @staticmethod
    def _randn(*shape: int, dtype: torch.dtype, generator: torch.Generator | None) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


class _TemperatureLoss(BaseLoss):
    def __init__(self, *, temperature: float, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        LF.check_temperature(type(self).__name__, temperature)
        self.temperature = float(temperature)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, reduction={self.reduction!r}"


def _pair_inputs(
    n: int, dim: int, dtype: torch.dtype, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    a = BaseLoss._randn(n, dim, dtype=dtype, generator=generator)
    b = a + 0.5 * BaseLoss._randn(n, dim, dtype=dtype, generator=generator)
    return a, b


@register_loss("infonce", "info_nce")
class InfoNCELoss(_TemperatureLoss):
    """InfoNCE / MoCo loss; see :func:`contrastive.losses.functional.infonce`.

    ``forward(query (N, D), key (M, D), negatives (K, D) | None = None, *, positive_offset=0)``.

    ``learnable_temperature=True`` (CLIP) learns ``logit_scale = log(1 / tau)``, initialised from
    ``temperature`` and clamped to ``1 / tau <= max_logit_scale`` (100 in CLIP); use it with
    ``symmetric=True`` for CLIP's loss. The current value is ``current_temperature()``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> q = torch.eye(2)  # two orthogonal unit queries, each its own key's positive
        >>> loss_fn = get_loss("infonce", temperature=1.0)
        >>> loss_fn(q, q)  # -log(e / (e + 1)): the positive at cos 1, one negative at cos 0
        tensor(0.3133)
        >>> torch.log1p(torch.exp(torch.tensor(-1.0)))
        tensor(0.3133)
        >>> queue = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))  # MoCo: K negatives
        >>> loss_fn(q, q, queue).shape
        torch.Size([])
    """

    def __init__(
        self,
        temperature: float = 0.07,
        *,
        normalize: bool = True,
        symmetric: bool = False,
        reduction: str = "mean",
        learnable_temperature: bool = False,
        max_logit_scale: float = 100.0,
    ) -> None:
        super().__init__(temperature=temperature, reduction=reduction)
        self.normalize = normalize
        self.symmetric = symmetric
        self.max_logit_scale = float(max_logit_scale)
        if learnable_temperature:
            if 1.0 / self.temperature > self.max_logit_scale:
                raise ValueError(
                    f"InfoNCELoss: `max_logit_scale` ({max_logit_scale}) must be >= "
                    f"1 / temperature ({1.0 / self.temperature:g})"
                )
            self.logit_scale: nn.Parameter | None = nn.Parameter(
                torch.tensor(math.log(1.0 / self.temperature))
            )
        else:
            self.logit_scale = None

    def current_temperature(self) -> float | Tensor:
        """tau used by ``forward``: the fixed float, or ``1 / exp(logit_scale)`` (a tensor)."""
        if self.logit_scale is None:
            return self.temperature
        return 1.0 / self.logit_scale.clamp(max=math.log(self.max_logit_scale)).exp()

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        negatives: Tensor | None = None,
        *,
        positive_offset: int = 0,
    ) -> Tensor:
        return LF.infonce(
            query,
            key,
            negatives,
            temperature=self.current_temperature(),
            normalize=self.normalize,
            symmetric=self.symmetric,
            positive_offset=positive_offset,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        learn = ", learnable_temperature=True" if self.logit_scale is not None else ""
        return (
            f"{super().extra_repr()}, normalize={self.normalize}, symmetric={self.symmetric}{learn}"
        )


class _TwoViewLoss(_TemperatureLoss):
    """Shared by NT-Xent and DCL: ``forward(z1, z2, *, z1_all=None, z2_all=None,
    positive_offset=0)``."""

    _fn = staticmethod(LF.ntxent)

    def __init__(
        self, temperature: float = 0.1, *, normalize: bool = True, reduction: str = "mean"
    ) -> None:
        super().__init__(temperature=temperature, reduction=reduction)
        self.normalize = normalize

    def forward(
        self,
        z1: Tensor,
        z2: Tensor,
        *,
        z1_all: Tensor | None = None,
        z2_all: Tensor | None = None,
        positive_offset: int = 0,
    ) -> Tensor:
        return self._fn(
            z1,
            z2,
            temperature=self.temperature,
            normalize=self.normalize,
            reduction=self.reduction,
            z1_all=z1_all,
            z2_all=z2_all,
            positive_offset=positive_offset,
            **self._options(),
        )

    def _options(self) -> dict[str, Any]:
        """Keyword arguments of ``_fn`` beyond the two-view ones (a subclass's own)."""
        return {}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalize={self.normalize}"


@register_loss("ntxent", "nt_xent")
class NTXentLoss(_TwoViewLoss):
    """SimCLR's NT-Xent; see :func:`contrastive.losses.functional.ntxent` (multi-process
    arguments included). ``forward(z1 (N, D), z2 (N, D), *, z1_all=None, z2_all=None,
    positive_offset=0)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> z = torch.eye(2)  # two samples, both views equal
        >>> get_loss("ntxent", temperature=1.0)(z, z)  # -log(e / (e + 2)): positive at cos 1, 2 negatives at 0
        tensor(0.5514)
        >>> -1 + torch.log(torch.e + torch.tensor(2.0))
        tensor(0.5514)
    """

    _fn = staticmethod(LF.ntxent)


@register_loss("dcl", "decoupled_contrastive")
class DCLLoss(_TwoViewLoss):
    """Decoupled contrastive loss; see :func:`contrastive.losses.functional.dcl`.
    ``forward(z1 (N, D), z2 (N, D), *, z1_all=None, z2_all=None, positive_offset=0)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> z = torch.eye(2)
        >>> get_loss("dcl", temperature=1.0)(z, z)  # -1 + log(2): the positive left out of the denominator
        tensor(-0.3069)
        >>> torch.log(torch.tensor(2.0)) - 1
        tensor(-0.3069)
    """

    _fn = staticmethod(LF.dcl)


@register_loss("dclw", "decoupled_contrastive_weighted")
class DCLWLoss(_TwoViewLoss):
    """DCL with the von Mises-Fisher weighting; see :func:`contrastive.losses.functional.dclw`.
    ``forward(z1 (N, D), z2 (N, D), *, z1_all=None, z2_all=None, positive_offset=0)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> z = torch.eye(2)  # equal positives: every weight 2 - N softmax = 1, so DCLW equals DCL
        >>> get_loss("dclw", temperature=1.0)(z, z)
        tensor(-0.3069)
        >>> get_loss("dcl", temperature=1.0)(z, z)
        tensor(-0.3069)
    """

    _fn = staticmethod(LF.dclw)

    def __init__(
        self,
        temperature: float = 0.1,
        *,
        sigma: float = 0.5,
        detach_weight: bool = False,
        normalize: bool = True,
        reduction: str = "mean",
    ) -> None:
        super().__init__(temperature, normalize=normalize, reduction=reduction)
        LF.dclw(*_pair_inputs(2, 2, torch.float32, None), sigma=sigma)  # checks sigma early
        self.sigma = float(sigma)
        self.detach_weight = detach_weight

    def _options(self) -> dict[str, Any]:
        return {"sigma": self.sigma, "detach_weight": self.detach_weight}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sigma={self.sigma}, detach_weight={self.detach_weight}"


@register_loss("siglip", "sigmoid")
class SigLIPLoss(BaseLoss):
    """SigLIP's pairwise sigmoid loss; see :func:`contrastive.losses.functional.siglip`.

    ``forward(image (N, D), text (N, D))``. Holds the paper's learnable ``log_scale`` t'
    (t = exp(t'), init log 10) and ``bias`` b (init -10) as parameters (``learnable=False``
    keeps them as fixed buffers), so the optimiser must see this module's parameters (as
    CLIP's ``logit_scale``). No clamp on t here: the paper states none and big_vision's SigLIP
    configs set ``max_temperature = False``; open_clip's training loop clamps its logit scale
    to t <= 100 for every model (``open_clip_train/train.py``), a trainer's choice.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> import math
        >>> z = torch.eye(2)  # 2 image-text pairs; logit t cos + b with t = 10, b = -10 at init
        >>> loss_fn = get_loss("siglip")
        >>> round(loss_fn(z, z).item(), 4)  # positives at logit 0, negatives at -10
        0.6932
        >>> round((2 * math.log(2) + 2 * math.log1p(math.exp(-10))) / 2, 4)  # sum over pairs / N
        0.6932
        >>> sorted(name for name, _ in loss_fn.named_parameters())  # the optimiser must see them
        ['bias', 'log_scale']
    """

    def __init__(
        self,
        scale_init: float = 10.0,
        bias_init: float = -10.0,
        *,
        learnable: bool = True,
        normalize: bool = True,
        reduction: str = "mean",
    ) -> None:
        super().__init__(reduction=reduction)
        LF.siglip(*_pair_inputs(2, 2, torch.float32, None), scale=scale_init, bias=bias_init)
        log_scale = torch.tensor(math.log(scale_init))
        bias = torch.tensor(float(bias_init))
        if learnable:
            self.log_scale = nn.Parameter(log_scale)
            self.bias = nn.Parameter(bias)
        else:
            self.register_buffer("log_scale", log_scale)
            self.register_buffer("bias", bias)
        self.learnable = learnable
        self.normalize = normalize

    def forward(self, image: Tensor, text: Tensor) -> Tensor:
        """The loss of the local pairs; on several processes (a default process group) the
        exact global loss by the ring exchange of :func:`~contrastive.losses.functional.
        siglip_ring` (pass the local batch, not a gathered one)."""
        return LF.siglip_ring(
            image,
            text,
            scale=self.log_scale.exp(),
            bias=self.bias,
            normalize=self.normalize,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return (
            f"learnable={self.learnable}, normalize={self.normalize}, "
            f"reduction={self.reduction!r}"
        )


@register_loss("cosnce", "cos_nce")
class CosNCELoss(BaseLoss):
    """LRC-BERT's COS-NCE; see :func:`contrastive.losses.functional.cosnce`.
    ``forward(student (N, D), teacher (N, D), negatives (N, K, D) | (K, D) | None = None)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> student = teacher = torch.tensor([[1.0, 0.0]])
        >>> negatives = torch.tensor([[[0.0, 1.0]]])  # (N, K, D): one negative at 90 degrees
        >>> get_loss("cosnce")(student, teacher, negatives)  # (2 - (g(n, s) - g(t, s))) / 2 + g(t, s), g = 1 - cos
        tensor(0.5000)
    """

    def __init__(self, *, normalize: bool = True, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        self.normalize = normalize

    def forward(self, student: Tensor, teacher: Tensor, negatives: Tensor | None = None) -> Tensor:
        return LF.cosnce(
            student, teacher, negatives, normalize=self.normalize, reduction=self.reduction
        )

    def extra_repr(self) -> str:
        return f"normalize={self.normalize}, reduction={self.reduction!r}"

    @classmethod
    def example_inputs(
        cls,
        n: int = 6,
        dim: int = 8,
        *,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, ...]:
        student, teacher = _pair_inputs(n, dim, dtype, generator)
        negatives = cls._randn(n, 3, dim, dtype=dtype, generator=generator)
        return student, teacher, negatives


@register_loss("supcon", "supervised_contrastive")
class SupConLoss(_TemperatureLoss):
    """Supervised contrastive loss (L^sup_out); see :func:`contrastive.losses.functional.supcon`.
    ``forward(features (N, V, D), labels (N,) | None = None)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> z1, z2 = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
        >>> views = torch.stack([z1, z2], dim=1)  # (N, V, D)
        >>> supcon = get_loss("supcon", temperature=0.5)(views)  # no labels: every sample its own class
        >>> torch.allclose(supcon, get_loss("ntxent", temperature=0.5)(z1, z2))  # ... which is SimCLR's loss
        True
        >>> labels = torch.tensor([0, 0, 1, 1])
        >>> get_loss("supcon", temperature=0.5)(views, labels).shape
        torch.Size([])
    """

    def __init__(
        self, temperature: float = 0.1, *, normalize: bool = True, reduction: str = "mean"
    ) -> None:
        super().__init__(temperature=temperature, reduction=reduction)
        self.normalize = normalize

    def forward(self, features: Tensor, labels: Tensor | None = None) -> Tensor:
        return LF.supcon(
            features,
            labels,
            temperature=self.temperature,
            normalize=self.normalize,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalize={self.normalize}"

    @classmethod
    def example_inputs(
        cls,
        n: int = 6,
        dim: int = 8,
        *,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, ...]:
        features = cls._randn(n, 2, dim, dtype=dtype, generator=generator)
        labels = torch.arange(n) % 3
        return features, labels


@register_loss("kd", "distillation")
class KDLoss(_TemperatureLoss):
    """Knowledge-distillation soft loss KL(teacher || student) * t^2; see
    :func:`contrastive.losses.functional.kd`.
    ``forward(student_logits (N, C), teacher_logits (N, C))``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> teacher = torch.log(torch.tensor([[1.0, 3.0]]))  # softmax: 0.25, 0.75
        >>> student = torch.zeros(1, 2)  # softmax: 0.5, 0.5
        >>> get_loss("kd")(student, teacher)  # KL = 0.25 log 0.5 + 0.75 log 1.5, times t^2 = 1
        tensor(0.1308)
        >>> get_loss("kd", temperature=2.0)(teacher, teacher)  # equal logits: nothing to distil
        tensor(0.)
    """

    scale_invariant: ClassVar[bool] = False

    def __init__(self, temperature: float = 1.0, *, reduction: str = "mean") -> None:
        super().__init__(temperature=temperature, reduction=reduction)

    def forward(self, student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
        return LF.kd(
            student_logits, teacher_logits, temperature=self.temperature, reduction=self.reduction
        )
