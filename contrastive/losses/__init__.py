"""Contrastive losses behind one registry; imports torch only.

Use by name (the registry) or by class / function::

    from contrastive.losses import get_loss, list_losses
    loss_fn = get_loss("infonce", temperature=0.2)       # an nn.Module
    loss = loss_fn(q, k, queue)                            # MoCo: queue (K, D) of negatives

    from contrastive.losses import functional as LF
    loss = LF.ntxent(z1, z2, temperature=0.5)

Registered names: ``infonce``, ``ntxent``, ``cosnce``, ``supcon``, ``dcl``, ``dclw``, ``siglip``,
``kd``, ``byol``, ``simsiam``, ``barlow_twins``, ``vicreg``, ``vicregl_local``, ``swav``, ``dino``, ``dim``, ``mae``,
``simmim``, ``densecl``, ``ibot_patch``, ``koleo``, ``msn``, ``pmsn``, ``ijepa`` (see ``list_losses()``). Add yours with ``@register_loss("name")``. Inputs may be half precision: the maths runs in float32 and the
result is float32.

Batch-level losses (``barlow_twins``, ``vicreg``, ``vicregl_local``, ``msn``, ``pmsn``; ``loss_class(name).batch_level`` is True) are
statistics of the whole batch: pass the GLOBAL batch (gathered with gradient) and
``reduction="mean"`` only (see :mod:`contrastive.losses.decorrelation`).
"""

from __future__ import annotations

from . import (
    clustering,
    decorrelation,
    dense,
    dinov2,
    functional,
    masked_siamese,
    mutual_info,
    reconstruction,
    regression,
)
from .clustering import DINOLoss, SwAVLoss
from .decorrelation import BarlowTwinsLoss, VICRegLLocalLoss, VICRegLoss
from .dense import DenseInfoNCELoss
from .dinov2 import IBOTPatchLoss, KoLeoLoss
from .masked_siamese import MSNLoss, PMSNLoss
from .modules import (
    BaseLoss,
    CosNCELoss,
    DCLLoss,
    DCLWLoss,
    InfoNCELoss,
    KDLoss,
    NTXentLoss,
    SigLIPLoss,
    SupConLoss,
)
from .mutual_info import DIMLoss
from .reconstruction import MAELoss, SimMIMLoss
from .registry import UnknownLossError, get_loss, list_losses, loss_class, register_loss
from .regression import BYOLLoss, IJEPALoss, SimSiamLoss

__all__ = [
    "BYOLLoss",
    "BarlowTwinsLoss",
    "BaseLoss",
    "DIMLoss",
    "DINOLoss",
    "CosNCELoss",
    "DCLLoss",
    "DCLWLoss",
    "DenseInfoNCELoss",
    "IBOTPatchLoss",
    "IJEPALoss",
    "InfoNCELoss",
    "KDLoss",
    "KoLeoLoss",
    "MAELoss",
    "MSNLoss",
    "PMSNLoss",
    "SimMIMLoss",
    "NTXentLoss",
    "SigLIPLoss",
    "SimSiamLoss",
    "SwAVLoss",
    "SupConLoss",
    "UnknownLossError",
    "VICRegLLocalLoss",
    "VICRegLoss",
    "clustering",
    "decorrelation",
    "dense",
    "dinov2",
    "functional",
    "get_loss",
    "list_losses",
    "loss_class",
    "masked_siamese",
    "mutual_info",
    "reconstruction",
    "register_loss",
    "regression",
]
