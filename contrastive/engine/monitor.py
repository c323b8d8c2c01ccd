"""Online monitors of the features during training: weighted kNN, and a linear probe.

**kNN** (:class:`KNNMonitor`): the InstDisc / MoCo-CIFAR-demo protocol on the held-out split,
computed by :func:`contrastive.eval.runner.knn_on_splits`, the very function behind
``contrastive-knn-eval``: the monitor's figure equals the command's on the same encoder, data,
crop size and batch size by construction. Bank = the training split under the evaluation
transform (optionally a random subset), queries = the held-out split; features in eval mode
without gradients, every process gets all rows (``gather_for_metrics``).

**Linear probe** (:mod:`contrastive.engine.probe`): a linear classifier trained beside the
method on detached features of the training batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Subset

__all__ = ["KNNMonitor", "feature_fn", "encoder_of"]

logger = logging.getLogger(__name__)


class KNNMonitor:
    """kNN top-1 of the current encoder: bank = train split, queries = held-out split.

    Args:
        bank_set, query_set: labelled data sets yielding (eval view, label).
        k, t: neighbours and temperature. max_bank, max_query: random subsets (seed 0; 0 = all).
        batch_size, num_workers: extraction loader settings (per process).
    """

    def __init__(self, bank_set: Any, query_set: Any, *, k: int = 200, t: float = 0.1,
                 max_bank: int = 0, max_query: int = 0, batch_size: int = 256,
                 num_workers: int = 0, num_classes: int | None = None) -> None:
        self.bank_set = _subset(bank_set, max_bank)
        self.query_set = _subset(query_set, max_query)
        self.k, self.t = k, t
        self.batch_size, self.num_workers = batch_size, num_workers
        self.num_classes = num_classes

    @torch.no_grad()
    def __call__(self, encode: Callable[[Tensor], Tensor], accelerator: Any,
                 channels_last: bool = False) -> float:
        """Top-1 (%) of ``encode`` (the caller sets the model's eval mode)."""
        from contrastive.eval.runner import knn_on_splits

        res = knn_on_splits(
            encode, self.bank_set, self.query_set, k=self.k, temperature=self.t,
            num_classes=self.num_classes, batch_size=self.batch_size,
            num_workers=self.num_workers, accelerator=accelerator, progress=False,
            device_transform=_channels_last if channels_last else None, what="the kNN monitor")
        return float(res["accuracy"]["top1"])


def feature_fn(module: nn.Module, which: str) -> Callable[[Tensor], Tensor]:
    """The features a monitor sees: the method's backbone (``which="backbone"``) or its
    head/projector output (``"head"``); inputs cast to float64 for a ``--float64`` model."""
    encode: Callable[[Tensor], Tensor]
    if which == "head":
        head = getattr(module, "head", None) or getattr(module, "projector", None)
        if head is None:
            raise ValueError(f"--knn-feature head: {type(module).__name__} has no head/projector")
        backbone = encoder_of(module)

        def encode(x: Tensor) -> Tensor:
            return head(backbone(x))
    else:
        encode = encoder_of(module)
    if any(p.dtype == torch.float64 for p in encoder_of(module).parameters()):  # --float64
        inner = encode
        return lambda x: inner(x.double())
    return encode


def encoder_of(method: nn.Module) -> nn.Module:
    """The method's backbone (its ``encoder`` attribute), typed."""
    encoder = getattr(method, "encoder", None)
    if not isinstance(encoder, nn.Module):
        raise TypeError(f"{type(method).__name__} has no encoder module (attribute 'encoder')")
    return encoder


def _channels_last(x: Tensor) -> Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def _subset(ds: Any, limit: int) -> Any:
    """``limit`` items of ``ds`` drawn at random (seed 0), in increasing order; all when
    ``limit`` is 0 or >= len. Random, not evenly spaced: a stride would alias with data sets
    whose labels cycle with the index (``shapes``: label = index % 10)."""
    n = len(ds)
    if limit <= 0 or limit >= n:
        return ds
    g = torch.Generator().manual_seed(0)
    return Subset(ds, sorted(torch.randperm(n, generator=g)[:limit].tolist()))
