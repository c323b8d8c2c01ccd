"""Data loaders whose random views depend on the seed only, not on workers, processes or resumes.

The one seeded loader stack of the package (the training engine builds on it,
:mod:`contrastive.engine.loader`):

- :func:`mix_seed` hashes integers into a 63-bit seed (a splitmix64 chain): an item's seed is
  ``mix_seed(seed, epoch, index)``, an epoch's order comes from ``mix_seed(seed, epoch)``.
- :class:`SeededDataset` receives ``(epoch, index)`` keys and loads item ``index`` with torch's,
  Python's and NumPy's global generators seeded by ``mix_seed(seed, epoch, index)``; every random
  number of the item's transform (torchvision transforms use the global generators) is then fixed,
  whichever worker runs it and however many there are. In the main process (``num_workers=0``)
  the generators' states are restored afterwards, so the caller's random stream is untouched.
- :class:`SeededSampler` yields the ``(epoch, index)`` keys of one epoch in the order
  :func:`epoch_order` gives (the engine's ``GlobalBatchSampler`` cuts the same order into global
  batches).
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

__all__ = ["mix_seed", "epoch_order", "seed_item_generators", "SeededDataset", "SeededSampler",
           "default_num_workers", "build_loader", "ignore_stop_signals", "start_workers"]

_MASK64 = (1 << 64) - 1
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def mix_seed(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 chain): nearby inputs give unrelated seeds."""
    state = 0x9E3779B97F4A7C15
    for v in values:
        state = (state ^ (int(v) & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order of ``range(n)`` in ``epoch``: a permutation drawn from ``mix_seed(seed, epoch)``
    (the identity when not ``shuffle``)."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(mix_seed(seed, epoch))
    return torch.randperm(n, generator=g).tolist()


def seed_item_generators(seed: int) -> None:
    """Seed torch's CPU generator, ``random`` and NumPy for one item.

    ``torch.default_generator.manual_seed``, not ``torch.manual_seed``: the same CPU stream (see
    tests/data/test_loader.py), without also seeding (or, before CUDA starts, queueing the seeding
    of) every CUDA device: ~3 us instead of 0.2-1 ms per item on a CUDA build, and the main
    process's CUDA generators are never touched by data loading.
    """
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


class SeededDataset(Dataset):
    """Wraps a map-style data set: ``ds[(epoch, index)]`` loads item ``index`` under the seed
    ``mix_seed(seed, epoch, index)``; ``ds[index]`` is the plain item.

    Items are ``dataset[index]``, or ``(*dataset[index], index)`` with ``with_index`` (the
    training engine passes the index on, e.g. to methods that need it). Other attributes
    (targets, classes, num_classes, ...) come from the wrapped data set. A data set whose items
    draw nothing at random says so with ``seeded_items = False`` (text examples): its items are
    loaded without seeding (the seeding costs ~0.1 ms an item, a tenth of a small text step).
    """

    def __init__(self, dataset: Any, seed: int = 0, *, with_index: bool = True) -> None:
        self.dataset = dataset
        self.seed = int(seed)
        self.with_index = with_index
        self.seeded = bool(getattr(dataset, "seeded_items", True))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, tuple):
            return self.dataset[key]
        epoch, index = key
        if not self.seeded:  # nothing random in the item
            item = self.dataset[index]
        elif get_worker_info() is not None:  # a worker process: nothing else uses its generators
            seed_item_generators(mix_seed(self.seed, epoch, index))
            item = self.dataset[index]
        else:
            state = (torch.get_rng_state(), random.getstate(), np.random.get_state())
            try:
                seed_item_generators(mix_seed(self.seed, epoch, index))
                item = self.dataset[index]
            finally:
                torch.set_rng_state(state[0])
                random.setstate(state[1])
                np.random.set_state(state[2])
        return (*item, index) if self.with_index else item

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"SeededDataset({self.dataset!r}, seed={self.seed})"


class SeededSampler(Sampler):
    """Yields the ``(epoch, index)`` keys of one epoch, in :func:`epoch_order`.

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
        return ((epoch, i) for i in epoch_order(self.n, self.seed, epoch, self.shuffle))


def ignore_stop_signals(worker_id: int = 0) -> None:
    """``worker_init_fn``: this loader worker ignores SIGTERM and SIGINT (then unblocks them).

    The main process alone decides when to stop: it finishes its step, saves, and shuts its
    workers down. Torch's own SIGTERM handler in workers would otherwise end the worker first.
    """
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def start_workers(loader: Iterable) -> Iterator:
    """``iter(loader)`` with SIGTERM and SIGINT held back in this thread while it runs.

    Worker processes fork inside ``iter()`` and inherit the blocked signals, so a signal that
    arrives before :func:`ignore_stop_signals` has run in a worker waits and is then ignored,
    instead of ending the worker through torch's handler. In this process a pending signal is
    delivered when the mask is restored (or earlier to another thread): nothing is lost.
    """
    if not hasattr(signal, "pthread_sigmask") or \
            threading.current_thread() is not threading.main_thread():
        return iter(loader)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


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

    Workers ignore SIGTERM / SIGINT (:func:`ignore_stop_signals`): the main process decides when
    to stop. For speed on an accelerator use the batched pipeline (``Pipeline.split()``): the workers
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
        SeededDataset(dataset, seed, with_index=False),
        batch_size=int(batch_size),
        sampler=SeededSampler(len(cast(Sized, dataset)), shuffle=shuffle, seed=seed),
        num_workers=workers,
        drop_last=shuffle if drop_last is None else drop_last,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        collate_fn=collate_fn,
        generator=torch.Generator().manual_seed(int(seed)),
        worker_init_fn=ignore_stop_signals,
        **kwargs,
    )
