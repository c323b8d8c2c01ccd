"""The common surface of our data sets: ``(transform(image), label)`` items, labels known upfront;
the one policy for unreadable images (:class:`SkipUnreadable`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import Dataset

from contrastive.data.io import CorruptImageError

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


class SkipUnreadable(LabelledDataset):
    """Base of data sets read from image files or tar members: what happens to unreadable images.

    Strict off (default): a corrupt image is logged once (naming it), counted in
    :attr:`num_skipped` (shared memory: all loader workers together) and replaced by the next
    readable item (with that item's label). The generator state is restored before the
    replacement's transform, so its views are those it draws when the bad item is already
    known (an encoded image fails inside the transform, after random draws). Strict on: the
    first unreadable image raises :class:`~contrastive.data.io.CorruptImageError`.

    Subclasses call :meth:`_init_skips` at the end of ``__init__``, then :meth:`_check_up_front`
    with ``(index, problem or None)`` pairs, and provide :meth:`item_name` (for messages), the
    attributes ``unit`` ("file", "sample") and ``fix`` (what a user does about a bad one), and
    :meth:`where` (the whole data set, for messages).
    """

    unit = "image"
    fix = "replace it"

    def _init_skips(self, strict: bool) -> None:
        self.strict = strict
        # one byte per item, in shared memory so that loader workers see each other's findings
        self._bad = torch.zeros(len(self), dtype=torch.uint8).share_memory_()

    def item_name(self, index: int) -> str:  # pragma: no cover - abstract
        """Item ``index`` as messages name it (a path, ``shard.tar:key.ext``)."""
        raise NotImplementedError

    def where(self) -> str:  # pragma: no cover - abstract
        """The whole data set as messages name it (``under ROOT``, ``in 3 shard(s)``)."""
        raise NotImplementedError

    def _check_up_front(self, checks: Iterable[tuple[int, str | None]]) -> None:
        """Strict: every item, failing on the first bad one; else until one item is readable
        (a data set of nothing but unreadable images fails at once, naming it)."""
        t0 = time.perf_counter()
        first_problem = None
        for j, problem in checks:
            if problem is None:
                if not self.strict:
                    return
                continue
            if self.strict:
                raise CorruptImageError(
                    f"{problem} ({self.unit} {j + 1} of {len(self)} {self.where()}; strict mode "
                    f"(--strict-data) checks every {self.unit} before training: {self.fix}, or "
                    f"leave strict mode off to skip unreadable {self.unit}s)")
            first_problem = first_problem or problem
            self._mark_bad(j, problem)
        if not self.strict:
            raise CorruptImageError(
                f"no readable image {self.where()}: all {len(self)} image {self.unit}s are "
                f"unreadable (first: {first_problem})")
        logging.getLogger(type(self).__module__).info(
            "strict mode: checked all %d image %ss %s in %.1f s, all readable", len(self),
            self.unit, self.where(), time.perf_counter() - t0)

    def _mark_bad(self, j: int, reason: object) -> None:
        if not self._bad[j]:
            self._bad[j] = 1
            logging.getLogger(type(self).__module__).warning(
                "skipping unreadable image %s (%s; %d skipped so far; strict=True makes this an "
                "error)", self.item_name(j), reason, self.num_skipped)

    @property
    def num_skipped(self) -> int:
        """Distinct unreadable items met so far (all loader workers together)."""
        return int(self._bad.sum())

    def skipped(self) -> list[int]:
        """Indices of the unreadable items met so far."""
        return self._bad.nonzero().flatten().tolist()

    def _item(self, index: int, image: Any) -> tuple[Any, ...]:
        """The item returned for readable ``index`` (a subclass adds fields, e.g. captions)."""
        return image, self.targets[index]

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a data set of {n} items")
        index %= n
        for step in range(n):
            j = (index + step) % n
            if self._bad[j]:
                continue
            state = torch.get_rng_state() if self.transform is not None else None
            try:
                img = self.load(j)
                if self.transform is not None:
                    img = self.transform(img)
            except CorruptImageError as e:
                if self.strict:
                    raise
                self._mark_bad(j, e)
                if state is not None:
                    torch.set_rng_state(state)
                continue
            return self._item(j, img)
        raise CorruptImageError(f"no readable image {self.where()} ({n} {self.unit}s, all unreadable)")
