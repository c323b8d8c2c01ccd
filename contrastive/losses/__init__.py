"""Contrastive losses behind one registry; imports torch only.

Use by name (the registry) or by class / function::

    from contrastive.losses import get_loss, list_losses
    loss_fn = get_loss("infonce", temperature=0.2)       # an nn.Module
    loss = loss_fn(q, k, queue)                            # MoCo: queue (K, D) of negatives

    from contrastive.losses import functional as LF
    loss = LF.ntxent(z1, z2, temperature=0.5)

Registered names: ``infonce``, ``ntxent``, ``cosnce``, ``supcon``, ``dcl``, ``kd`` (see
``list_losses()``). Add yours with ``@register_loss("name")``. Inputs may be half precision: the
softmax maths runs in float32 and the result is float32.
"""

from __future__ import annotations

from . import functional
from .modules import (
    BaseLoss,
    CosNCELoss,
    DCLLoss,
    InfoNCELoss,
    KDLoss,
    NTXentLoss,
    SupConLoss,
)
from .registry import UnknownLossError, get_loss, list_losses, loss_class, register_loss

__all__ = [
    "BaseLoss",
    "CosNCELoss",
    "DCLLoss",
    "InfoNCELoss",
    "KDLoss",
    "NTXentLoss",
    "SupConLoss",
    "UnknownLossError",
    "functional",
    "get_loss",
    "list_losses",
    "loss_class",
    "register_loss",
]
