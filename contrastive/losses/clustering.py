"""Swapped-prediction losses of the clustering methods: SwAV and DINO (torch only).

Both compare, for every image, a target distribution over K prototypes computed from one
GLOBAL view with the student's prediction from every OTHER view (multi-crop: global views
first, then local ones), by cross-entropy:

    loss_b = mean over (target view t, student view v != t) of  -sum_k target_t[b, k] log softmax(s_v[b] / tau)_k

Inputs are sample-first: scores (B, V, K) hold view v of image b at ``[b, v]`` whatever the
crop sizes (the logits all have K entries). ``reduction`` is over the B images, as in every
loss of the registry. The targets are the caller's, without gradient (DINO's teacher output
comes from a teacher under no_grad; SwAV's codes, when not passed, are computed here from the
detached scores by Sinkhorn-Knopp): nothing else is detached, as everywhere in the registry.

SwAV's Sinkhorn-Knopp equipartition runs over the GLOBAL batch: when ``torch.distributed`` is
initialised with several processes, its sums are all-reduced (as the official code), so two
processes with B images each give the codes of one process with 2B.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .functional import (
    _check_float,
    _full_precision,
    _math_dtype,
    _reduce,
    _shape,
    check_reduction,
    check_temperature,
)
from .modules import BaseLoss
from .registry import register_loss

__all__ = ["DINOLoss", "SwAVLoss", "dino", "dino_center", "sinkhorn_knopp", "swav", "swav_codes"]


def _world(distributed: bool | None) -> int:
    on = dist.is_available() and dist.is_initialized()
    if distributed and not on:
        raise ValueError("distributed=True but torch.distributed is not initialised")
    return dist.get_world_size() if on and distributed is not False else 1


def _all_reduce(x: Tensor, world: int, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    if world > 1:
        dist.all_reduce(x, op=op)
    return x


@torch.no_grad()
def sinkhorn_knopp(scores: Tensor, *, epsilon: float = 0.05, iterations: int = 3,
                   distributed: bool | None = None) -> Tensor:
    """SwAV's soft codes: (B, K) prototype scores -> (B, K) assignments, rows summing to 1,
    each prototype receiving about B_global / K of the mass (Caron et al., NeurIPS 2020,
    arXiv 2006.09882, Sec. 3.1 and Algorithm 1; official ``distributed_sinkhorn`` in
    facebookresearch/swav ``main_swav.py``: epsilon 0.05, 3 iterations).

    Q = exp(scores / epsilon)^T (K, B), normalised to sum 1, then ``iterations`` times: rows to
    1/K, columns to 1/B_global; finally columns to 1. The sums run over every process when
    ``distributed`` (None: whenever torch.distributed is initialised); the processes may hold
    different numbers of rows (DINOv2's masked patches), even none. The scores are shifted
    by their global maximum first, which the normalisation cancels, and the maths runs in
    float64, so a small epsilon neither overflows nor underflows.
    """
    _check_float("sinkhorn_knopp", "scores", scores, 2, "(B, K)")
    _check_sinkhorn_args(epsilon, iterations)
    with _full_precision(scores.device):
        e = scores.detach().to(torch.float64, copy=True)
        return _sinkhorn_rows(e, epsilon, iterations, _world(distributed),
                              e.shape[0]).to(_math_dtype(scores))


def _check_sinkhorn_args(epsilon: float, iterations: int) -> None:
    if not epsilon > 0 or iterations < 1:
        raise ValueError(f"sinkhorn_knopp: epsilon must be > 0 and iterations >= 1, got "
                         f"{epsilon!r}, {iterations!r}")


def _sinkhorn_rows(e: Tensor, epsilon: float, iterations: int, world: int, last: int) -> Tensor:
    """Sinkhorn-Knopp on the float64 (N, K) scores ``e`` (overwritten), returning the codes of
    its ``last`` rows only.

    The iterations only rescale rows and columns, so Q = diag(c) exp(S) diag(r) is kept as
    the two scaling vectors (N,) and (K,) and each normalisation is a matrix-vector product:
    one pass over the (N, K) matrix per sum and no (N, K) write, which matters once a queue
    makes N thousands of rows (SwAV's CIFAR queue: 3,904 x 3,000 per view and step).
    """
    local_top = e.max() if e.numel() else torch.tensor(float("-inf"), dtype=e.dtype,
                                                         device=e.device)
    top = _all_reduce(local_top.clone(), world, dist.ReduceOp.MAX)
    e.sub_(top).div_(epsilon).exp_()  # exp((s - max) / epsilon) in (0, 1]
    k, b = e.shape[1], e.shape[0] * world
    if world > 1:  # the global row count: the processes' counts may differ (DINOv2's patches)
        count = torch.tensor(float(e.shape[0]), dtype=e.dtype, device=e.device)
        b = int(_all_reduce(count, world).item())
    r = torch.ones(k, dtype=e.dtype, device=e.device)  # prototype (row of Q) scalings
    c = torch.ones(e.shape[0], dtype=e.dtype, device=e.device)  # sample (column) scalings
    c /= _all_reduce(e.sum(), world)
    for _ in range(iterations):
        rows = _all_reduce(r * (c @ e), world)  # each prototype's mass, over every process
        r = torch.where(rows > 0, r / (rows * k), 0.0)  # a row that underflowed stays 0
        cols = c * (e @ r)  # each sample's mass
        c = torch.where(cols > 0, c / (cols * b), 0.0)
    return e[-last:] * r * (c[-last:] * b).unsqueeze(1)


def _cross_view_ce(targets: Tensor, logits: Tensor, temperature: float | Tensor) -> Tensor:
    """targets (B, T, K) probabilities of the first T views, logits (B, V, K): per image, the
    mean over pairs (t, v != t) of -sum_k targets[t] log softmax(logits[v] / temperature)."""
    log_p = F.log_softmax(logits / temperature, dim=2)  # B x V x K
    cross = -torch.einsum("btk,bvk->btv", targets, log_p)  # B x T x V
    t, v = targets.shape[1], logits.shape[1]
    keep = ~torch.eye(t, v, dtype=torch.bool, device=logits.device)  # t == v: same view
    return (cross * keep).sum(dim=(1, 2)) / keep.sum()


def _check_views(fn: str, name: str, x: Tensor) -> None:
    _check_float(fn, name, x, 3, "(B, V, K)")
    if x.shape[0] == 0 or x.shape[2] == 0:
        raise ValueError(f"{fn}: `{name}` must be non-empty (B, V, K), got {_shape(x)}")


def swav(scores: Tensor, codes: Tensor | None = None, *, temperature: float = 0.1,
         global_views: int = 2, epsilon: float = 0.05, iterations: int = 3,
         queue_scores: Tensor | None = None, distributed: bool | None = None,
         reduction: str = "mean") -> Tensor:
    """SwAV's swapped prediction (Caron et al. 2020, eq. 1-2; official ``main_swav.py``).

    Codes belong to the first T = ``global_views`` views (the paper's "crops_for_assign");
    every other view predicts them: loss_b = mean_t mean_{v != t} CE(q_t[b], softmax(s_v[b]/tau)).
    With ``codes=None`` they are computed here, without gradient, by Sinkhorn-Knopp over the
    global batch from the detached scores of each global view (with ``queue_scores``
    (Q, T, K) of queued features prepended when the batch is small, as the official queue;
    their codes are dropped). Defaults: temperature 0.1, epsilon 0.05, 3 iterations (paper
    Sec. 4, official code).

    Args:
        scores: (B, V, K) cosine scores of each view with the (unit) prototypes, global views
            first. codes: optional (B, T, K) targets (rows summing to 1), used as given.
    Returns:
        A scalar, or (B,) with ``reduction="none"``.
    """
    fn = "swav"
    check_reduction(fn, reduction)
    check_temperature(fn, temperature)
    _check_views(fn, "scores", scores)
    t = global_views if codes is None else codes.shape[1] if codes.dim() == 3 else -1
    if not 1 <= t <= scores.shape[1] or scores.shape[1] < 2:
        raise ValueError(f"{fn}: need 2 or more views and 1 <= global views <= V; got "
                         f"{t} global views with scores {_shape(scores)}")
    if codes is not None:
        _check_views(fn, "codes", codes)
        if codes.shape[0] != scores.shape[0] or codes.shape[2] != scores.shape[2]:
            raise ValueError(f"{fn}: `codes` must be (B, T, K) with the B, K of `scores`; got "
                             f"codes {_shape(codes)}, scores {_shape(scores)}")
    if queue_scores is not None and (queue_scores.dim() != 3 or queue_scores.shape[1:]
                                     != (t, scores.shape[2])):
        raise ValueError(f"{fn}: `queue_scores` must have shape (Q, global_views, K) = "
                         f"(Q, {t}, {scores.shape[2]}), got {_shape(queue_scores)}")
    with _full_precision(scores.device):
        s = scores.to(_math_dtype(scores, codes))
        if codes is None:
            codes = torch.stack([swav_codes(s[:, i], epsilon=epsilon, iterations=iterations,
                                            queue_scores=None if queue_scores is None
                                            else queue_scores[:, i], distributed=distributed)
                                 for i in range(t)], dim=1)
        loss = _cross_view_ce(codes.to(s.dtype), s, temperature)
    return _reduce(loss, reduction)


@torch.no_grad()
def swav_codes(scores: Tensor, *, epsilon: float = 0.05, iterations: int = 3,
               queue_scores: Tensor | None = None, distributed: bool | None = None) -> Tensor:
    """Codes (B, K) of one global view's scores (B, K): Sinkhorn-Knopp over the global batch,
    with ``queue_scores`` (Q, K) prepended and their codes dropped (official queue)."""
    _check_float("swav_codes", "scores", scores, 2, "(B, K)")
    _check_sinkhorn_args(epsilon, iterations)
    n, k = scores.shape
    with _full_precision(scores.device):
        if queue_scores is None:
            e = scores.detach().to(torch.float64, copy=True)
        else:  # one float64 buffer: no float32 concatenation first
            if queue_scores.dim() != 2 or queue_scores.shape[1] != k:
                raise ValueError(f"swav_codes: `queue_scores` must be (Q, K) with K = {k} "
                                 f"prototypes, got {_shape(queue_scores)}")
            q = queue_scores.shape[0]
            e = torch.empty(q + n, k, dtype=torch.float64, device=scores.device)
            e[:q] = queue_scores.detach()
            e[q:] = scores.detach()
        return _sinkhorn_rows(e, epsilon, iterations, _world(distributed),
                              n).to(_math_dtype(scores))


def dino(student: Tensor, teacher: Tensor, center: Tensor | None = None, *,
         student_temperature: float = 0.1, teacher_temperature: float | Tensor = 0.04,
         reduction: str = "mean") -> Tensor:
    """DINO's loss (Caron et al., ICCV 2021, arXiv 2104.14294, Algorithm 1; official
    facebookresearch/dino ``main_dino.py`` ``DINOLoss``).

    Teacher targets softmax((teacher - center) / teacher_temperature) of the T global views,
    student log-softmax(student / student_temperature) of every
    view (global views first); loss_b = mean over pairs (t, v != t) of the cross-entropy.
    Defaults: student temperature 0.1, teacher temperature 0.04 (after the warm-up from 0.04
    to 0.07 of the official code; the method's schedule passes the current value).

    Args:
        student: (B, V, K) student head outputs; teacher: (B, T, K) teacher head outputs,
            T <= V, computed without gradient (the method's teacher runs under no_grad, as the
            official ``teacher_output.detach()``); center: (K,) the running centre (None: 0).
    Returns:
        A scalar, or (B,) with ``reduction="none"``.
    """
    fn = "dino"
    check_reduction(fn, reduction)
    check_temperature(fn, student_temperature)
    check_temperature(fn, teacher_temperature)
    _check_views(fn, "student", student)
    _check_views(fn, "teacher", teacher)
    b, v, k = student.shape
    if teacher.shape[0] != b or teacher.shape[2] != k or teacher.shape[1] > v or v < 2:
        raise ValueError(f"{fn}: `teacher` must be (B, T, K) with the B, K of `student` and "
                         f"T <= V, V >= 2; got student {_shape(student)}, teacher "
                         f"{_shape(teacher)}")
    if center is not None and tuple(center.shape) not in ((k,), (1, k)):
        raise ValueError(f"{fn}: `center` must have shape (K,) = ({k},), got {_shape(center)}")
    with _full_precision(student.device):
        dtype = _math_dtype(student, teacher)
        t = teacher.to(dtype)
        if center is not None:
            t = t - center.to(dtype).reshape(1, 1, k)
        targets = F.softmax(t / teacher_temperature, dim=2)
        loss = _cross_view_ce(targets, student.to(dtype), student_temperature)
    return _reduce(loss, reduction)


@torch.no_grad()
def dino_center(center: Tensor, teacher: Tensor, *, momentum: float = 0.9,
                distributed: bool | None = None) -> Tensor:
    """DINO's centre update: ``momentum * center + (1 - momentum) * mean of the teacher outputs
    over the GLOBAL batch and the teacher views`` (official ``update_center``: all-reduced sum /
    (n * world size), momentum 0.9). teacher (B, T, K) or (N, K); returns the new (K,) centre."""
    if not 0 <= momentum <= 1:
        raise ValueError(f"dino_center: momentum must be in [0, 1], got {momentum!r}")
    world = _world(distributed)
    flat = teacher.reshape(-1, teacher.shape[-1])
    batch_center = _all_reduce(flat.sum(dim=0).to(center.dtype), world) / (flat.shape[0] * world)
    return center * momentum + batch_center * (1 - momentum)


class _MultiViewLoss(BaseLoss):
    scale_invariant: ClassVar[bool] = False

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """(B, 4, K) scores of 2 global + 2 local views, (B, 2, K) targets of the global ones."""
        scores = torch.tanh(cls._randn(n, 4, dim, dtype=torch.float64, generator=generator))
        targets = torch.softmax(3 * cls._randn(n, 2, dim, dtype=torch.float64,
                                               generator=generator), dim=2)
        return scores.to(dtype), targets.to(dtype)


@register_loss("swav", "swapped_prediction")
class SwAVLoss(_MultiViewLoss):
    """SwAV; see :func:`swav`. ``forward(scores (B, V, K), codes (B, T, K) | None = None,
    queue_scores (Q, T, K) | None = None)``; codes None: Sinkhorn-Knopp here.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> scores = torch.zeros(4, 2, 3)  # (B, V, K): 2 views' scores against 3 prototypes
        >>> get_loss("swav")(scores)  # equal scores: uniform codes and predictions, cross-entropy log 3
        tensor(1.0986)
        >>> torch.log(torch.tensor(3.0))
        tensor(1.0986)
    """

    def __init__(self, temperature: float = 0.1, *, global_views: int = 2, epsilon: float = 0.05,
                 iterations: int = 3, distributed: bool | None = None,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        check_temperature("SwAVLoss", temperature)
        self.temperature, self.global_views = float(temperature), int(global_views)
        self.epsilon, self.iterations, self.distributed = float(epsilon), int(iterations), distributed

    def forward(self, scores: Tensor, codes: Tensor | None = None,
                queue_scores: Tensor | None = None) -> Tensor:
        return swav(scores, codes, temperature=self.temperature, global_views=self.global_views,
                    epsilon=self.epsilon, iterations=self.iterations, queue_scores=queue_scores,
                    distributed=self.distributed, reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, global_views={self.global_views}, "
                f"epsilon={self.epsilon}, iterations={self.iterations}")


@register_loss("dino")
class DINOLoss(_MultiViewLoss):
    """DINO; see :func:`dino`. ``forward(student (B, V, K), teacher (B, T, K), center (K,) | None
    = None, teacher_temperature=None)``; the teacher temperature may come per call (the
    method's warm-up schedule).

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> student = teacher = torch.zeros(2, 2, 4)  # (B, views, K): uniform over 4 prototypes
        >>> get_loss("dino")(student, teacher)  # cross-entropy of two uniforms: log 4
        tensor(1.3863)
        >>> center = torch.zeros(4)  # the teacher's running center, subtracted before its softmax
        >>> get_loss("dino")(student, teacher, center, teacher_temperature=0.07)
        tensor(1.3863)
    """

    def __init__(self, student_temperature: float = 0.1, teacher_temperature: float = 0.04, *,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        check_temperature("DINOLoss", student_temperature)
        check_temperature("DINOLoss", teacher_temperature)
        self.student_temperature = float(student_temperature)
        self.teacher_temperature = float(teacher_temperature)

    def forward(self, student: Tensor, teacher: Tensor, center: Tensor | None = None,
                teacher_temperature: float | Tensor | None = None) -> Tensor:
        tt = self.teacher_temperature if teacher_temperature is None else teacher_temperature
        return dino(student, teacher, center, student_temperature=self.student_temperature,
                    teacher_temperature=tt, reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"student_temperature={self.student_temperature}, "
                f"teacher_temperature={self.teacher_temperature}")
