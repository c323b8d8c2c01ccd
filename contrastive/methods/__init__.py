"""Contrastive methods: nn.Modules that take a list of augmented views and return the loss.

``MoCo`` (v1/v2, queue), ``MoCoV3`` (no queue, predictor), ``SimCLR`` (NT-Xent, in-batch),
``Distiller`` (COS-NCE contrastive distillation of a frozen teacher into a student, LRC-BERT).

Common surface (what the engine relies on):

- ``forward(views: Sequence[Tensor], momentum: float | None = None) -> dict`` with ``loss``
  (scalar with grad), ``pos_acc`` (% of positives ranked top-1 within the logits), ``pos_sim``,
  ``neg_sim`` (mean cosine similarities), ``embeddings`` (detached unit outputs (N, D)); all on
  the device, no host sync. The momentum (EMA) update runs inside forward before the keys are
  computed, the queue update after the loss, both without gradient.
- ``method.encoder``: the query backbone without head (what gets exported).
- ``uses_in_batch_negatives`` (gradient accumulation changes the negatives when True) and
  ``momentum_schedule`` (``"constant"``, ``"cosine"`` or None) class attributes.
- ``presets`` and ``from_preset(name, **overrides)``: the papers' settings.
- Parameters of momentum encoders have ``requires_grad=False``: build the optimizer from
  ``[p for p in method.parameters() if p.requires_grad]``.

``get_method(name, **kwargs)`` / ``list_methods()`` build them by name (``moco``, ``mocov3``,
``simclr``, ``distill``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from contrastive.methods.distill import Distiller
from contrastive.methods.moco import MoCo
from contrastive.methods.moco_v3 import MoCoV3
from contrastive.methods.simclr import SimCLR

__all__ = ["Distiller", "MoCo", "MoCoV3", "SimCLR", "get_method", "list_methods"]

_METHODS: dict[str, type[nn.Module]] = {
    "distill": Distiller,
    "moco": MoCo, "mocov3": MoCoV3, "simclr": SimCLR}


def list_methods() -> list[str]:
    """Names accepted by :func:`get_method`."""
    return sorted(_METHODS)


def get_method(name: str, **kwargs: Any) -> nn.Module:
    """Build a method by name; ``preset="v2"`` etc. selects one of its ``presets``."""
    key = name.lower().replace("_", "").replace("-", "")
    if key not in _METHODS:
        raise KeyError(f"get_method: unknown method {name!r}; known: {list_methods()}")
    cls = _METHODS[key]
    preset = kwargs.pop("preset", None)
    return cls.from_preset(preset, **kwargs) if preset else cls(**kwargs)
