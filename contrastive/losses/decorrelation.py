"""Batch-level decorrelation losses: Barlow Twins, VICReg and VICRegL's local loss (torch only).

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

__all__ = ["BarlowTwinsLoss", "VICRegLLocalLoss", "VICRegLoss", "barlow_twins", "crop_grid",
           "feature_matches", "location_matches", "nearest_matches", "vicreg", "vicreg_terms",
           "vicregl_global_terms", "vicregl_local", "vicregl_local_terms"]


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
        invariance = (a - b).pow(2).mean()
        a, b = a - a.mean(dim=0), b - b.mean(dim=0)
        va, vb = (_variance_term(x, eps) for x in (a, b))
        ca, cb = (_covariance_term(x) for x in (a, b))
        variance, covariance = (va + vb) / 2, ca + cb
        return invariance, variance, covariance


def _variance_term(x: Tensor, eps: float) -> Tensor:
    """``mean relu(1 - sqrt(Var + eps))`` of the centred ``x`` (N, D), or (N, K, D): one
    variance per slot k and dimension, all averaged (VICRegL's local term)."""
    return torch.relu(1 - torch.sqrt(x.var(dim=0) + eps)).mean()


def _covariance_term(x: Tensor) -> Tensor:
    """``sum_{i != j} Cov_ij^2 / D`` of the centred ``x`` (N, D); of (N, K, D), one (D, D)
    covariance per slot k over the batch, the K values averaged (VICRegL's local term)."""
    n, d = x.shape[0], x.shape[-1]
    if x.dim() == 2:
        return _off_diagonal(x.T @ x / (n - 1)).pow(2).sum() / d
    # per slot: ||C||_F^2 - sum_c C_cc^2, and ||X^T X||_F = ||X X^T||_F, so the smaller of the
    # (N, N) and (D, D) products serves; no K x D x D mask copy (10x faster at K 20, N 64, D 512)
    xk = x.transpose(0, 1)                                            # K x N x D
    prod = xk @ xk.transpose(1, 2) if n < d else xk.transpose(1, 2) @ xk  # K x min(N,D) x min
    total = prod.pow(2).sum(dim=(1, 2))                               # K: (n-1)^2 ||C_k||_F^2
    diagonal = xk.pow(2).sum(dim=1).pow(2).sum(dim=1)                 # K: (n-1)^2 sum_c C_kcc^2
    return ((total - diagonal) / ((n - 1) ** 2 * d)).mean()


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
    """Barlow Twins; see :func:`barlow_twins`. ``forward(z1 (N, D), z2 (N, D))`` -> scalar.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> z = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])  # decorrelated columns
        >>> round(get_loss("barlow_twins")(z, z).item(), 6)  # cross-correlation = identity: nothing to pay
        0.0
        >>> get_loss("barlow_twins")(z, z[:, [1, 0]]) > 1  # swapped dimensions: the diagonal at 0 costs 2
        tensor(True)
    """

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
    """VICReg; see :func:`vicreg`. ``forward(z1 (N, D), z2 (N, D))`` -> scalar.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> z = 2 * torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
        >>> get_loss("vicreg")(z, z)  # equal views, std > 1, no covariance: every term 0
        tensor(0.)
        >>> get_loss("vicreg")(z / 4, z / 4)  # std 0.577 < 1: the variance hinge 25 (1 - 0.577)
        tensor(10.5641)
    """

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


# --- VICRegL ---------------------------------------------------------------------------------
# Bardes, Ponce, LeCun, "VICRegL: Self-Supervised Learning of Local Visual Features", NeurIPS
# 2022 (arXiv 2210.01571); the authors' code is facebookresearch/VICRegL, main_vicregl.py
# (line numbers of its commit 803ae4c below).


def crop_grid(boxes: Tensor, height: int, width: int) -> Tensor:
    """Where each cell of a ``height x width`` feature map sits in the ORIGINAL image: the
    centres of a height x width grid over each crop box (the code's ``_location_to_NxN_grid``,
    transforms.py 209-240, for a square map), row-major as a flattened map.

    Args:
        boxes: (N, 4) crop boxes (top, left, h, w) in pixels of the original image.
    Returns:
        (N, height * width, 2) float (row, column) centres.
    """
    _check_float("crop_grid", "boxes", boxes, 2, "(N, 4)")
    if boxes.shape[1] != 4:
        raise ValueError(f"crop_grid: `boxes` must be (N, 4) rows (top, left, h, w), got "
                         f"{_shape(boxes)}")
    top, left, h, w = boxes.unbind(dim=1)
    rows = torch.arange(height, dtype=boxes.dtype, device=boxes.device) + 0.5
    cols = torch.arange(width, dtype=boxes.dtype, device=boxes.device) + 0.5
    r = top[:, None] + rows[None] * (h / height)[:, None]  # N x H
    c = left[:, None] + cols[None] * (w / width)[:, None]  # N x W
    return torch.stack(torch.broadcast_tensors(r[:, :, None], c[:, None, :]), dim=3).flatten(1, 2)


def nearest_matches(distances: Tensor, num_matches: int | None = None) -> Tensor:
    """Each input location's nearest candidate, keeping the ``num_matches`` input locations
    whose nearest candidate is closest (the code's ``neirest_neighbores``, main_vicregl.py
    569-605: top-1 by ``topk``, then the closest ``num_matches``, kept in raster order).

    Args:
        distances: (N, S, T) distances from S input to T candidate locations of each sample.
        num_matches: how many input locations to keep; None = all S.
    Returns:
        (N, K, 2) int64 pairs (input location, its nearest candidate), K = num_matches or S.
    """
    n, s, _ = distances.shape
    k = s if num_matches is None else int(num_matches)
    if not 1 <= k <= s:
        raise ValueError(f"nearest_matches: `num_matches` must be in [1, {s}] (the input "
                         f"locations of the map), got {num_matches}")
    with torch.no_grad():
        nearest, candidate = (t.squeeze(2) for t in distances.topk(k=1, dim=2, largest=False))
        kept = torch.sort(torch.sort(nearest, dim=1).indices[:, :k], dim=1).values  # N x K
        return torch.stack([kept, candidate.gather(1, kept)], dim=2)


def location_matches(grid_a: Tensor, grid_b: Tensor, num_matches: int | None = None) -> Tensor:
    """Location-based matching: each location of view a to the location of view b nearest to
    it in the original image (grids from :func:`crop_grid`); see :func:`nearest_matches`.
    (N, S, 2), (N, T, 2) -> (N, K, 2) int64."""
    _check_float("location_matches", "grid_a", grid_a, 3, "(N, S, 2)")
    _check_float("location_matches", "grid_b", grid_b, 3, "(N, T, 2)")
    return nearest_matches(torch.cdist(grid_a.detach(), grid_b.detach()), num_matches)


def feature_matches(maps_a: Tensor, maps_b: Tensor, num_matches: int | None = None) -> Tensor:
    """Feature-based matching: each location of view a to the location of view b nearest in
    L2 distance of the embeddings (the code's ``neirest_neighbores_on_l2``; its default
    ``--l2_all_matches 1`` keeps all: ``num_matches=None``). (N, S, C), (N, T, C) -> (N, K, 2)."""
    return nearest_matches(torch.cdist(maps_a.detach(), maps_b.detach()), num_matches)


def _pick(maps: Tensor, index: Tensor) -> Tensor:
    """maps (N, S, C), index (N, K) -> (N, K, C)."""
    return torch.gather(maps, 1, index[:, :, None].expand(-1, -1, maps.shape[2]))


def _matched_terms(x: Tensor, y: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """The code's ``_vicreg_loss`` (main_vicregl.py 284-314) unweighted, on matched vectors
    (N, K, C): MSE, and the variance and covariance of each slot k over the batch, x's and y's
    halved."""
    invariance = (x - y).pow(2).mean()
    x, y = x - x.mean(dim=0), y - y.mean(dim=0)
    variance = (_variance_term(x, eps) + _variance_term(y, eps)) / 2
    covariance = (_covariance_term(x) + _covariance_term(y)) / 2
    return invariance, variance, covariance


def _check_matches(fn: str, name: str, m: Tensor, n: int) -> None:
    if m.dim() != 3 or m.shape[0] != n or m.shape[2] != 2 or m.dtype != torch.long:
        raise ValueError(f"{fn}: `{name}` must be int64 (N, K, 2) pairs with N = {n} "
                         f"(location_matches), got {m.dtype} {_shape(m)}")


def vicregl_local_terms(maps_a: Tensor, maps_b: Tensor, matches_ab: Tensor, matches_ba: Tensor,
                        *, feature_top: tuple[int, int] | None = None, eps: float = 1e-4,
                        reduction: str = "mean") -> tuple[Tensor, Tensor, Tensor]:
    """VICRegL's unweighted local invariance, variance and covariance of one pair of views
    (the code's ``_local_loss``, main_vicregl.py 316-377): feature-based and location-based
    matches, each in both directions; per kind the mean of the two directions, the two kinds
    summed.

    Args:
        maps_a, maps_b: (N, S, C), (N, T, C) local embeddings of the two views (the GLOBAL
            batch: variance and covariance are statistics over it).
        matches_ab, matches_ba: (N, K, 2) int64 location-based matches a -> b and b -> a
            (:func:`location_matches`; the code keeps 20 and 4).
        feature_top: keep the (a -> b, b -> a) closest feature matches; None = all (the code's
            default ``--l2_all_matches 1``).
    """
    fn = "vicregl_local"
    if reduction != "mean":
        raise ValueError(f"{fn}: `reduction` must be 'mean' (a batch-level loss has no "
                         f"per-sample values to return or sum), got {reduction!r}")
    _check_float(fn, "maps_a", maps_a, 3, "(N, S, C)")
    _check_float(fn, "maps_b", maps_b, 3, "(N, T, C)")
    n, _, c = maps_a.shape
    if maps_b.shape[0] != n or maps_b.shape[2] != c or n < 2:
        raise ValueError(f"{fn}: `maps_a` and `maps_b` must have the same N >= 2 and C, got "
                         f"{_shape(maps_a)} and {_shape(maps_b)}")
    _check_matches(fn, "matches_ab", matches_ab, n)
    _check_matches(fn, "matches_ba", matches_ba, n)
    top_ab, top_ba = feature_top if feature_top is not None else (None, None)
    with _full_precision(maps_a.device):
        dtype = _math_dtype(maps_a, maps_b)
        a, b = maps_a.to(dtype), maps_b.to(dtype)
        pairs = [(a, b, feature_matches(a, b, top_ab)), (b, a, feature_matches(b, a, top_ba)),
                 (a, b, matches_ab), (b, a, matches_ba)]
        terms = [_matched_terms(_pick(x, m[..., 0]), _pick(y, m[..., 1]), eps)
                 for x, y, m in pairs]
        # per kind (feature, location) the mean of its two directions; the kinds summed
        inv, var, cov = (sum(term[i] for term in terms) / 2 for i in range(3))
        return inv, var, cov  # type: ignore[return-value]


def vicregl_local(maps_a: Tensor, maps_b: Tensor, matches_ab: Tensor, matches_ba: Tensor, *,
                  inv_coeff: float = 25.0, var_coeff: float = 25.0, cov_coeff: float = 1.0,
                  feature_top: tuple[int, int] | None = None, eps: float = 1e-4,
                  reduction: str = "mean") -> Tensor:
    r"""VICRegL's local loss of one pair of views (arXiv 2210.01571; the code's
    ``_local_loss``): :func:`vicregl_local_terms` weighted (25, 25, 1), the code's
    ``--inv-coeff --var-coeff --cov-coeff`` (main_vicregl.py 63-65).

    Examples:
        >>> maps_a, maps_b = torch.randn(8, 49, 512), torch.randn(8, 49, 512)
        >>> boxes = torch.tensor([[0.0, 0.0, 100.0, 100.0]]).expand(8, 4)
        >>> grid_a = grid_b = crop_grid(boxes, 7, 7)
        >>> loss = vicregl_local(maps_a, maps_b, location_matches(grid_a, grid_b, 20),
        ...                      location_matches(grid_b, grid_a, 4))
    """
    inv, var, cov = vicregl_local_terms(maps_a, maps_b, matches_ab, matches_ba,
                                        feature_top=feature_top, eps=eps, reduction=reduction)
    return inv_coeff * inv + var_coeff * var + cov_coeff * cov


def vicregl_global_terms(embeddings: list[Tensor], *, eps: float = 1e-4
                         ) -> tuple[Tensor, Tensor, Tensor]:
    """VICRegL's unweighted global terms (the code's ``global_loss``, main_vicregl.py
    421-446): the MSE averaged over the pairs (i, j != i), i among the first two views; the
    variance and covariance averaged over all views (so, for two views, VICReg's covariance
    halved). ``embeddings``: per view (N, D), the global batch."""
    fn = "vicregl_global"
    if len(embeddings) < 2:
        raise ValueError(f"{fn}: needs at least two views, got {len(embeddings)}")
    for z in embeddings:
        _check_float(fn, "embeddings", z, 2, "(N, D)")
    with _full_precision(embeddings[0].device):
        dtype = _math_dtype(*embeddings)
        zs = [z.to(dtype) for z in embeddings]
        pairs = [(i, j) for i in range(2) for j in range(len(zs)) if j != i]
        inv = sum((zs[i] - zs[j]).pow(2).mean() for i, j in pairs) / len(pairs)
        centred = [z - z.mean(dim=0) for z in zs]
        var = sum(_variance_term(z, eps) for z in centred) / len(zs)
        cov = sum(_covariance_term(z) for z in centred) / len(zs)
        return inv, var, cov  # type: ignore[return-value]


@register_loss("vicregl_local", "vicregl")
class VICRegLLocalLoss(_BatchLevelLoss):
    """VICRegL's local loss; see :func:`vicregl_local`.

    ``forward(maps_a (N, S, C), maps_b (N, T, C), matches_ab (N, K1, 2), matches_ba (N, K2, 2))``
    -> scalar. The global part is VICReg's terms (:func:`vicregl_global_terms`);
    :class:`contrastive.methods.VICRegL` mixes them ``alpha * global + (1 - alpha) * local``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> g = torch.Generator().manual_seed(0)
        >>> maps_a, maps_b, ab, ba = get_loss("vicregl_local").example_inputs(n=4, dim=8, generator=g)
        >>> maps_a.shape, ab.shape  # (N, S, C) feature maps, (N, K, 2) matched locations
        (torch.Size([4, 2, 8]), torch.Size([4, 1, 2]))
        >>> loss = get_loss("vicregl_local")(maps_a, maps_b, ab, ba)
        >>> loss.shape, bool(loss.isfinite())
        (torch.Size([]), True)
    """

    def __init__(self, inv_coeff: float = 25.0, var_coeff: float = 25.0, cov_coeff: float = 1.0,
                 *, feature_top: tuple[int, int] | None = None, eps: float = 1e-4,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        for name, v in (("inv_coeff", inv_coeff), ("var_coeff", var_coeff),
                        ("cov_coeff", cov_coeff)):
            if not v >= 0:
                raise ValueError(f"VICRegLLocalLoss: `{name}` must be >= 0, got {v!r}")
        self.inv_coeff, self.var_coeff = float(inv_coeff), float(var_coeff)
        self.cov_coeff, self.eps = float(cov_coeff), float(eps)
        self.feature_top = None if feature_top is None else tuple(feature_top)

    def forward(self, maps_a: Tensor, maps_b: Tensor, matches_ab: Tensor,
                matches_ba: Tensor) -> Tensor:
        return vicregl_local(maps_a, maps_b, matches_ab, matches_ba, inv_coeff=self.inv_coeff,
                             var_coeff=self.var_coeff, cov_coeff=self.cov_coeff,
                             feature_top=self.feature_top, eps=self.eps)  # type: ignore[arg-type]

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """Two views' 1 x 2 maps (view b near view a; small: gradcheck perturbs every entry)
        and their location matches from random crop boxes of a 10 x 10 image (1 each way)."""
        maps_a = cls._randn(n, 2, dim, dtype=dtype, generator=generator)
        maps_b = maps_a + 0.5 * cls._randn(n, 2, dim, dtype=dtype, generator=generator)
        corner = torch.rand(2, n, 2, generator=generator) * 5
        side = 3 + torch.rand(2, n, 2, generator=generator) * 2
        grid_a, grid_b = (crop_grid(torch.cat([corner[v], side[v]], dim=1), 1, 2)
                          for v in range(2))
        return (maps_a, maps_b, location_matches(grid_a, grid_b, 1),
                location_matches(grid_b, grid_a, 1))

    def extra_repr(self) -> str:
        return (f"inv_coeff={self.inv_coeff}, var_coeff={self.var_coeff}, "
                f"cov_coeff={self.cov_coeff}, feature_top={self.feature_top}, eps={self.eps}")
