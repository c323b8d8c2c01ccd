"""Cross-process helpers for contrastive methods; every one is a no-op in a single process.

Two named gathers (keep them apart, mixing them up is the classic multi-GPU bug):

- :func:`gather` concatenates a tensor from all processes WITHOUT gradient. For MoCo queue keys
  and MoCo v3 keys, which are targets and never receive gradient.
- :func:`gather_with_grad` concatenates WITH gradient, for in-batch negatives (SimCLR). Its
  backward sums the gradient of every process's loss with respect to this process's rows, so
  that after DDP's gradient averaging the update equals the one of a single process that saw
  the whole batch (``loss = mean over processes of the local mean losses``).

Shuffle BN (MoCo v1/v2, He et al. 2020, sec. 3.3): :func:`batch_shuffle` permutes the key batch
across processes before the key encoder so that BN statistics of the keys come from other
images than the queries', and :func:`batch_unshuffle` restores the order. The permutation is
drawn on process 0 and broadcast, so every process agrees on it without any host sync.

All helpers require equal per-process batch sizes (use ``drop_last=True`` in the loader), as
``torch.distributed.all_gather`` does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "is_distributed",
    "world_size",
    "rank",
    "gather",
    "gather_with_grad",
    "batch_shuffle",
    "batch_unshuffle",
]


def is_distributed() -> bool:
    """True when torch.distributed is available and a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Number of processes (1 without torch.distributed)."""
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """Rank of this process (0 without torch.distributed)."""
    return dist.get_rank() if is_distributed() else 0


def _all_gather_cat(tensor: Tensor) -> Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)


@torch.no_grad()
def gather(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor`` from all processes along dim 0, without gradient.

    Shape: (N, ...) per process -> (world_size * N, ...), rows of rank 0 first.
    Returns ``tensor.detach()`` itself in a single process.
    """
    if world_size() == 1:
        return tensor.detach()
    return _all_gather_cat(tensor.detach())


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: Tensor) -> Tensor:
        ctx.rows = tensor.shape[0]
        return _all_gather_cat(tensor)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        # Every process holds d(its own loss)/d(all rows); this process's rows need the sum
        # over processes. reduce_scatter does exactly that on NCCL; gloo lacks it.
        grad = grad.contiguous()
        n, r = ctx.rows, dist.get_rank()
        if dist.get_backend() == "nccl":
            out = torch.empty((n, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
            dist.reduce_scatter_tensor(out, grad)
            return out
        dist.all_reduce(grad)
        return grad[r * n : (r + 1) * n]


def gather_with_grad(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor`` from all processes along dim 0, keeping the autograd graph.

    Shape: (N, ...) per process -> (world_size * N, ...), rows of rank 0 first. The backward
    pass returns, for this process's rows, the SUM over processes of their gradients, which is
    the gradient of ``sum over processes of loss_p``; DDP then divides by world_size, giving
    the gradient of the 1-process loss on the concatenated batch. Identity in one process.
    """
    if world_size() == 1:
        return tensor
    return _GatherWithGrad.apply(tensor)


@torch.no_grad()
def batch_shuffle(x: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Shuffle a batch across processes (shuffle BN).

    Args:
        x: (N, ...) this process's batch (same N on every process).
        generator: optional generator for the permutation (used on rank 0 only).

    Returns:
        ``(x_shuffled, idx_unshuffle)``: this process's N rows of the globally permuted batch,
        and the index to pass to :func:`batch_unshuffle`. In one process the batch is returned
        unchanged (permuting one process's batch does not change its BN statistics) and
        ``idx_unshuffle`` is ``arange(N)``.
    """
    n = x.shape[0]
    if world_size() == 1:
        return x, torch.arange(n, device=x.device)
    x_all = _all_gather_cat(x)
    device = x.device if generator is None else generator.device
    perm = torch.randperm(x_all.shape[0], generator=generator, device=device).to(x.device)
    dist.broadcast(perm, src=0)
    idx_unshuffle = torch.argsort(perm)
    r = dist.get_rank()
    return x_all[perm[r * n : (r + 1) * n]], idx_unshuffle


@torch.no_grad()
def batch_unshuffle(x: Tensor, idx_unshuffle: Tensor) -> Tensor:
    """Undo :func:`batch_shuffle`: (N, ...) shuffled rows -> this process's original N rows."""
    n = x.shape[0]
    if world_size() == 1:
        return x
    x_all = _all_gather_cat(x)
    r = dist.get_rank()
    return x_all[idx_unshuffle[r * n : (r + 1) * n]]
