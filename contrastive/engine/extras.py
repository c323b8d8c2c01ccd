"""Per-sample inputs beyond views, labels and indices (image-text: CLIP's token ids).

A data set whose items are ``(image, label, fields)``, with ``fields`` a dict of tensors of the
same shape for every sample, declares the field names as ``extra_keys`` (e.g.
:class:`~contrastive.data.captions.ImageTextDataset`: ``("input_ids", "attention_mask")``). The
loader's default collate stacks them, and the training loop passes those a method ``needs``
on to ``batch`` next to ``views`` / ``labels`` / ``indices``. Data sets without extra fields are
unchanged (items ``(image, label)``).

The trainer uses three calls: :func:`extra_keys` (what the data set provides, checked against
the method's ``needs`` before training), :func:`split_item` (a loader batch into its parts) and
:func:`add_extras` (the needed fields, on the device, into ``batch``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["extra_keys", "split_item", "add_extras"]


def extra_keys(dataset: Any) -> tuple[str, ...]:
    """The per-sample fields ``dataset`` provides besides image and label (``extra_keys``)."""
    return tuple(getattr(dataset, "extra_keys", ()))


def split_item(item: Sequence[Any]) -> tuple[Any, Tensor, Tensor, Mapping[str, Tensor]]:
    """``(views, labels, indices, fields)`` of one collated loader batch: ``(views, labels,
    indices)`` (fields empty) or ``(views, labels, fields, indices)``."""
    if len(item) == 3:
        views, labels, indices = item
        return views, labels, indices, {}
    if len(item) == 4 and isinstance(item[2], Mapping):
        views, labels, fields, indices = item
        return views, labels, indices, fields
    raise ValueError(f"a loader batch of {len(item)} parts; data set items must be (image, label) "
                     "or (image, label, dict of per-sample tensors)")


def add_extras(batch: MutableMapping[str, Any], fields: Mapping[str, Tensor],
               needs: Iterable[str], device: torch.device) -> None:
    """Put the fields a method ``needs`` into ``batch``, on ``device``."""
    for key in needs:
        if key in fields:
            batch[key] = fields[key].to(device, non_blocking=True)
