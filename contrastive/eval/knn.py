"""Weighted k-nearest-neighbour classification on L2-normalised features.

The protocol of InstDisc (Wu et al., "Unsupervised Feature Learning via Non-Parametric Instance
Discrimination", CVPR 2018) as used by the MoCo CIFAR-10 demo: for a query q and a labelled bank
of features b_1..b_N (all L2-normalised),

    s_j      = q . b_j                                   (cosine similarity)
    N_k(q)   = the k bank rows with the largest s_j
    score_c  = sum_{j in N_k(q), y_j = c} exp(s_j / t)   (k = 200, t = 0.1 by default)
    predict  = argmax_c score_c                          (top-5: the 5 best classes)

Two search back-ends give the same neighbours:

- ``"faiss"`` (default): ``faiss.IndexFlatIP``, an exact inner-product search. The bank is added
  to the index chunk by chunk and queries are searched ``chunk_size`` at a time, so the memory on
  top of the caller's bank is the index itself (N x D x 4 bytes: 10.6 GB for 1.3M x 2048) plus
  ``chunk_size x k`` results and ``chunk_size x C`` class scores. With ``store="float16"`` the bank
  is kept in a ``faiss.IndexScalarQuantizer`` (QT_fp16): half the memory, and APPROXIMATE, because
  the similarities are computed from float16-rounded bank vectors (relative error about 1e-3, so
  neighbours near the k-th place can swap).
- ``"torch"``: chunked ``queries @ bank.T`` + ``topk`` on the bank's device (a GPU when the bank is
  there). It keeps one L2-normalised float32 copy of the bank, and queries are taken in chunks
  whose ``rows x N`` similarity matrix stays under 1 GiB (196 rows for a 1.3M bank).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

__all__ = ["WeightedKNN", "knn_predict", "knn_accuracy", "topk_accuracy"]

_BACKENDS = ("faiss", "torch")
_TORCH_SIM_ELEMENTS = 1 << 28  # float32 similarities per torch search chunk (1 GiB)
_STORES = ("float32", "float16")


def _check_labels(labels: Tensor, n: int, num_classes: int | None, what: str) -> int:
    if labels.ndim != 1 or labels.numel() != n:
        raise ValueError(f"{what}: expected 1-D labels with {n} entries, got shape {tuple(labels.shape)}")
    if n == 0:
        raise ValueError(f"{what}: the feature bank is empty; check the dataset split")
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0:
        raise ValueError(
            f"{what}: found label {lo}; kNN needs a labelled bank (label -1 means unlabelled data)"
        )
    if num_classes is None:
        return hi + 1
    if hi >= num_classes:
        raise ValueError(
            f"{what}: found label {hi} but num_classes={num_classes}; pass num_classes > {hi}"
        )
    return num_classes


class WeightedKNN:
    """A labelled feature bank that answers weighted-kNN queries.

    Args:
        bank: (N, D) features (any float dtype; L2-normalised here in float32).
        labels: (N,) integer class labels in [0, num_classes).
        num_classes: number of classes C; default max(labels) + 1.
        backend: ``"faiss"`` (exact ``IndexFlatIP``, CPU) or ``"torch"`` (matmul + topk on the
            bank's device).
        store: ``"float32"`` (exact) or ``"float16"`` (faiss ``IndexScalarQuantizer``, approximate;
            faiss back-end only).
        chunk_size: rows per chunk when adding the bank and when searching queries.

    Example:
        >>> knn = WeightedKNN(train_feats, train_labels)
        >>> top5 = knn.predict(test_feats, k=200, temperature=0.1)  # (M, 5) classes, best first
    """

    def __init__(
        self,
        bank: Tensor,
        labels: Tensor,
        *,
        num_classes: int | None = None,
        backend: str = "faiss",
        store: str = "float32",
        chunk_size: int = 4096,
    ) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {_BACKENDS}")
        if store not in _STORES:
            raise ValueError(f"store={store!r} is not one of {_STORES}")
        if store == "float16" and backend != "faiss":
            raise ValueError("store='float16' needs backend='faiss' (IndexScalarQuantizer)")
        if bank.ndim != 2:
            raise ValueError(f"bank: expected (N, D) features, got shape {tuple(bank.shape)}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.num_classes = _check_labels(labels, bank.shape[0], num_classes, "labels")
        self.backend, self.store, self.chunk_size = backend, store, chunk_size
        self.dim = bank.shape[1]
        self.size = bank.shape[0]
        self.labels = labels.long().cpu() if backend == "faiss" else labels.long().to(bank.device)
        self._index: Any = None
        self._bank: Tensor | None = None
        if backend == "faiss":
            self._index = self._build_faiss(bank)
        else:
            self._bank = F.normalize(bank.float(), dim=1)

    def _build_faiss(self, bank: Tensor) -> Any:
        loader_log = logging.getLogger("faiss.loader")  # its INFO lines about CPU variants are noise
        if loader_log.level == logging.NOTSET:
            loader_log.setLevel(logging.WARNING)
        import faiss

        index: Any
        if self.store == "float32":
            index = faiss.IndexFlatIP(self.dim)
        else:
            index = faiss.IndexScalarQuantizer(
                self.dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
            )
        # Normalise and add one chunk at a time: only one chunk-sized copy beside the index.
        for start in range(0, self.size, self.chunk_size):
            rows = F.normalize(bank[start : start + self.chunk_size].detach().float().cpu(), dim=1)
            chunk = rows.contiguous().numpy()
            if not index.is_trained:  # QT_fp16 needs no statistics, but the API wants train()
                index.train(chunk)
            index.add(chunk)
        return index

    def search(self, queries: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The k most similar bank rows of each query.

        Args:
            queries: (M, D) features (L2-normalised here).
            k: neighbours per query; clipped to the bank size.

        Returns:
            (similarities (M, k) float32, indices (M, k) int64), most similar first.
        """
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(
                f"queries: expected (M, {self.dim}) features, got shape {tuple(queries.shape)}"
            )
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if k > self.size:
            log.warning("k=%d is larger than the bank (%d rows); using k=%d", k, self.size, self.size)
            k = self.size
        sims, idx = [], []
        step = self.chunk_size
        if self.backend == "torch":  # the chunk's (rows x N) similarity matrix: at most 1 GiB
            step = max(1, min(step, _TORCH_SIM_ELEMENTS // max(1, self.size)))
        for start in range(0, queries.shape[0], step):
            s, i = self._search_chunk(queries[start : start + step], k)
            sims.append(s)
            idx.append(i)
        if not sims:
            dev = self.labels.device
            return torch.empty(0, k, device=dev), torch.empty(0, k, dtype=torch.long, device=dev)
        return torch.cat(sims), torch.cat(idx)

    def _search_chunk(self, q: Tensor, k: int) -> tuple[Tensor, Tensor]:
        if self._index is not None:
            qa = F.normalize(q.detach().float().cpu(), dim=1).contiguous().numpy()
            s, i = self._index.search(qa, k)
            return torch.from_numpy(s), torch.from_numpy(i)
        assert self._bank is not None
        qn = F.normalize(q.detach().float().to(self._bank.device), dim=1)
        sims, idx = (qn @ self._bank.T).topk(k, dim=1)
        return sims, idx

    def scores(self, queries: Tensor, k: int = 200, temperature: float = 0.1) -> Tensor:
        """Class scores score_c = sum over neighbours of class c of exp(s_j / t), shape (M, C)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        out = []
        for start in range(0, queries.shape[0], self.chunk_size):
            sims, idx = self.search(queries[start : start + self.chunk_size], k)
            weights = (sims / temperature).exp()
            neighbour_labels = self.labels[idx.to(self.labels.device)]
            chunk_scores = torch.zeros(
                idx.shape[0], self.num_classes, dtype=weights.dtype, device=weights.device
            )
            out.append(chunk_scores.scatter_add_(1, neighbour_labels.to(weights.device), weights))
        if not out:
            return torch.empty(0, self.num_classes)
        return torch.cat(out)

    def predict(
        self, queries: Tensor, k: int = 200, temperature: float = 0.1, topk: int = 5
    ) -> Tensor:
        """The ``topk`` best classes of each query, best first, shape (M, min(topk, C))."""
        topk = min(topk, self.num_classes)
        preds = []
        for start in range(0, queries.shape[0], self.chunk_size):
            chunk = self.scores(queries[start : start + self.chunk_size], k, temperature)
            preds.append(chunk.topk(topk, dim=1).indices.cpu())
        if not preds:
            return torch.empty(0, topk, dtype=torch.long)
        return torch.cat(preds)


def knn_predict(
    bank: Tensor,
    bank_labels: Tensor,
    queries: Tensor,
    *,
    k: int = 200,
    temperature: float = 0.1,
    num_classes: int | None = None,
    topk: int = 5,
    backend: str = "faiss",
    store: str = "float32",
    chunk_size: int = 4096,
) -> Tensor:
    """Weighted-kNN predictions (M, min(topk, C)), best class first. See :class:`WeightedKNN`."""
    knn = WeightedKNN(
        bank, bank_labels, num_classes=num_classes, backend=backend, store=store, chunk_size=chunk_size
    )
    return knn.predict(queries, k=k, temperature=temperature, topk=topk)


def topk_accuracy(predictions: Tensor, labels: Tensor, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Top-k accuracies in percent from ranked predictions (M, >= max k) and labels (M,).

    Returns keys ``top1``, ``top5`` ... (a k larger than the number of ranked classes counts every
    class, i.e. equals the top-C accuracy).
    """
    if predictions.shape[0] != labels.shape[0]:
        raise ValueError(
            f"predictions have {predictions.shape[0]} rows but labels have {labels.shape[0]}"
        )
    if labels.numel() == 0:
        raise ValueError("no labels to score: the evaluation split is empty")
    hit = predictions.cpu() == labels.cpu().long().view(-1, 1)
    return {f"top{k}": 100.0 * hit[:, :k].any(dim=1).float().mean().item() for k in ks}


def knn_accuracy(
    bank: Tensor,
    bank_labels: Tensor,
    queries: Tensor,
    query_labels: Tensor,
    *,
    k: int = 200,
    temperature: float = 0.1,
    num_classes: int | None = None,
    backend: str = "faiss",
    store: str = "float32",
    chunk_size: int = 4096,
) -> dict[str, float]:
    """Weighted-kNN top-1 and top-5 accuracy (percent) of ``queries`` against the bank.

    A bank of one class scores 100 % on queries of that class and means nothing: this building
    block (also the training monitor's) warns; :func:`contrastive.eval.runner.knn_eval` refuses.
    """
    if bank_labels.numel() and int(bank_labels.unique().numel()) < 2:
        log.warning("kNN on a bank of one class (%d rows): its accuracy means nothing", bank_labels.numel())
    knn = WeightedKNN(
        bank, bank_labels, num_classes=num_classes, backend=backend, store=store, chunk_size=chunk_size
    )
    if query_labels.numel() and int(query_labels.max()) >= knn.num_classes:
        raise ValueError(
            f"query_labels: found label {int(query_labels.max())} but the bank has "
            f"{knn.num_classes} classes; the splits do not share a label set"
        )
    preds = knn.predict(queries, k=k, temperature=temperature, topk=5)
    return topk_accuracy(preds, query_labels)
