"""The two terms DINOv2 adds to DINO's loss: iBOT's masked-patch loss and the KoLeo regulariser
(torch only).

- :func:`ibot_patch`: Zhou et al., "iBOT: Image BERT Pre-Training with Online Tokenizer", ICLR
  2022 (arXiv 2111.07832), eq. 2 / the authors' bytedance/ibot ``main_ibot.py``, ``iBOTLoss``
  (``loss2``): for every masked patch of the student's input, the cross-entropy between the
  teacher's centred, sharpened distribution of the same (unmasked) patch and the student's;
  averaged over each image's masked patches (at least 1), then over the images. DINOv2
  (Oquab et al., TMLR 2024, arXiv 2304.07193; facebookresearch/dinov2
  ``dinov2/loss/ibot_patch_loss.py``, ``forward_masked``) computes the same.
- :func:`koleo`: Sablayrolles et al., "Spreading vectors for similarity search", ICLR 2019
  (arXiv 1806.03198), as DINOv2 uses it (``dinov2/loss/koleo_loss.py``): on L2-normalised rows,
  ``-mean_i log(||x_i - x_nn(i) + eps|| + eps)`` with nn(i) the row of largest cosine other than
  i itself; DINOv2 computes it per process (its batch is the process's rows), and so does this
  function: it gathers nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import _check_float, _full_precision, _math_dtype, _reduce, _shape, check_reduction
from .modules import BaseLoss
from .registry import register_loss

__all__ = ["IBOTPatchLoss", "KoLeoLoss", "ibot_patch", "koleo"]


def _check_temperatures(fn: str, *values: float) -> None:
    for t in values:
        if not (isinstance(t, (int, float)) and 0 < t < float("inf")):
            raise ValueError(f"{fn}: temperatures must be finite and > 0, got {values}")


def ibot_patch(student: Tensor, teacher: Tensor, mask: Tensor, center: Tensor | None = None, *,
               student_temperature: float = 0.1, teacher_temperature: float = 0.07,
               reduction: str = "mean") -> Tensor:
    """iBOT's patch loss (see the module docstring).

    Args:
        student: (N, L, K) the student's patch logits (its input masked where ``mask``).
        teacher: (N, L, K) the teacher's patch logits on the unmasked image (detach them).
        mask: (N, L) bool, True where the student's patch was masked: the loss is taken there.
        center: (K,) subtracted from the teacher's logits (iBOT's ``center2``), or None.
        student_temperature, teacher_temperature: iBOT's 0.1 and 0.07 (``teacher_patch_temp``
            after its warm-up from 0.04).
    Returns: a scalar, or (N,) with ``reduction="none"`` (0 for an image without masks).
    """
    fn = "ibot_patch"
    check_reduction(fn, reduction)
    _check_temperatures(fn, student_temperature, teacher_temperature)
    _check_float(fn, "student", student, 3, "(N, L, K)")
    _check_float(fn, "teacher", teacher, 3, "(N, L, K)")
    if student.shape != teacher.shape or mask.shape != student.shape[:2]:
        raise ValueError(f"{fn}: student and teacher must be (N, L, K) and mask (N, L); got "
                         f"{_shape(student)}, {_shape(teacher)}, {_shape(mask)}")
    with _full_precision(student.device):
        dtype = _math_dtype(student, teacher)
        t = teacher.to(dtype) - (0 if center is None else center.to(dtype))
        targets = F.softmax(t / teacher_temperature, dim=-1)
        ce = -(targets * F.log_softmax(student.to(dtype) / student_temperature, dim=-1)).sum(-1)
        weight = mask.to(dtype)
        return _reduce((ce * weight).sum(1) / weight.sum(1).clamp_min(1), reduction)


def koleo(x: Tensor, *, eps: float = 1e-8, reduction: str = "mean") -> Tensor:
    """KoLeo (see the module docstring). x: (N, D), N >= 2. Returns a scalar or (N,)."""
    fn = "koleo"
    check_reduction(fn, reduction)
    _check_float(fn, "x", x, 2, "(N, D)")
    if x.shape[0] < 2:
        raise ValueError(f"{fn}: needs at least 2 rows (each one's nearest neighbour), got "
                         f"{_shape(x)}")
    with _full_precision(x.device):
        u = F.normalize(x.to(_math_dtype(x)), p=2, dim=-1, eps=eps)
        with torch.no_grad():
            sim = u @ u.T
            sim.fill_diagonal_(-2.0)  # below any cosine: never its own neighbour
            nearest = sim.argmax(dim=1)
        dist = F.pairwise_distance(u, u[nearest], p=2, eps=eps)
        return _reduce(-(dist + eps).log(), reduction)


@register_loss("ibot_patch", "ibot")
class IBOTPatchLoss(BaseLoss):
    """iBOT's masked-patch loss; see :func:`ibot_patch`. ``forward(student, teacher, mask,
    center=None)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> student = teacher = torch.zeros(2, 3, 4)  # (N, L patches, K prototypes)
        >>> mask = torch.tensor([[True, False, False], [False, True, True]])  # the student's masked patches
        >>> get_loss("ibot_patch")(student, teacher, mask)  # uniform on both sides: log 4 on each masked patch
        tensor(1.3863)
    """

    scale_invariant = False

    def __init__(self, *, student_temperature: float = 0.1, teacher_temperature: float = 0.07,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        _check_temperatures("IBOTPatchLoss", student_temperature, teacher_temperature)
        self.student_temperature = float(student_temperature)
        self.teacher_temperature = float(teacher_temperature)

    def forward(self, student: Tensor, teacher: Tensor, mask: Tensor,
                center: Tensor | None = None) -> Tensor:
        return ibot_patch(student, teacher, mask, center,
                          student_temperature=self.student_temperature,
                          teacher_temperature=self.teacher_temperature,
                          reduction=self.reduction)

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """student and teacher (n, 4, dim), mask (n, 4) with 2 patches masked per image."""
        student = cls._randn(n, 4, dim, dtype=dtype, generator=generator)
        teacher = cls._randn(n, 4, dim, dtype=dtype, generator=generator)
        mask = torch.rand(n, 4, generator=generator).argsort(1).argsort(1) >= 2
        return student, teacher, mask


@register_loss("koleo")
class KoLeoLoss(BaseLoss):
    """The KoLeo regulariser; see :func:`koleo`. ``forward(x (N, D))``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> x = torch.eye(3)  # each row's nearest neighbour at distance sqrt(2)
        >>> get_loss("koleo")(x)  # -log(sqrt(2))
        tensor(-0.3466)
        >>> -torch.log(torch.tensor(2.0).sqrt())
        tensor(-0.3466)
    """

    def __init__(self, *, eps: float = 1e-8, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        if not eps > 0:
            raise ValueError(f"KoLeoLoss: eps must be > 0, got {eps}")
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        return koleo(x, eps=self.eps, reduction=self.reduction)

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (cls._randn(n, dim, dtype=dtype, generator=generator),)
