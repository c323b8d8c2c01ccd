"""Optimisers: SGD, AdamW (torch) and LARS (timm), with the papers' parameter groups.

Biases and normalisation parameters (every parameter with ``ndim <= 1``) are excluded from LARS
adaptation always (SimCLR, MoCo v3's ``moco/optimizer.py``: "if not normalization gamma/beta or
bias") and from weight decay by default. The official MoCo v1/v2 SGD and MoCo v3 ViT AdamW apply
weight decay to every parameter; their recipes set ``exclude_from_wd=False`` to match.

Only parameters with ``requires_grad`` are optimised: the momentum (key) encoder and a frozen
patch projection never enter the optimiser.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

__all__ = ["param_groups", "build_optimizer"]

logger = logging.getLogger(__name__)


def param_groups(model: nn.Module, weight_decay: float, *,
                 exclude_from_wd: bool = True) -> list[dict]:
    """Two groups: ``decay`` (weights, ndim >= 2) and ``no_decay`` (biases, norm params).

    Each group carries ``"name"`` and ``"lars_adapt"``; the no-decay group has weight decay 0
    when ``exclude_from_wd`` and never gets LARS adaptation.
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 else decay).append(p)
    groups = []
    if decay:
        groups.append({"name": "decay", "params": decay, "weight_decay": weight_decay,
                       "lars_adapt": True})
    if no_decay:
        groups.append({"name": "no_decay", "params": no_decay,
                       "weight_decay": 0.0 if exclude_from_wd else weight_decay,
                       "lars_adapt": False})
    if not groups:
        raise ValueError("the model has no trainable parameters (requires_grad=False everywhere)")
    return groups


def build_optimizer(model: nn.Module, name: str, *, lr: float, weight_decay: float,
                    momentum: float = 0.9, nesterov: bool = False,
                    betas: tuple[float, float] = (0.9, 0.999), trust_coeff: float = 0.001,
                    exclude_from_wd: bool = True) -> torch.optim.Optimizer:
    """``sgd`` (torch SGD), ``adamw`` (torch AdamW) or ``lars`` (``timm.optim.Lars``).

    For LARS the decay group adapts (``always_adapt=True``, so it adapts even at weight decay
    0) and the no-decay group does not (timm adapts a group only when its weight decay is
    non-zero or ``always_adapt``): trust ratio ``eta * |w| / |g + wd * w|`` as in LARS (You et al.
    2017) and the official MoCo v3 / SimCLR code.
    """
    groups = param_groups(model, weight_decay, exclude_from_wd=exclude_from_wd)
    name = name.lower()
    if name == "sgd":
        for g in groups:
            g.pop("lars_adapt")
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov,
                               weight_decay=weight_decay)
    if name == "adamw":
        for g in groups:
            g.pop("lars_adapt")
        return torch.optim.AdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    if name == "lars":
        from timm.optim import Lars

        for g in groups:
            adapt = g.pop("lars_adapt")
            g["always_adapt"] = adapt
            if not adapt and g["weight_decay"] != 0:
                # timm adapts every group with weight decay != 0: keep norm/bias params out of
                # the adaptation by decaying them by hand is not possible, so say it plainly.
                raise ValueError("LARS with weight decay on biases/norm parameters would also "
                                 "LARS-adapt them; use exclude_from_wd=True with LARS")
        return Lars(groups, lr=lr, momentum=momentum, weight_decay=weight_decay,
                    trust_coeff=trust_coeff, nesterov=nesterov)
    raise ValueError(f"optimizer must be 'sgd', 'adamw' or 'lars', got {name!r}")
