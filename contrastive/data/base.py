"""The common surface of our data sets: ``(transform(image), label)`` items, labels known upfront."""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from typing import Any

from torch.utils.data import Dataset

UNLABELLED = -1


def dataset_len(dataset: Dataset) -> int:
    """``len(dataset)`` of a map-style data set (``Dataset`` itself does not declare
    ``__len__``); one without it raises a ``TypeError`` that says so."""
    if not isinstance(dataset, Sized):
        raise TypeError(f"{type(dataset).__name__} has no len(): a map-style data set with "
                        "__len__ and __getitem__ is needed")
    return len(dataset)


class LabelledDataset(Dataset):
    """Base class: subclasses implement ``load(index) -> image``.

    Attributes:
        targets: list of int labels, ``-1`` for unlabelled images (known without decoding, so
            that subsets can be stratified and kNN monitors can read them).
        classes: class names (index = label), empty when unlabelled.
        num_classes: ``len(classes)`` or None when unlabelled.
        transform: applied to the loaded image; None returns the image itself.
    """

    classes: list[str] = []

    def __init__(
        self,
        targets: Sequence[int],
        transform: Callable[[Any], Any] | None = None,
        num_classes: int | None = None,
    ) -> None:
        self.targets = list(targets)
        self.transform = transform
        self.num_classes = num_classes

    def __len__(self) -> int:
        return len(self.targets)

    def load(self, index: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a data set of {len(self)} items")
        index = index % len(self)
        img = self.load(index)
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[index]
