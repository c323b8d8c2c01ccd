"""DenseCL's dense contrastive loss (torch only).

Wang, Zhang, Shen, Kong, Li, "Dense Contrastive Learning for Self-Supervised Visual
Pre-Training", CVPR 2021 (arXiv 2011.09157), sec. 3.2-3.3, eq. 2-3; the authors' code is
WXinlong/DenseCL (``openselfsup/models/densecl.py``, ``DenseCL.forward_train``)::

    sim = normalize(q_backbone)^T @ normalize(k_backbone)      # N x S^2 x S^2, backbone features
    match = argmax over key locations of sim                     # N x S^2: the correspondence
    positive of query location s = k_grid[match[s]]              # dense projections
    loss = InfoNCE over the N * S^2 query locations (target 0), negatives = the dense queue

Every query location is one InfoNCE row; the code's cross-entropy averages all N * S^2 rows,
which equals the mean over samples of each sample's mean over its S^2 locations (what
``reduction="none"`` returns per sample).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import _check_float, _reduce, _shape, check_reduction, check_temperature, infonce
from .modules import _TemperatureLoss
from .registry import register_loss

__all__ = ["DenseInfoNCELoss", "dense_correspondence", "dense_infonce"]


def dense_correspondence(query_features: Tensor, key_features: Tensor) -> Tensor:
    """For each query location, the key location of the same image whose feature is the most
    cosine-similar: ``argmax_t cos(query_features[n, s], key_features[n, t])``.

    Args:
        query_features: (N, S, C) feature vectors of S query locations (the backbone's map,
            flattened; DenseCL matches on backbone features, not on the dense projections).
        key_features: (N, T, C) the key view's.

    Returns:
        (N, S) int64 indices into the T key locations (no gradient: the match is a choice).
    """
    fn = "dense_correspondence"
    _check_float(fn, "query_features", query_features, 3, "(N, S, C)")
    _check_float(fn, "key_features", key_features, 3, "(N, T, C)")
    if key_features.shape[0] != query_features.shape[0] or \
            key_features.shape[2] != query_features.shape[2]:
        raise ValueError(f"{fn}: both must have the same N and C, got {_shape(query_features)} "
                         f"and {_shape(key_features)}")
    with torch.no_grad():
        q = F.normalize(query_features.float(), dim=-1)
        k = F.normalize(key_features.float(), dim=-1)
        return torch.bmm(q, k.transpose(1, 2)).argmax(dim=2)


def dense_infonce(query: Tensor, key: Tensor, match: Tensor, negatives: Tensor | None = None, *,
                  temperature: float | Tensor = 0.2, normalize: bool = True,
                  reduction: str = "mean") -> Tensor:
    """InfoNCE of every query location against its matched key location.

    Args:
        query: (N, S, D) dense query projections.
        key: (N, T, D) dense key projections.
        match: (N, S) int64, the key location paired with each query location
            (:func:`dense_correspondence`).
        negatives: (K, D) shared negatives (DenseCL's dense queue); None = in-batch: the
            matched keys of every other location of the batch.
        temperature: tau > 0 (DenseCL: 0.2).
        normalize: L2-normalise query, key and negatives first.
        reduction: "mean" | "sum" over samples, or "none": (N,) each sample's mean over its S
            locations.
    """
    fn = "dense_infonce"
    check_reduction(fn, reduction)
    check_temperature(fn, temperature)
    _check_float(fn, "query", query, 3, "(N, S, D)")
    _check_float(fn, "key", key, 3, "(N, T, D)")
    n, s, d = query.shape
    if key.shape[0] != n or key.shape[2] != d:
        raise ValueError(f"{fn}: `key` must be (N, T, D) with the N and D of `query`, got "
                         f"query {_shape(query)} and key {_shape(key)}")
    if match.shape != (n, s) or match.dtype != torch.long:
        raise ValueError(f"{fn}: `match` must be int64 of shape ({n}, {s}), got "
                         f"{match.dtype} {_shape(match)}")
    positives = torch.gather(key, 1, match.unsqueeze(2).expand(-1, -1, d))  # N x S x D
    rows = infonce(query.reshape(n * s, d), positives.reshape(n * s, d), negatives,
                   temperature=temperature, normalize=normalize, reduction="none")
    return _reduce(rows.view(n, s).mean(dim=1), reduction)


@register_loss("densecl", "dense_infonce")
class DenseInfoNCELoss(_TemperatureLoss):
    """DenseCL's dense loss; see :func:`dense_infonce`.

    ``forward(query (N, S, D), key (N, T, D), match (N, S), negatives (K, D) | None = None)``.

    Examples:
        >>> import torch
        >>> from contrastive.losses import get_loss
        >>> query = torch.eye(2).expand(1, 2, 2)  # (N, S, D): 2 query locations
        >>> key = query.flip(1)  # the key view's locations in the other order
        >>> match = torch.tensor([[1, 0]])  # (N, S): query location s matches key location match[s]
        >>> get_loss("densecl", temperature=1.0)(query, key, match)  # every location finds its positive
        tensor(0.3133)
        >>> get_loss("infonce", temperature=1.0)(query[0], query[0])  # InfoNCE over the locations
        tensor(0.3133)
    """

    def __init__(self, temperature: float = 0.2, *, normalize: bool = True,
                 reduction: str = "mean") -> None:
        super().__init__(temperature=temperature, reduction=reduction)
        self.normalize = normalize

    def forward(self, query: Tensor, key: Tensor, match: Tensor,
                negatives: Tensor | None = None) -> Tensor:
        return dense_infonce(query, key, match, negatives, temperature=self.temperature,
                             normalize=self.normalize, reduction=self.reduction)

    @classmethod
    def example_inputs(cls, n: int = 6, dim: int = 8, *, dtype: torch.dtype = torch.float32,
                       generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """query and key (n, 4, dim) (a 2 x 2 grid), key near the matched query, and the
        match (n, 4) (in-batch negatives: a queue is not indexed by sample)."""
        query = cls._randn(n, 4, dim, dtype=dtype, generator=generator)
        match = torch.rand(n, 4, generator=generator).argsort(dim=1)
        noise = cls._randn(n, 4, dim, dtype=dtype, generator=generator)
        key = torch.empty_like(query).scatter_(1, match.unsqueeze(2).expand(-1, -1, dim), query)
        return query, key + 0.5 * noise, match
