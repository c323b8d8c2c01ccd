"""Optimisers: SGD, AdamW (torch) and LARS (timm), with the papers' parameter groups.

Biases and normalisation parameters (every parameter with ``ndim <= 1``) are excluded from LARS
adaptation always (SimCLR, MoCo v3's ``moco/optimizer.py``: "if not normalization gamma/beta or
bias") and from weight decay by default. The official MoCo v1/v2 SGD and MoCo v3 ViT AdamW apply
weight decay to every parameter; their recipes set ``exclude_from_wd=False`` to match.

Only parameters with ``requires_grad`` are optimised: the momentum (key) encoder and a frozen
patch projection never enter the optimiser.

A method may declare :class:`~contrastive.methods.ParamGroup` s (``method.param_groups()``): their
own weight decay, a fixed learning rate (:func:`set_lr` leaves it alone), or no update for the
first N optimiser steps (:func:`drop_frozen_grads` drops their gradients, so neither the weights
nor the optimiser state move, as SwAV freezes its prototypes). Each declared group is split by the
same ``ndim`` rule into a decaying/LARS-adapted part and a norm/bias part.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

__all__ = ["param_groups", "build_optimizer", "set_lr", "drop_frozen_grads"]

logger = logging.getLogger(__name__)


def _split(name: str, params: list[nn.Parameter], weight_decay: float, exclude_from_wd: bool,
           extra: dict) -> list[dict]:
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    groups = []
    if decay:
        groups.append({"name": name, "params": decay, "weight_decay": weight_decay,
                       "lars_adapt": True, **extra})
    if no_decay:
        groups.append({"name": f"{name}_no_decay" if name != "decay" else "no_decay",
                       "params": no_decay,
                       "weight_decay": 0.0 if exclude_from_wd else weight_decay,
                       "lars_adapt": False, **extra})
    return groups


def param_groups(model: nn.Module, weight_decay: float, *,
                 exclude_from_wd: bool = True) -> list[dict]:
    """Optimiser groups: ``decay`` (weights, ndim >= 2) and ``no_decay`` (biases, norm params)
    of every trainable parameter outside the model's declared groups, then the same split of
    each group ``model.param_groups()`` declares (a method's :class:`ParamGroup` s).

    Each group carries ``"name"`` and ``"lars_adapt"`` (plus ``"fixed_lr"`` / ``"frozen_steps"``
    for declared groups that set them); a no-decay group has weight decay 0 when
    ``exclude_from_wd`` and never gets LARS adaptation. A parameter declared twice is an error.
    """
    declare = getattr(model, "param_groups", None)
    declared = list(declare()) if callable(declare) else []
    owner: dict[int, str] = {}
    for pg in declared:
        for p in pg.params:
            if id(p) in owner:
                raise ValueError(f"a parameter is in two declared groups: {owner[id(p)]!r} and "
                                 f"{pg.name!r}")
            owner[id(p)] = pg.name
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in owner]
    groups = _split("decay", rest, weight_decay, exclude_from_wd, {})
    for pg in declared:
        extra: dict = {}
        if pg.lr is not None:
            extra["fixed_lr"] = float(pg.lr)
        if pg.frozen_steps:
            extra["frozen_steps"] = int(pg.frozen_steps)
        wd = weight_decay if pg.weight_decay is None else float(pg.weight_decay)
        groups += _split(pg.name, [p for p in pg.params if p.requires_grad], wd,
                         exclude_from_wd, extra)
    if not groups:
        raise ValueError("the model has no trainable parameters (requires_grad=False everywhere)")
    return groups


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write the scheduled ``lr`` into every group but those with a ``fixed_lr``."""
    for g in optimizer.param_groups:
        fixed = g.get("fixed_lr")
        g["lr"] = lr if fixed is None else fixed


def drop_frozen_grads(optimizer: torch.optim.Optimizer, step: int) -> None:
    """Before ``optimizer.step()`` of optimiser step ``step`` (0-based): drop the gradients of
    groups frozen for more than ``step`` steps (SGD, AdamW and LARS then skip them entirely)."""
    for g in optimizer.param_groups:
        if g.get("frozen_steps", 0) > step:
            for p in g["params"]:
                p.grad = None


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
