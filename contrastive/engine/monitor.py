"""Online weighted-kNN monitor: how well the current features separate held-out classes.

The InstDisc / MoCo-CIFAR-demo protocol (REFERENCES.md): L2-normalised features of a labelled
memory bank (the training split under the evaluation transform) and of the held-out split; each
held-out image takes its ``k`` most similar bank images, weights ``exp(sim / t)``, and predicts
the class with the largest summed weight. Top-1 in percent.

Features are computed in eval mode without gradients; under several processes each process
encodes every W-th image and the rows are gathered, so every process sees the same result.
Scoring uses :func:`contrastive.eval.knn.knn_accuracy` (torch back-end) when the evaluation
package is importable, else :func:`weighted_knn_top1` below (the same formula).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Subset

from contrastive.engine.loader import ignore_stop_signals, start_workers

__all__ = ["weighted_knn_top1", "extract_sharded", "KNNMonitor"]

logger = logging.getLogger(__name__)


@torch.no_grad()
def weighted_knn_top1(bank: Tensor, bank_labels: Tensor, queries: Tensor, query_labels: Tensor,
                      *, k: int = 200, t: float = 0.1, num_classes: int | None = None,
                      chunk: int = 1024) -> float:
    """Weighted-kNN top-1 (%) of ``queries`` (M, D) against ``bank`` (N, D); rows L2-normalised
    here. Score of class c: ``sum over the k nearest bank rows of class c of exp(sim / t)``."""
    bank = F.normalize(bank.float(), dim=1)
    queries = F.normalize(queries.float(), dim=1)
    c = int(num_classes or int(bank_labels.max()) + 1)
    k = min(k, bank.shape[0])
    correct = 0
    for s in range(0, queries.shape[0], chunk):
        sim = queries[s:s + chunk] @ bank.T                       # (m, N)
        top_sim, top_idx = sim.topk(k, dim=1)                     # (m, k)
        weights = (top_sim / t).exp()
        scores = torch.zeros(sim.shape[0], c, device=sim.device)
        scores.scatter_add_(1, bank_labels[top_idx], weights)     # (m, C)
        correct += (scores.argmax(1) == query_labels[s:s + chunk]).sum().item()
    return 100.0 * correct / max(queries.shape[0], 1)


def _collate(batch: list) -> tuple[Tensor, Tensor]:
    views = [b[0][0] if isinstance(b[0], (list, tuple)) else b[0] for b in batch]
    return torch.stack(views), torch.tensor([int(b[1]) for b in batch])


@torch.no_grad()
def extract_sharded(encode: Callable[[Tensor], Tensor], dataset: Any, indices: list[int], *,
                    accelerator: Any, batch_size: int, num_workers: int,
                    channels_last: bool = False) -> tuple[Tensor, Tensor]:
    """Features (N, D) float32 and labels (N,) of ``dataset[indices]`` on ``accelerator.device``,
    computed by all processes (process r takes indices[r::W]) and gathered in index order."""
    world, rank = accelerator.num_processes, accelerator.process_index
    mine = indices[rank::world]
    per = -(-len(indices) // world)
    loader = DataLoader(Subset(dataset, mine), batch_size=batch_size, shuffle=False,
                        num_workers=num_workers, collate_fn=_collate,
                        generator=torch.Generator(),  # never draw from the global generator
                        worker_init_fn=ignore_stop_signals)  # see loader.py: stop signals
    feats, labels = [], []
    device = accelerator.device
    for x, y in start_workers(loader):
        x = x.to(device, non_blocking=True)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with accelerator.autocast():
            f = encode(x)
        feats.append(F.normalize(f.float(), dim=1))
        labels.append(y.to(device))
    dim = feats[0].shape[1] if feats else 0
    if world > 1:
        dim = int(accelerator.gather(torch.tensor([dim], device=device)).max())
    f = torch.cat(feats) if feats else torch.zeros(0, dim, device=device)
    y = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long, device=device)
    if world == 1:
        return f, y
    pad = per - f.shape[0]
    f = torch.cat([f, f.new_zeros(pad, dim)])
    y = torch.cat([y, y.new_full((pad,), -1)])
    f_all = accelerator.gather(f).view(world, per, dim)      # rank-major
    y_all = accelerator.gather(y).view(world, per)
    # undo the striding: index j*W + r lives at [r, j]
    f_all = f_all.transpose(0, 1).reshape(world * per, dim)[:len(indices)]
    y_all = y_all.transpose(0, 1).reshape(world * per)[:len(indices)]
    return f_all, y_all


class KNNMonitor:
    """kNN top-1 of the current encoder: bank = train split, queries = held-out split.

    Args:
        bank_set, query_set: labelled data sets yielding (eval view(s), label).
        k, t: neighbours and temperature. max_bank, max_query: random subsets (seed 0; 0 = all).
        batch_size, num_workers: extraction loader settings.
    """

    def __init__(self, bank_set: Any, query_set: Any, *, k: int = 200, t: float = 0.1,
                 max_bank: int = 0, max_query: int = 0, batch_size: int = 256,
                 num_workers: int = 0, num_classes: int | None = None) -> None:
        self.bank_set, self.query_set = bank_set, query_set
        self.k, self.t = k, t
        self.bank_idx = _spread(len(bank_set), max_bank)
        self.query_idx = _spread(len(query_set), max_query)
        self.batch_size, self.num_workers = batch_size, num_workers
        self.num_classes = num_classes

    @torch.no_grad()
    def __call__(self, encode: Callable[[Tensor], Tensor], accelerator: Any,
                 channels_last: bool = False) -> float:
        kw = dict(accelerator=accelerator, batch_size=self.batch_size,
                  num_workers=self.num_workers, channels_last=channels_last)
        bank, bank_y = extract_sharded(encode, self.bank_set, self.bank_idx, **kw)
        query, query_y = extract_sharded(encode, self.query_set, self.query_idx, **kw)
        try:
            from contrastive.eval.knn import knn_accuracy
        except ImportError:  # evaluation package unavailable: same formula, local code
            return weighted_knn_top1(bank, bank_y, query, query_y, k=self.k, t=self.t,
                                     num_classes=self.num_classes)
        return knn_accuracy(bank, bank_y, query, query_y, k=self.k, temperature=self.t,
                            num_classes=self.num_classes, backend="torch")["top1"]


def _spread(n: int, limit: int) -> list[int]:
    """``limit`` of ``range(n)`` drawn at random (seed 0), in increasing order; all when
    ``limit`` is 0 or >= n. Random, not evenly spaced: a stride would alias with data sets
    whose labels cycle with the index (``shapes``: label = index % 10)."""
    if limit <= 0 or limit >= n:
        return list(range(n))
    g = torch.Generator().manual_seed(0)
    return sorted(torch.randperm(n, generator=g)[:limit].tolist())
