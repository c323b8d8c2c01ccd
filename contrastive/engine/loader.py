"""Deterministic, resumable, multi-process data order and augmentation randomness.

Two rules make a resumed run, any number of loader workers and any number of processes see the
same images with the same augmentations:

1. **Order**: :class:`GlobalBatchSampler` draws one permutation per epoch from
   ``(seed, epoch)`` and cuts it into GLOBAL micro-batches; process ``r`` of ``W`` takes
   positions ``r, r + W, r + 2W ...`` of each (as ``DistributedSampler`` does). W processes
   therefore see exactly the images of the batch one process would see, grouped as split BN
   with W groups groups them (sample n -> group n % W), and a resume skips micro-batches by count
   (``accelerator.skip_first_batches``) without loading them.
2. **Augmentation**: :class:`~contrastive.data.loader.SeededDataset` (the data package's, the
   one seeded loader stack) receives ``(epoch, index)`` pairs from the sampler and seeds torch
   and ``random`` from ``(seed, epoch, index)`` before calling the wrapped data set (whose
   transform draws the random crop / jitter ...), restoring the previous generator state
   afterwards when it runs in the main process. A worker's history (which batches it loaded
   before) therefore never changes a sample's views.

The batched path draws its per-sample parameters from a generator seeded with ``(seed, step,
micro-step)`` (see :func:`step_generator`), the same on every process: it draws for the whole
global micro-batch and each process keeps its samples' rows
(:mod:`contrastive.augment.share`), so it too is exact on resume and gives every sample the same
views whatever the number of processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from contrastive.augment.device_decode import collate
from contrastive.data.loader import (
    SeededDataset,
    epoch_order,
    ignore_stop_signals,
    mix_seed,
    start_workers,
)

__all__ = ["BatchSizeError", "mix_seed", "GlobalBatchSampler", "SeededDataset", "build_train_loader",
           "step_generator", "ignore_stop_signals", "start_workers"]


class BatchSizeError(ValueError):
    """A ``--batch-size`` the run cannot take (larger than the data set, not divisible by the
    processes): :func:`~contrastive.engine.run.run` reports it in one line."""

class GlobalBatchSampler(Sampler[list[tuple[int, int]]]):
    """Per-process micro-batches of ``(epoch, index)`` cut from one global permutation;
    process ``rank`` takes every ``world_size``-th image of each global micro-batch.

    Args:
        num_samples: data set size.
        global_micro_batch: images per micro-step over all processes (global batch / accum).
        rank, world_size: this process and the number of processes.
        seed: permutation seed; epoch ``e`` uses ``mix_seed(seed, e)``.
        shuffle: permute (training) or keep order.

        num_batches: micro-batches per epoch (default: every complete global micro-batch; the
            trainer passes a multiple of the accumulation steps).

    ``len()`` is the number of micro-batches per epoch (incomplete global batches dropped).
    """

    def __init__(self, num_samples: int, global_micro_batch: int, *, rank: int = 0,
                 world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 num_batches: int | None = None) -> None:
        if global_micro_batch % world_size:
            raise BatchSizeError(f"global micro-batch {global_micro_batch} is not divisible by "
                             f"{world_size} processes; pick a --batch-size that is")
        if num_samples < global_micro_batch:
            raise BatchSizeError(f"the data set has {num_samples} images, fewer than one global "
                             f"micro-batch of {global_micro_batch}: lower --batch-size")
        self.num_samples = num_samples
        self.global_micro_batch = global_micro_batch
        self.local = global_micro_batch // world_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        full = num_samples // global_micro_batch
        if num_batches is not None and not 0 < num_batches <= full:
            raise ValueError(f"num_batches must be in [1, {full}], got {num_batches}")
        self.num_batches = full if num_batches is None else num_batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        for b in range(len(self)):
            batch = order[b * self.global_micro_batch:(b + 1) * self.global_micro_batch]
            yield [(self.epoch, i) for i in batch[self.rank::self.world_size]]


def build_train_loader(dataset: Any, sampler: GlobalBatchSampler, *, seed: int, num_workers: int,
                       pin_memory: bool, prefetch_factor: int = 2,
                       collate_fn: Callable[[list], Any] | None = None) -> DataLoader:
    """A DataLoader over ``SeededDataset(dataset, seed)`` (items ``(*dataset[i], i)``) driven by
    ``sampler``.

    ``collate_fn`` (None: :func:`contrastive.augment.device_decode.collate`, torch's default
    collate except for the samples of ``--decode device``, whose bytes and crop boxes it packs
    into one :class:`~contrastive.augment.device_decode.DeviceDecodeBatch`).

    Its own ``generator`` keeps the loader from drawing worker base seeds out of the global torch
    generator (which would make a resumed run's model-side randomness differ); persistent
    workers keep process start-up out of the epoch loop.
    """
    return DataLoader(
        SeededDataset(dataset, seed),
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=ignore_stop_signals,
        collate_fn=collate if collate_fn is None else collate_fn,
    )


def step_generator(device: torch.device, seed: int, step: int, micro: int) -> torch.Generator:
    """Generator for the batched augmentation of one micro-step, the same on every process
    (each keeps its own rows of the global draw: :mod:`contrastive.augment.share`): on the host
    whatever the training ``device`` (the per-sample numbers are few; drawn on the host, the
    dense GPU path picks its hue subsets without a device sync, and CPU and GPU runs draw the
    same numbers). ``device`` is kept for callers; it does not change the stream."""
    del device
    g = torch.Generator()
    # the trailing 0 was the rank when each process drew its own stream: one process keeps the
    # numbers (and recipe digests) it had before every process drew rank 0's global stream
    g.manual_seed(mix_seed(seed, 0xA46, step, micro, 0))
    return g
