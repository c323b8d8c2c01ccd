"""Data loaders whose random views depend on the seed only, not on the number of workers.

How: the sampler yields ``(index, sample_seed)`` pairs, with ``sample_seed`` a hash of (seed,
epoch, index); the dataset wrapper seeds torch's (and Python's and NumPy's) global generators
with it before loading and transforming that item. Every random number of an item's transform
(torchvision transforms use the global generator) is then fixed by (seed, epoch, index),
whichever worker runs it and however many there are. In the main process (``num_workers=0``)
the generators' states are restored afterwards, so training randomness is not disturbed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijective 64-bit hash (vectorised on uint64 arrays)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_MASK64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def sample_seeds(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """Per-item seeds in [0, 2^63): hash of (seed, epoch, index). Shape (n,) -> (n,) int64."""
    base = _mix64(np.array([(int(seed) & _MASK64)], dtype=np.uint64))
    base = _mix64(base ^ np.uint64(int(epoch) & _MASK64))
    s = _mix64(np.asarray(indices, dtype=np.uint64) ^ base)
    return (s >> np.uint64(1)).astype(np.int64)


class SeededSampler(Sampler):
    """Yields ``(index, sample_seed)``: a permutation of ``range(n)`` (or the identity when
    ``shuffle=False``) fixed by (seed, epoch), each index with its item seed.

    The epoch advances by one at every ``iter()``; ``set_epoch(e)`` sets it (resuming a run,
    or distributed samplers in lock step).
    """

    def __init__(self, n: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0) -> None:
        self.n, self.shuffle, self.seed, self.epoch = int(n), bool(shuffle), int(seed), int(epoch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        self.epoch += 1
        if self.shuffle:
            g = torch.Generator().manual_seed(int(sample_seeds(self.seed, epoch, np.array([-1 & _MASK64],
                                                                                          dtype=np.uint64))[0]))
            order = torch.randperm(self.n, generator=g).numpy()
        else:
            order = np.arange(self.n)
        seeds = sample_seeds(self.seed, epoch, order)
        return zip(order.tolist(), seeds.tolist())


def seed_everything_for_item(seed: int) -> None:
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))


class SeededDataset(Dataset):
    """Wraps a data set: ``ds[(index, seed)]`` loads item ``index`` with the global generators
    seeded by ``seed``; ``ds[index]`` is the plain item. Other attributes (targets, classes,
    num_classes, num_skipped, ...) come from the wrapped data set."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, tuple):
            return self.dataset[key]
        index, seed = key
        if get_worker_info() is not None:  # a worker process: nothing else uses its generators
            seed_everything_for_item(seed)
            return self.dataset[index]
        state = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        try:
            seed_everything_for_item(seed)
            return self.dataset[index]
        finally:
            torch.set_rng_state(state[0])
            random.setstate(state[1])
            np.random.set_state(state[2])

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"SeededDataset({self.dataset!r})"


def default_num_workers() -> int:
    """Loader workers for this machine: the CPUs this process may use, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        n = os.cpu_count() or 1
    return max(0, min(8, n))


def build_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    num_workers: int | None = None,
    seed: int = 0,
    drop_last: bool | None = None,
    pin_memory: bool | None = None,
    persistent_workers: bool = True,
    prefetch_factor: int | None = None,
    collate_fn: Callable[[list], Any] | None = None,
) -> DataLoader:
    """A DataLoader with per-item seeding (module docstring): identical batches and views for a
    given ``seed`` across runs and across ``num_workers``.

    Args:
        dataset: any map-style data set (e.g. from :func:`contrastive.data.get_dataset`).
        batch_size: items per batch.
        shuffle: a new permutation every epoch (see :class:`SeededSampler`; ``loader.sampler
            .set_epoch(e)`` to resume).
        num_workers: None -> :func:`default_num_workers`.
        seed: fixes the order and every item's random transform.
        drop_last: None -> ``shuffle`` (training drops the ragged batch, evaluation keeps it).
        pin_memory: None -> True when CUDA is available (faster host-to-device copies).
        persistent_workers: keep workers alive between epochs (when ``num_workers > 0``).
        prefetch_factor: batches prefetched per worker (torch default 2 when None).

    For speed on an accelerator use the batched pipeline (``Pipeline.split()``): the workers
    then return uint8 crops (4x fewer bytes than float32 to collate, pin and copy).
    """
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
    workers = default_num_workers() if num_workers is None else int(num_workers)
    if workers < 0:
        raise ValueError(f"num_workers must be >= 0; got {num_workers}")
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    return DataLoader(
        SeededDataset(dataset),
        batch_size=int(batch_size),
        sampler=SeededSampler(len(dataset), shuffle=shuffle, seed=seed),
        num_workers=workers,
        drop_last=shuffle if drop_last is None else drop_last,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        collate_fn=collate_fn,
        generator=torch.Generator().manual_seed(int(seed)),
        **kwargs,
    )
