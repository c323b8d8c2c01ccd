"""A small image data set decoded once into one uint8 tensor (``--resident``).

Why: 50,000 CIFAR images of 32 px are 154 MB as uint8, a sliver of a GPU's memory. Decoding
them once and keeping them on the training device removes the per-step JPEG decoding, the
worker-to-process copies and the host-to-device copy: the loader then carries indices only
(:class:`ResidentImages`), the crops are cut on the device
(:class:`~contrastive.augment.device_crop.ResidentViews`), and the kNN monitor encodes the same
tensors instead of decoding both splits again every time it runs.

:func:`decode_split` reads a data set through a loader (its workers decode) with a progress bar
and checks that every image has the same size; it refuses, in one line, a split whose tensor
would exceed :data:`MAX_BYTES`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from contrastive.data.io import as_uint8_chw

__all__ = ["ResidentError", "decode_split", "ResidentImages", "MAX_BYTES"]

logger = logging.getLogger(__name__)

#: largest decoded split (bytes) that ``--resident`` takes: far above CIFAR (154 MB), far below
#: an ImageNet (about 200 GB at 224 px), which needs the streaming path
MAX_BYTES = 16 << 30


class ResidentError(ValueError):
    """A data set ``--resident`` cannot hold: images of several sizes, or too large."""


def _collate(batch: list[tuple[Any, int]]) -> tuple[Tensor | None, Tensor, set[tuple[int, ...]]]:
    """The loader's collate, in the worker: (one stacked uint8 tensor, labels, sizes); the
    tensor is None when the sizes differ (reported by the main process in one line, not as a
    worker's traceback). One tensor a batch: a list of small tensors crosses from the worker
    one shared-memory handle each (1.6-3.8x slower on 2,000 CIFAR images, 2 workers; the H200
    machine took 21 s for the 50,000 training images that way, 2026-12-01)."""
    images = [as_uint8_chw(x) for x, _ in batch]
    sizes = {tuple(t.shape) for t in images}
    labels = torch.tensor([int(y) for _, y in batch])
    return (torch.stack(images) if len(sizes) == 1 else None), labels, sizes


def _sizes_error(sizes: set[tuple[int, ...]]) -> ResidentError:
    listed = ", ".join("x".join(map(str, s[1:])) for s in sorted(sizes))
    return ResidentError(f"--resident needs images of one size; this data set has {listed} "
                         "(resize it once, or drop --resident)")


def decode_split(dataset: Dataset, *, num_workers: int = 0, batch_size: int = 1024,
                 progress: bool = True, what: str = "the training split") -> tuple[Tensor, Tensor]:
    """Every image of ``dataset`` (PIL images or uint8 tensors) as a uint8 (N, 3, H, W) tensor and its labels (N,) int64, in index order, on the host."""
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        raise ResidentError(f"--resident: {what} is empty")
    first, _ = dataset[0]
    first = as_uint8_chw(first)
    need = n * first.numel()
    if need > MAX_BYTES:
        raise ResidentError(f"--resident: {what} would take {need / 2**30:.1f} GiB as uint8 "
                            f"({n} images of {tuple(first.shape)}), more than "
                            f"{MAX_BYTES / 2**30:.0f} GiB: drop --resident (stream it)")
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=_collate)
    images = torch.empty((n, *first.shape), dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.long)
    bar: Any = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"decoding {what} once", unit="img", leave=False)
    done = 0
    for x, y, sizes in loader:
        sizes = sizes | {tuple(first.shape)}
        if x is None or len(sizes) > 1:
            raise _sizes_error(sizes)
        images[done:done + len(y)] = x
        labels[done:done + len(y)] = y
        done += len(y)
        if bar is not None:
            bar.update(len(y))
    if bar is not None:
        bar.close()
    logger.info("--resident: %s decoded once: %d images of %s, %.0f MB", what, n,
                "x".join(map(str, first.shape)), need / 1e6)
    return images, labels


class ResidentImages(Dataset):
    """The loader's side of a resident split: item ``i`` is ``(i, label_i)``, so a batch's
    "views" are its indices and the images stay on the device (``images``).

    Attributes of the decoded data set (``targets``, ``classes``, ``num_classes``) are passed
    through; nothing in an item is random (``seeded_items = False``: no per-item seeding)."""

    seeded_items = False

    def __init__(self, dataset: Any, images: Tensor, labels: Tensor) -> None:
        self.dataset, self.images, self.labels = dataset, images, labels
        self.targets = labels.tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return int(index), self.targets[index]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)
