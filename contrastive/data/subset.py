"""Subsets that keep the data set's surface (targets, classes, skip counts): low-shot labels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from contrastive.data.base import UNLABELLED, dataset_len


class SubsetDataset(Dataset):
    """``dataset`` restricted to ``indices``; ``targets``, ``classes``, ``num_classes`` and
    ``transform`` follow the parent (setting ``transform`` here sets it on the parent)."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = [int(i) for i in indices]
        parent = getattr(dataset, "targets", None)
        self.targets = [int(parent[i]) for i in self.indices] if parent is not None else None

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]

    @property
    def transform(self) -> Any:
        return getattr(self.dataset, "transform", None)

    @transform.setter
    def transform(self, value: Any) -> None:
        # setattr: the parent may be any data set (torch's Dataset declares no transform)
        setattr(self.dataset, "transform", value)  # noqa: B010

    def __getattr__(self, name: str) -> Any:
        # classes, num_classes, num_skipped, ... come from the parent
        if name in ("dataset", "indices", "targets") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"SubsetDataset({len(self)} of {self.dataset!r})"


def subset_fraction(dataset: Dataset, fraction: float, seed: int = 0) -> SubsetDataset:
    """A deterministic ``fraction`` of ``dataset`` (e.g. 0.01 / 0.1 for 1 % / 10 % labels).

    Stratified when labels are known: ``max(1, round(fraction * count))`` images of each
    class, chosen with ``seed``; uniform otherwise. Indices are returned sorted.
    """
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1]; got {fraction}")
    n = dataset_len(dataset)
    rng = np.random.default_rng(seed)
    targets = getattr(dataset, "targets", None)
    if targets is None or all(int(t) == UNLABELLED for t in targets):
        k = max(1, round(fraction * n)) if n else 0
        chosen = rng.choice(n, size=k, replace=False)
    else:
        t = np.asarray([int(v) for v in targets])
        per_class = []
        for c in np.unique(t):
            members = np.flatnonzero(t == c)
            k = min(len(members), max(1, round(fraction * len(members))))
            per_class.append(rng.choice(members, size=k, replace=False))
        chosen = np.concatenate(per_class)
    return SubsetDataset(dataset, sorted(chosen.tolist()))
