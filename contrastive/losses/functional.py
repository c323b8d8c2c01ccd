"""Contrastive losses as plain functions (torch only).

Conventions shared by every function here:

- Inputs may be float16, bfloat16, float32 or float64. The maths (normalisation, matrix products,
  log-sum-exp) runs in float32 (float64 when any input is float64) with autocast disabled, so the
  result is a float32 tensor for half-precision inputs, even inside ``torch.autocast``.
- The embedding losses L2-normalise their inputs unless ``normalize=False`` (then the inputs are
  used as they are: pass unit vectors). The norm is clamped at ``EPS``, so a zero vector gives
  finite values and gradients, never NaN.
- ``reduction``: ``"mean"`` (default) or ``"sum"`` over the per-sample values, or ``"none"`` for
  the per-sample values themselves, batch dimension first (shapes in each docstring).
  ``loss(reduction="mean") == loss(reduction="none").mean()`` and likewise for ``"sum"``.
- ``temperature`` is a positive float or a scalar tensor (e.g. a learnable one).
- Nothing is detached here: stop-gradients (MoCo keys, a distillation teacher) are the caller's
  choice.
- Bad arguments raise ``ValueError`` naming the argument and the shapes seen.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "EPS",
    "cosnce",
    "dcl",
    "dclw",
    "infonce",
    "kd",
    "ntxent",
    "siglip",
    "siglip_ring",
    "supcon",
]

EPS = 1e-8
"""Lower bound of the norm in the L2 normalisation (keeps zero vectors finite)."""

_REDUCTIONS = ("mean", "sum", "none")


# --------------------------------------------------------------------------- argument checks


def _shape(x: Tensor | None) -> str:
    return "None" if x is None else str(tuple(x.shape))


def check_reduction(fn: str, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: `reduction` must be one of {_REDUCTIONS}, got {reduction!r}")


def check_temperature(fn: str, temperature: float | Tensor) -> None:
    if isinstance(temperature, Tensor):
        if temperature.numel() != 1:
            raise ValueError(
                f"{fn}: `temperature` tensor must hold one value, got shape {_shape(temperature)}"
            )
        return  # no value check: reading it would synchronise the device
    if (
        not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(f"{fn}: `temperature` must be a finite number > 0, got {temperature!r}")


def _check_float(fn: str, name: str, x: Tensor, ndim: int, layout: str) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(
            f"{fn}: `{name}` must be a tensor of shape {layout}, got {type(x).__name__}"
        )
    if x.dim() != ndim:
        raise ValueError(f"{fn}: `{name}` must have shape {layout}, got shape {_shape(x)}")
    if not x.is_floating_point():
        raise ValueError(f"{fn}: `{name}` must be a floating-point tensor, got dtype {x.dtype}")


def _check_offset(fn: str, offset: int, n: int, m: int, detail: str) -> int:
    try:
        offset = operator.index(offset)
    except TypeError:
        raise ValueError(f"{fn}: `positive_offset` must be an int, got {offset!r}") from None
    if not 0 <= offset <= m - n:
        raise ValueError(
            f"{fn}: `positive_offset` must lie in [0, M - N] = [0, {m - n}] so that every local "
            f"row has its positive; got positive_offset={offset} with {detail}"
        )
    return offset


# --------------------------------------------------------------------------- numerics helpers


@contextlib.contextmanager
def _full_precision(device: torch.device) -> Iterator[None]:
    """Disable autocast: the logits and their log-sum-exp must not be computed in bf16/fp16."""
    try:
        ctx: contextlib.AbstractContextManager = torch.autocast(
            device_type=device.type, enabled=False
        )
    except (RuntimeError, ValueError):  # a device type autocast does not know
        ctx = contextlib.nullcontext()
    with ctx:
        yield


def _math_dtype(*tensors: Tensor | None) -> torch.dtype:
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _embed(x: Tensor, dtype: torch.dtype, normalize: bool) -> Tensor:
    x = x.to(dtype)
    return F.normalize(x, dim=-1, eps=EPS) if normalize else x


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


# --------------------------------------------------------------------------- InfoNCE


def infonce(
    query: Tensor,
    key: Tensor,
    negatives: Tensor | None = None,
    *,
    temperature: float | Tensor = 0.07,
    normalize: bool = True,
    symmetric: bool = False,
    positive_offset: int = 0,
    reduction: str = "mean",
) -> Tensor:
    r"""InfoNCE, the MoCo contrastive loss (He et al., "Momentum Contrast for Unsupervised Visual
    Representation Learning", CVPR 2020, eq. 1; van den Oord et al. 2018 named it InfoNCE).

    .. math::
        L_i = -\log \frac{\exp(q_i \cdot k^+_i / \tau)}{\sum_{j} \exp(q_i \cdot k_j / \tau)}

    Two modes:

    - ``negatives`` given (a MoCo queue): the candidates of query i are its positive
      ``key[positive_offset + i]`` and all K rows of ``negatives``, i.e. exactly MoCo's
      ``logits = cat([l_pos, l_neg], dim=1) / tau`` (N x (1+K)) and cross-entropy with target 0.
    - ``negatives=None`` (in-batch, MoCo v3 / CLIP): logits ``query @ key.T / tau`` (N x M),
      target of query i is ``positive_offset + i``; the other keys are the negatives.

    Several processes (MoCo v3): pass the local queries (N rows), the keys gathered from all
    processes (M = N * world_size rows) and ``positive_offset = N * rank``. The mean of the
    per-process losses then equals the one-process loss on the whole batch.

    ``symmetric=True`` (CLIP, Radford et al. 2021) averages both directions of one pair,
    ``(CE(q k^T) + CE(k q^T)) / 2``; it needs ``negatives=None`` and M == N. (For CLIP on several
    processes, average ``infonce(q, k_all, positive_offset=o)`` and ``infonce(k, q_all, ...)``;
    MoCo v3's symmetrised loss is a *sum* of two calls, composed by the method.)

    Args:
        query: (N, D) queries.
        key: (M, D) keys, M >= N; ``key[positive_offset + i]`` is the positive of query i.
        negatives: (K, D) negatives shared by every query, or None for in-batch negatives.
        temperature: tau > 0 (MoCo v1 0.07, v2 0.2, v3 0.2 (ViT) / 1.0 (ResNet)).
        normalize: L2-normalise query, key and negatives first.
        symmetric: CLIP-style average of the two directions (see above).
        positive_offset: row of ``key`` holding the positive of query 0.
        reduction: "mean" | "sum" | "none".

    Returns:
        A scalar, or (N,) per-query losses with ``reduction="none"`` (for ``symmetric=True``
        the mean of the two directions for pair i).
    """
    fn = "infonce"
    check_reduction(fn, reduction)
    check_temperature(fn, temperature)
    _check_float(fn, "query", query, 2, "(N, D)")
    _check_float(fn, "key", key, 2, "(M, D) with M >= N")
    n, d = query.shape
    m = key.shape[0]
    if n == 0:
        raise ValueError(f"{fn}: `query` is empty, got shape {_shape(query)}")
    if key.shape[1] != d or m < n:
        raise ValueError(
            f"{fn}: `key` must have shape (M, D) with M >= N and the D of `query`; "
            f"got query {_shape(query)} and key {_shape(key)}"
        )
    detail = f"query {_shape(query)} and key {_shape(key)}"
    positive_offset = _check_offset(fn, positive_offset, n, m, detail)
    if negatives is not None:
        _check_float(fn, "negatives", negatives, 2, "(K, D)")
        if negatives.shape[1] != d:
            raise ValueError(
                f"{fn}: `negatives` must have shape (K, D) with the D of `query`; "
                f"got query {_shape(query)} and negatives {_shape(negatives)}"
            )
    if symmetric and (negatives is not None or m != n):
        raise ValueError(
            f"{fn}: `symmetric=True` needs negatives=None and as many keys as queries; got "
            f"{detail} and negatives {_shape(negatives)} (compose two calls instead)"
        )

    with _full_precision(query.device):
        dtype = _math_dtype(query, key, negatives)
        q = _embed(query, dtype, normalize)
        k = _embed(key, dtype, normalize)
        if negatives is not None:
            neg = _embed(negatives, dtype, normalize)
            l_pos = (q * k.narrow(0, positive_offset, n)).sum(dim=1, keepdim=True)  # N x 1
            l_neg = q @ neg.T  # N x K
            logits = torch.cat([l_pos, l_neg], dim=1) / temperature
            target = torch.zeros(n, dtype=torch.long, device=q.device)
            loss = F.cross_entropy(logits, target, reduction="none")
        else:
            logits = q @ k.T / temperature  # N x M
            target = torch.arange(n, device=q.device) + positive_offset
            loss = F.cross_entropy(logits, target, reduction="none")
            if symmetric:
                loss = (loss + F.cross_entropy(logits.T, target, reduction="none")) / 2
    return _reduce(loss, reduction)


# --------------------------------------------------------------------------- NT-Xent and DCL


def _two_view_logits(
    fn: str,
    z1: Tensor,
    z2: Tensor,
    z1_all: Tensor | None,
    z2_all: Tensor | None,
    positive_offset: int,
    temperature: float | Tensor,
    normalize: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Logits (2n, 2M) of the 2n local anchors against the 2M candidates, plus the column of
    each anchor itself and the column of its positive, both (2n, 1).

    Anchor a < n is z1[a] (global row positive_offset + a of z1_all); anchor n + a is z2[a].
    Candidate c < M is z1_all[c]; candidate M + c is z2_all[c].
    """
    check_temperature(fn, temperature)
    _check_float(fn, "z1", z1, 2, "(N, D)")
    _check_float(fn, "z2", z2, 2, "(N, D)")
    if z1.shape != z2.shape or z1.shape[0] == 0:
        raise ValueError(
            f"{fn}: `z1` and `z2` must have the same non-empty shape (N, D); "
            f"got z1 {_shape(z1)} and z2 {_shape(z2)}"
        )
    n, d = z1.shape
    if (z1_all is None) != (z2_all is None):
        raise ValueError(
            f"{fn}: pass both `z1_all` and `z2_all` (gathered from all processes) or neither; "
            f"got z1_all {_shape(z1_all)} and z2_all {_shape(z2_all)}"
        )
    if z1_all is None or z2_all is None:
        if positive_offset != 0:
            raise ValueError(
                f"{fn}: `positive_offset`={positive_offset!r} needs `z1_all` and `z2_all`; "
                "without them it must be 0"
            )
        z1_all, z2_all = z1, z2
    else:
        _check_float(fn, "z1_all", z1_all, 2, "(M, D)")
        _check_float(fn, "z2_all", z2_all, 2, "(M, D)")
        if z1_all.shape != z2_all.shape or z1_all.shape[1] != d or z1_all.shape[0] < n:
            raise ValueError(
                f"{fn}: `z1_all` and `z2_all` must have the same shape (M, D) with M >= N and "
                f"the D of `z1`; got z1 {_shape(z1)}, z1_all {_shape(z1_all)}, "
                f"z2_all {_shape(z2_all)}"
            )
    m = z1_all.shape[0]
    detail = f"z1 {_shape(z1)} and z1_all {_shape(z1_all)}"
    positive_offset = _check_offset(fn, positive_offset, n, m, detail)

    dtype = _math_dtype(z1, z2, z1_all, z2_all)
    anchors = torch.cat([_embed(z1, dtype, normalize), _embed(z2, dtype, normalize)])
    if z1_all is z1 and z2_all is z2:
        candidates = anchors
    else:
        candidates = torch.cat([_embed(z1_all, dtype, normalize), _embed(z2_all, dtype, normalize)])
    logits = anchors @ candidates.T / temperature  # 2n x 2M

    local = torch.arange(n, device=z1.device) + positive_offset
    self_col = torch.cat([local, local + m])[:, None]
    pos_col = torch.cat([local + m, local])[:, None]
    return logits, self_col, pos_col


def ntxent(
    z1: Tensor,
    z2: Tensor,
    *,
    temperature: float | Tensor = 0.1,
    normalize: bool = True,
    reduction: str = "mean",
    z1_all: Tensor | None = None,
    z2_all: Tensor | None = None,
    positive_offset: int = 0,
) -> Tensor:
    r"""NT-Xent, SimCLR's normalised temperature-scaled cross-entropy (Chen et al., "A Simple
    Framework for Contrastive Learning of Visual Representations", ICML 2020, eq. 1).

    The 2N views z = [z1; z2] are the anchors; anchor i's positive is the other view of the same
    sample and its 2N - 2 negatives are all the other views:

    .. math::
        \ell_i = -\log \frac{\exp(\cos(z_i, z_{p(i)}) / \tau)}
                           {\sum_{k \ne i} \exp(\cos(z_i, z_k) / \tau)},
        \qquad L = \frac{1}{2N} \sum_{i=1}^{2N} \ell_i

    Several processes: pass the local views ``z1``, ``z2`` (N rows each), the views gathered from
    all processes WITH gradient ``z1_all``, ``z2_all`` (M = N * world_size rows, the rows of this
    process at ``positive_offset = N * rank``)::

        ntxent(z1, z2, z1_all=gather_with_grad(z1), z2_all=gather_with_grad(z2),
               positive_offset=z1.shape[0] * rank)

    Each process then computes the loss of its 2N local anchors against all 2M views. With a
    gather whose backward sums the gradients of all processes and DDP averaging the parameter
    gradients, the loss and gradients equal those of one process with the whole batch.

    Args:
        z1: (N, D) first views.
        z2: (N, D) second views; (z1[i], z2[i]) is a positive pair.
        temperature: tau > 0 (0.1 in the paper; 0.5 in most CIFAR recipes).
        normalize: L2-normalise the inputs (cosine similarity) first.
        reduction: "mean" | "sum" | "none".
        z1_all: (M, D) ``z1`` of all processes (gathered with gradient), or None.
        z2_all: (M, D) ``z2`` of all processes, or None.
        positive_offset: row of ``z1_all`` / ``z2_all`` holding ``z1[0]`` / ``z2[0]``.

    Returns:
        A scalar (mean over the 2N local anchors), or with ``reduction="none"`` an (N, 2) tensor:
        column 0 the loss of anchor z1[i], column 1 that of anchor z2[i].
    """
    fn = "ntxent"
    check_reduction(fn, reduction)
    with _full_precision(z1.device if isinstance(z1, Tensor) else torch.device("cpu")):
        logits, self_col, pos_col = _two_view_logits(
            fn, z1, z2, z1_all, z2_all, positive_offset, temperature, normalize
        )
        logits = logits.scatter(1, self_col, float("-inf"))  # an anchor is not its own negative
        loss = F.cross_entropy(logits, pos_col[:, 0], reduction="none")
    return _reduce(loss.view(2, -1).T, reduction)


def dcl(
    z1: Tensor,
    z2: Tensor,
    *,
    temperature: float | Tensor = 0.1,
    normalize: bool = True,
    reduction: str = "mean",
    z1_all: Tensor | None = None,
    z2_all: Tensor | None = None,
    positive_offset: int = 0,
) -> Tensor:
    r"""Decoupled contrastive loss, DCL (Yeh et al., "Decoupled Contrastive Learning", ECCV 2022,
    arXiv 2110.06848, eq. 6): NT-Xent with the positive removed from the denominator.

    .. math::
        \ell_i = -\cos(z_i, z_{p(i)}) / \tau
                 + \log \sum_{k \ne i, k \ne p(i)} \exp(\cos(z_i, z_k) / \tau),
        \qquad L = \frac{1}{2N} \sum_{i=1}^{2N} \ell_i

    The values can be negative. Same shapes, options and multi-process arguments as
    :func:`ntxent`; at least 2 samples in total are needed (2M - 2 >= 1 negatives). The paper's
    weighted variant is :func:`dclw`.

    Args:
        z1: (N, D) first views.
        z2: (N, D) second views.
        temperature: tau > 0 (0.1 default).
        normalize: L2-normalise the inputs first.
        reduction: "mean" | "sum" | "none".
        z1_all, z2_all: (M, D) views of all processes gathered with gradient, or None.
        positive_offset: row of ``z1_all`` / ``z2_all`` holding ``z1[0]`` / ``z2[0]``.

    Returns:
        A scalar, or (N, 2) per-anchor losses with ``reduction="none"`` (as :func:`ntxent`).
    """
    return _decoupled(
        "dcl", z1, z2, temperature, None, normalize, reduction, z1_all, z2_all, positive_offset
    )


def dclw(
    z1: Tensor,
    z2: Tensor,
    *,
    temperature: float | Tensor = 0.1,
    sigma: float = 0.5,
    detach_weight: bool = False,
    normalize: bool = True,
    reduction: str = "mean",
    z1_all: Tensor | None = None,
    z2_all: Tensor | None = None,
    positive_offset: int = 0,
) -> Tensor:
    r"""DCLW, decoupled contrastive loss with the negative von Mises-Fisher weighting of the
    positive term (Yeh et al., "Decoupled Contrastive Learning", ECCV 2022, arXiv 2110.06848,
    sec. 4 "DCLW"):

    .. math::
        \ell_i = -w_i \cos(z_i, z_{p(i)}) / \tau
                 + \log \sum_{k \ne i, k \ne p(i)} \exp(\cos(z_i, z_k) / \tau),
        \qquad w_i = 2 - \frac{\exp(\cos(z^1_i, z^2_i) / \sigma)}
                               {\frac{1}{M} \sum_{k=1}^{M} \exp(\cos(z^1_k, z^2_k) / \sigma)}

    i.e. ``w = 2 - M * softmax(cos(z1, z2) / sigma)`` over the M positive pairs of the batch
    (the same w_i for both views of sample i, so the weights average to 1): easy positives
    (high similarity) get less weight than hard ones. sigma = 0.5 is the default of the
    implementation lightly cites (github.com/raminnakhli/Decoupled-Contrastive-
    Learning, ``loss/dcl.py``: ``2 - N * softmax((z1 * z2).sum(1) / sigma)``) and of lightly's
    ``DCLWLoss`` (the paper's own sigma was not read: see :mod:`contrastive.methods.dcl`).
    Whether gradients flow through w is not checked against the paper: that implementation lets
    them (our default); lightly detaches w (``detach_weight=True``).

    Several processes: the mean in w runs over the GLOBAL batch ``z1_all`` / ``z2_all`` (M rows),
    so that 2 processes equal 1 with the same global batch (lightly weighs each process's local
    batch instead). Otherwise as :func:`dcl`.

    Args:
        z1: (N, D) first views.
        z2: (N, D) second views.
        temperature: tau > 0 (0.1 default).
        sigma: the weighting's concentration sigma > 0 (0.5, lightly's default).
        detach_weight: stop the gradient through w (lightly's choice).
        normalize: L2-normalise the inputs first (the weights use the same vectors).
        reduction: "mean" | "sum" | "none".
        z1_all, z2_all: (M, D) views of all processes gathered with gradient, or None.
        positive_offset: row of ``z1_all`` / ``z2_all`` holding ``z1[0]`` / ``z2[0]``.

    Returns:
        A scalar, or (N, 2) per-anchor losses with ``reduction="none"`` (as :func:`ntxent`).
    """
    if (
        isinstance(sigma, bool)
        or not isinstance(sigma, (int, float))
        or not math.isfinite(sigma)
        or sigma <= 0
    ):
        raise ValueError(
            f"dclw: `sigma` must be a finite number > 0 (0.5 is usual), got {sigma!r}"
        )
    return _decoupled(
        "dclw", z1, z2, temperature, (float(sigma), detach_weight), normalize, reduction,
        z1_all, z2_all, positive_offset,
    )


def _decoupled(
    fn: str,
    z1: Tensor,
    z2: Tensor,
    temperature: float | Tensor,
    weighting: tuple[float, bool] | None,
    normalize: bool,
    reduction: str,
    z1_all: Tensor | None,
    z2_all: Tensor | None,
    positive_offset: int,
) -> Tensor:
    """DCL (``weighting=None``) or DCLW (``weighting=(sigma, detach_weight)``)."""
    check_reduction(fn, reduction)
    with _full_precision(z1.device if isinstance(z1, Tensor) else torch.device("cpu")):
        logits, self_col, pos_col = _two_view_logits(
            fn, z1, z2, z1_all, z2_all, positive_offset, temperature, normalize
        )
        if logits.shape[1] < 4:
            raise ValueError(
                f"{fn}: needs at least 2 samples in total so that every anchor has a negative; "
                f"got z1 {_shape(z1)} and z1_all {_shape(z1_all)}"
            )
        positive = logits.gather(1, pos_col)[:, 0]
        if weighting is not None:
            w = _vmf_weight(
                z1, z2, z1_all, z2_all, positive_offset, weighting[0], normalize, logits.dtype
            )
            positive = positive * (w.detach() if weighting[1] else w).repeat(2)
        negatives = logits.scatter(1, torch.cat([self_col, pos_col], dim=1), float("-inf"))
        loss = torch.logsumexp(negatives, dim=1) - positive
    return _reduce(loss.view(2, -1).T, reduction)


def _vmf_weight(
    z1: Tensor,
    z2: Tensor,
    z1_all: Tensor | None,
    z2_all: Tensor | None,
    positive_offset: int,
    sigma: float,
    normalize: bool,
    dtype: torch.dtype,
) -> Tensor:
    """DCLW's weights (N,) of the local pairs: ``2 - M softmax(cos(z1_all, z2_all) / sigma)``."""
    a = _embed(z1 if z1_all is None else z1_all, dtype, normalize)
    b = _embed(z2 if z2_all is None else z2_all, dtype, normalize)
    m = a.shape[0]
    w = 2 - m * torch.softmax((a * b).sum(dim=1) / sigma, dim=0)
    return w.narrow(0, positive_offset, z1.shape[0])


# --------------------------------------------------------------------------- SigLIP


def _check_scalar(fn: str, name: str, value: float | Tensor, positive: bool, hint: str) -> None:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{fn}: `{name}` tensor must hold one value, got shape {_shape(value)}")
        return  # no value check: reading it would synchronise the device
    bad = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad or not math.isfinite(value) or (positive and value <= 0):
        need = "a finite number > 0" if positive else "a finite number"
        raise ValueError(f"{fn}: `{name}` must be {need} ({hint}), got {value!r}")


def _check_siglip(image: Tensor, text: Tensor, scale: float | Tensor, bias: float | Tensor,
                  positives: bool, reduction: str) -> None:
    """:func:`siglip`'s argument checks (one-line ``ValueError`` s naming ``siglip``)."""
    fn = "siglip"
    check_reduction(fn, reduction)
    _check_scalar(fn, "scale", scale, True, "t = exp(t'), 10 at the paper's init")
    _check_scalar(fn, "bias", bias, False, "-10 at the paper's init")
    _check_float(fn, "image", image, 2, "(N, D)")
    _check_float(fn, "text", text, 2, "(M, D)")
    n, d = image.shape
    if n == 0 or text.shape[1] != d or (positives and text.shape[0] != n):
        need = "(N, D), the shape of `image`" if positives else "(M, D) with the D of `image`"
        raise ValueError(
            f"{fn}: `image` must be a non-empty (N, D) and `text` {need}; "
            f"got image {_shape(image)} and text {_shape(text)}"
        )


def siglip(
    image: Tensor,
    text: Tensor,
    *,
    scale: float | Tensor = 10.0,
    bias: float | Tensor = -10.0,
    normalize: bool = True,
    positives: bool = True,
    reduction: str = "mean",
) -> Tensor:
    r"""SigLIP's pairwise sigmoid loss (Zhai et al., "Sigmoid Loss for Language Image
    Pre-Training", ICCV 2023, arXiv 2303.15343, eq. 1 and Algorithm 1):

    .. math::
        L = -\frac{1}{N} \sum_{i=1}^{N} \sum_{j=1}^{M}
            \log \sigma\big(z_{ij} (t\, x_i \cdot y_j + b)\big),
        \qquad z_{ij} = 1 \text{ if } i = j \text{ else } -1

    with x, y the L2-normalised image and text embeddings, the scale t = exp(t') and the bias b
    (learnable in the paper, initialised t' = log 10, b = -10: the paper's sec. 3.2 and Algorithm
    1; big_vision's SigLIP configs ``config.model.temperature_init = 10.0``,
    ``config.model.bias_init = -10.0``, the model learning log t; open_clip 3.3's
    ``open_clip_train/main.py`` with ``--siglip``: ``init_logit_scale = np.log(10)``,
    ``init_logit_bias = -10``).
    Every image-text pair is an independent binary classification: no softmax over the batch.
    The paper's loss sums over j and averages over i (``-sum(log_sigmoid(z * logits)) / N`` in
    Algorithm 1 and in open_clip's ``SigLipLoss``).

    Several processes, exactly and without the full similarity matrix: :func:`siglip_ring`
    (the paper's sec. 3.3, open_clip's ``neighbour_exchange``) adds to ``siglip(x, y)`` on the
    local pairs ``siglip(x, y_other, positives=False)`` for the text chunk of every other
    process (all negatives), each over the same local N; the mean over processes is the
    one-process loss on the whole batch.

    Args:
        image: (N, D) image embeddings x.
        text: (M, D) text embeddings y; with ``positives=True`` M == N and (x_i, y_i) are the
            positive pairs.
        scale: t > 0 (a float or a scalar tensor such as ``log_scale.exp()``; 10 at init).
        bias: b (a float or a scalar tensor; -10 at init).
        normalize: L2-normalise the inputs first (the paper does).
        positives: False when ``text`` holds no positive of any image (another process's chunk):
            every z_ij is then -1.
        reduction: "mean" | "sum" | "none".

    Returns:
        A scalar (mean over the N images of their row sums), or with ``reduction="none"`` the
        (N,) row sums ``-sum_j log sigma(z_ij (t x_i . y_j + b))``.
    """
    _check_siglip(image, text, scale, bias, positives, reduction)
    n = image.shape[0]
    with _full_precision(image.device):
        dtype = _math_dtype(image, text)
        x = _embed(image, dtype, normalize)
        y = _embed(text, dtype, normalize)
        logits = x @ y.T * scale + bias  # N x M
        if positives:
            sign = 2 * torch.eye(n, dtype=logits.dtype, device=logits.device) - 1
            logits = logits * sign
        else:
            logits = -logits
        loss = -F.logsigmoid(logits).sum(dim=1)
    return _reduce(loss, reduction)


class _RingShift(torch.autograd.Function):
    """Send a tensor to the next rank and receive the previous rank's, keeping the graph: the
    backward sends the received tensor's gradient back to the rank it came from."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor) -> Tensor:
        return _shift(tensor.contiguous(), +1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _shift(grad.contiguous(), -1)


def _shift(tensor: Tensor, step: int) -> Tensor:
    world, rank = dist.get_world_size(), dist.get_rank()
    received = torch.empty_like(tensor)
    ops = [
        dist.P2POp(dist.isend, tensor, (rank + step) % world),
        dist.P2POp(dist.irecv, received, (rank - step) % world),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


def _ring_shift(tensor: Tensor) -> Tensor:
    return _RingShift.apply(tensor)


def siglip_ring(
    image: Tensor,
    text: Tensor,
    *,
    scale: float | Tensor = 10.0,
    bias: float | Tensor = -10.0,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    """SigLIP on several processes, exact, without gathering the batch (the paper's sec. 3.3
    "efficient loss implementation"; open_clip's ``SigLipLoss`` with ``dist_impl="shift"``).

    Each process scores its N images against its own N texts (the positives) and then, W - 1
    times, passes the text chunk it holds to the next rank and receives the previous rank's
    (all negatives), adding :func:`siglip` of each chunk: only an N x N block is ever in memory.
    The exchange is autograd-aware: each chunk's gradient travels back round the ring to its
    process. With DDP averaging the gradients, the mean of the per-process losses and its
    gradients equal the one-process loss on the whole batch (all processes need the same N).
    Without a process group it is :func:`siglip` itself. Arguments as :func:`siglip`; with
    ``reduction="none"`` the (N,) row sums over the whole global batch of texts.

    With ``normalize=True`` each process normalises its images and texts once, before the
    exchange, and the ring passes the unit texts (in the loss's float32 / float64): the loss of
    normalising every chunk on arrival, its gradients up to rounding (one normalisation's
    backward of the summed gradient instead of a sum of W), W - 1 fewer normalisations.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return siglip(image, text, scale=scale, bias=bias, normalize=normalize,
                      reduction=reduction)
    if normalize:
        _check_siglip(image, text, scale, bias, True, reduction)  # before casting the inputs
        with _full_precision(image.device):
            dtype = _math_dtype(image, text)
            image, text = _embed(image, dtype, True), _embed(text, dtype, True)
    loss = siglip(image, text, scale=scale, bias=bias, normalize=False, reduction=reduction)
    chunk = text
    for _ in range(dist.get_world_size() - 1):
        chunk = _ring_shift(chunk)
        loss = loss + siglip(
            image, chunk, scale=scale, bias=bias, normalize=False, positives=False,
            reduction=reduction,
        )
    return loss


# --------------------------------------------------------------------------- COS-NCE


def cosnce(
    student: Tensor,
    teacher: Tensor,
    negatives: Tensor | None = None,
    *,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    r"""COS-NCE, the angular contrastive distillation loss of LRC-BERT (Fu et al., "LRC-BERT:
    Latent-representation Contrastive Knowledge Distillation for Natural Language
    Understanding", AAAI 2021, arXiv 2012.07335).

    With the angular distance g(x, y) = 1 - cos(x, y) in [0, 2], the student representation
    z_S, the teacher representation of the same input z_T and K negatives n_1..n_K:

    .. math::
        L = \frac{2K - \left(\sum_{k=1}^{K} g(n_k, z_S) - K\,g(z_T, z_S)\right)}{2K}
            + g(z_T, z_S)
          = \frac{1}{K}\sum_k \frac{2 - (g(n_k, z_S) - g(z_T, z_S))}{2} + g(z_T, z_S)

    It pulls z_S toward z_T in angle and pushes it away from the negatives; its minimum is 0
    (z_S = z_T, every negative opposite). The paper states the objective as minimising
    2 - (g(n_i, z_S) - g(z_T, z_S)); the normalisation above (divide by 2K, add g(z_T, z_S)) is
    the one of a public reimplementation and is our reference.

    With ``normalize=False`` the inputs must already have unit norm and g(x, y) = 1 - x . y.

    Args:
        student: (N, D) student representations (project them to the teacher's D first).
        teacher: (N, D) teacher representations of the same inputs.
        negatives: (N, K, D) per-sample negatives, (K, D) negatives shared by all samples (a
            memory of teacher features), or None: the other teacher rows of the batch (K = N - 1,
            so N >= 2).
        normalize: use cosine similarity (True) or plain dot products of unit vectors (False).
        reduction: "mean" | "sum" | "none".

    Returns:
        A scalar, or (N,) per-sample losses with ``reduction="none"``.
    """
    fn = "cosnce"
    check_reduction(fn, reduction)
    _check_float(fn, "student", student, 2, "(N, D)")
    _check_float(fn, "teacher", teacher, 2, "(N, D)")
    if student.shape != teacher.shape or student.shape[0] == 0:
        raise ValueError(
            f"{fn}: `student` and `teacher` must have the same non-empty shape (N, D); "
            f"got student {_shape(student)} and teacher {_shape(teacher)}"
        )
    n, d = student.shape
    if negatives is None:
        if n < 2:
            raise ValueError(
                f"{fn}: with negatives=None the negatives are the other teacher rows, so N >= 2 "
                f"is needed; got student {_shape(student)} (pass `negatives` explicitly)"
            )
    else:
        if not isinstance(negatives, Tensor) or negatives.dim() not in (2, 3):
            raise ValueError(
                f"{fn}: `negatives` must have shape (N, K, D) or (K, D), got {_shape(negatives)}"
            )
        _check_float(fn, "negatives", negatives, negatives.dim(), "(N, K, D) or (K, D)")
        per_sample = negatives.dim() == 3
        bad = negatives.shape[-1] != d or negatives.shape[-2] == 0
        if bad or (per_sample and negatives.shape[0] != n):
            raise ValueError(
                f"{fn}: `negatives` must have shape (N, K, D) or (K, D) with K >= 1 and the N, D "
                f"of `student`; got student {_shape(student)} and negatives {_shape(negatives)}"
            )

    with _full_precision(student.device):
        dtype = _math_dtype(student, teacher, negatives)
        s = _embed(student, dtype, normalize)
        t = _embed(teacher, dtype, normalize)
        g_pos = 1 - (s * t).sum(dim=1)  # N
        if negatives is None:
            off_diagonal = ~torch.eye(n, dtype=torch.bool, device=s.device)
            g_neg = (1 - s @ t.T).masked_fill(~off_diagonal, 0)  # N x N, row i: negatives of i
            g_neg_mean = g_neg.sum(dim=1) / (n - 1)
        elif negatives.dim() == 2:
            g_neg_mean = (1 - s @ _embed(negatives, dtype, normalize).T).mean(dim=1)
        else:
            neg = _embed(negatives, dtype, normalize)
            g_neg_mean = (1 - torch.einsum("nd,nkd->nk", s, neg)).mean(dim=1)
        loss = (2 - (g_neg_mean - g_pos)) / 2 + g_pos
    return _reduce(loss, reduction)


# --------------------------------------------------------------------------- SupCon


def supcon(
    features: Tensor,
    labels: Tensor | None = None,
    *,
    temperature: float | Tensor = 0.1,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    r"""Supervised contrastive loss, the L^sup_out form of Khosla et al., "Supervised Contrastive
    Learning", NeurIPS 2020 (eq. 2).

    The N * V views are the anchors. For anchor i, A(i) are all other views and P(i) the views in
    A(i) with the label of i (the other views of the same sample included):

    .. math::
        \ell_i = \frac{-1}{|P(i)|} \sum_{p \in P(i)}
                 \log \frac{\exp(z_i \cdot z_p / \tau)}{\sum_{a \in A(i)} \exp(z_i \cdot z_a / \tau)},
        \qquad L = \frac{1}{NV} \sum_i \ell_i

    Differences from the official code, on purpose: no ``temperature / base_temperature``
    factor (it only rescales the loss); an anchor without any positive (V = 1 and a label seen
    once) has loss 0 and still counts in the mean (the official code divides by zero there).
    With ``labels=None`` every sample is its own class (SimCLR-like, 2N-2 negatives for V=2).

    Args:
        features: (N, V, D) V views of N samples.
        labels: (N,) integer class labels, or None.
        temperature: tau > 0 (0.1 default, as in the paper).
        normalize: L2-normalise the features first.
        reduction: "mean" | "sum" | "none".

    Returns:
        A scalar, or (N, V) per-view losses with ``reduction="none"``.
    """
    fn = "supcon"
    check_reduction(fn, reduction)
    check_temperature(fn, temperature)
    _check_float(fn, "features", features, 3, "(N, V, D)")
    n, v, d = features.shape
    if n * v < 2 or d == 0:
        raise ValueError(
            f"{fn}: `features` needs at least 2 views in total and D >= 1, got {_shape(features)}"
        )
    if labels is not None:
        if not isinstance(labels, Tensor) or labels.shape != (n,) or labels.is_floating_point():
            raise ValueError(
                f"{fn}: `labels` must be an integer tensor of shape (N,) = ({n},) matching "
                f"`features` {_shape(features)}; got {_shape(labels) if isinstance(labels, Tensor) else labels!r}"
                f"{' of dtype ' + str(labels.dtype) if isinstance(labels, Tensor) else ''}"
            )
        labels = labels.to(features.device)
    else:
        labels = torch.arange(n, device=features.device)

    with _full_precision(features.device):
        z = _embed(features, _math_dtype(features), normalize).reshape(n * v, d)  # sample-major
        view_labels = labels.repeat_interleave(v)
        self_mask = torch.eye(n * v, dtype=torch.bool, device=z.device)
        pos_mask = (view_labels[:, None] == view_labels[None, :]) & ~self_mask
        logits = z @ z.T / temperature  # NV x NV
        log_denominator = torch.logsumexp(logits.masked_fill(self_mask, float("-inf")), dim=1)
        log_prob = logits - log_denominator[:, None]
        num_pos = pos_mask.sum(dim=1)
        loss = -log_prob.masked_fill(~pos_mask, 0).sum(dim=1) / num_pos.clamp(min=1)
    return _reduce(loss.view(n, v), reduction)


# --------------------------------------------------------------------------- KD


def kd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    temperature: float | Tensor = 1.0,
    reduction: str = "mean",
) -> Tensor:
    r"""Knowledge-distillation soft loss (Hinton et al., "Distilling the Knowledge in a Neural
    Network", 2015): KL(teacher || student) of the temperature-softened distributions, scaled by
    t^2 so that its gradients keep their size when t changes.

    .. math::
        L_i = t^2 \sum_c p^T_{ic} (\log p^T_{ic} - \log p^S_{ic}),
        \qquad p^T = \mathrm{softmax}(\text{teacher\_logits} / t),\;
        p^S = \mathrm{softmax}(\text{student\_logits} / t)

    The batch mean of L_i with ``reduction="mean"`` (``KLDivLoss(reduction="batchmean")``).
    Works on logits and never normalises. LRC-BERT uses t = 1.1. Detach the teacher yourself.

    Args:
        student_logits: (N, C).
        teacher_logits: (N, C).
        temperature: t > 0 (1.0 default).
        reduction: "mean" | "sum" | "none".

    Returns:
        A scalar, or (N,) per-sample values with ``reduction="none"``.
    """
    fn = "kd"
    check_reduction(fn, reduction)
    check_temperature(fn, temperature)
    _check_float(fn, "student_logits", student_logits, 2, "(N, C)")
    _check_float(fn, "teacher_logits", teacher_logits, 2, "(N, C)")
    if student_logits.shape != teacher_logits.shape or student_logits.numel() == 0:
        raise ValueError(
            f"{fn}: `student_logits` and `teacher_logits` must have the same non-empty shape "
            f"(N, C); got {_shape(student_logits)} and {_shape(teacher_logits)}"
        )
    with _full_precision(student_logits.device):
        dtype = _math_dtype(student_logits, teacher_logits)
        log_p_student = F.log_softmax(student_logits.to(dtype) / temperature, dim=1)
        log_p_teacher = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=1)
        kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(dim=1)
        loss = kl * temperature**2
    return _reduce(loss, reduction)
