"""A process's share of the random numbers of one global micro-batch.

The engine's sampler gives process ``r`` of ``W`` the positions ``r, r + W, r + 2W ...`` of each
global micro-batch (:class:`~contrastive.engine.loader.GlobalBatchSampler`). The batched
augmentation draws its per-sample numbers for the whole global micro-batch from the step's
generator, the same on every process, and each process keeps the rows of its own samples: so a
sample gets the same views whatever the number of processes, and one process draws exactly what
it drew before this rule (its share is every row).

Examples:
    >>> import torch
    >>> whole = rand_rows(4, (2,), torch.Generator().manual_seed(0))  # one process, 4 samples
    >>> half = rand_rows(2, (2,), torch.Generator().manual_seed(0), Share(1, 2))  # rank 1 of 2
    >>> torch.equal(half, whole[1::2])
    True
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["Share", "WHOLE", "rand_rows"]


class Share(NamedTuple):
    """Process ``rank`` of ``world``: its samples are rows ``rank::world`` of the global batch."""

    rank: int = 0
    world: int = 1


#: a single process: every row is its own
WHOLE = Share()


def rand_rows(n: int, tail: tuple[int, ...], generator: torch.Generator | None,
              share: Share = WHOLE, *, dtype: torch.dtype | None = None,
              device: torch.device | None = None) -> Tensor:
    """Uniform [0, 1) numbers (n, *tail) for this process's ``n`` samples: drawn as
    (n x world, *tail) for the global micro-batch from ``generator`` (on its device; None: the
    global generator of ``device``), this process's rows kept."""
    if not 0 <= share.rank < share.world:
        raise ValueError(f"share: rank {share.rank} is not one of {share.world} processes")
    where = generator.device if generator is not None else device
    u = torch.rand((n * share.world, *tail), generator=generator, dtype=dtype, device=where)
    return u[share.rank::share.world]  # (n, *tail)
