"""Optimisers: SGD, AdamW (torch) and LARS (ours, the official MoCo v3 update), with the papers'
parameter groups.

Biases and normalisation parameters (every parameter with ``ndim <= 1``) are excluded from LARS
adaptation always (SimCLR, MoCo v3's ``moco/optimizer.py``: "if not normalization gamma/beta or
bias") and from weight decay by default. The official MoCo v1/v2 SGD and MoCo v3 ViT AdamW apply
weight decay to every parameter; their recipes set ``exclude_from_wd=False`` to match.

Only parameters with ``requires_grad`` are optimised: the momentum (key) encoder and a frozen
patch projection never enter the optimiser.

A method may declare :class:`~contrastive.methods.ParamGroup` s (``method.param_groups()``): their
own weight decay, a fixed learning rate (:func:`set_lr` writes it, not the schedule's), a multiple of the
scheduled learning rate (``lr_scale``: :func:`set_lr` writes ``lr_scale * lr``, as Barlow Twins'
official code trains biases and norm parameters at 0.0048 / 0.2 of the weights' lr), or no
update for the first N optimiser steps (:func:`hold_frozen_groups`: their gradients dropped, so
neither the weights nor the optimiser state move, as SwAV freezes its prototypes and DINO its last
layer; or, ``frozen_by="lr"``, their lr set to 0 while the optimiser state moves, as DINOv2 freezes
its last layer). Each declared group is split by the same ``ndim`` rule into a
decaying/LARS-adapted part and a norm/bias part.

Groups may also be declared from outside the method (``extra_groups``: a kit's, as the image
kit's ``--init`` backbone group of :mod:`~contrastive.engine.kits.finetune`); they are built
after the method's own and take the same path (their settings are :data:`DECLARED_KEYS`, which
a resume keeps). A method's group keeps its parameters: an extra group takes only those no
group of the method declares.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from contrastive.methods.base import ParamGroup

__all__ = ["param_groups", "build_optimizer", "set_lr", "set_weight_decay", "hold_frozen_groups",
           "LARS", "DECLARED_KEYS", "FLAG_KEYS", "FUSED_OPTIMIZERS", "FUSED_DEVICES",
           "fused_by_default", "optimizer_kernel"]

#: the keys :func:`param_groups` writes from a method's declared groups: the run's settings, which
#: a resumed optimiser state keeps (:meth:`~contrastive.engine.checkpoint.CheckpointManager.load`)
#: rather than the checkpoint's (torch's ``load_state_dict`` takes the saved groups' keys)
DECLARED_KEYS = ("fixed_lr", "lr_scale", "frozen_steps", "frozen_by_lr")
#: the keys :func:`build_optimizer` writes from the run's flags (``--weight-decay``,
#: ``--sgd-momentum``, ``--nesterov``, ``--betas``, ``--lars-trust-coeff``,
#: ``--fused-optimizer``): kept on resume as :data:`DECLARED_KEYS` are, so that a flag changed
#: under ``--allow-config-change`` is used, and the kernel is the one the optimiser was built
#: for (a fused optimiser steps a GradScaler's scaled gradients itself; a loop does not)
FLAG_KEYS = ("weight_decay", "momentum", "nesterov", "betas", "trust_coeff", "fused")

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


def param_groups(model: nn.Module, weight_decay: float, *, exclude_from_wd: bool = True,
                 extra_groups: Sequence[ParamGroup] = ()) -> list[dict]:
    """Optimiser groups: ``decay`` (weights, ndim >= 2) and ``no_decay`` (biases, norm params)
    of every trainable parameter outside the declared groups, then the same split of each group
    ``model.param_groups()`` declares (a method's :class:`ParamGroup` s), then of each of
    ``extra_groups`` (declared from outside the method: a kit's), which take only the parameters
    no group of the method's claims.

    Each group carries ``"name"`` and ``"lars_adapt"`` (plus ``"fixed_lr"`` / ``"lr_scale"`` /
    ``"frozen_steps"``, with ``"frozen_by_lr"`` for those frozen by lr 0, for declared groups
    that set them); a no-decay group has weight decay 0 when
    ``exclude_from_wd`` and never gets LARS adaptation. A parameter in two of the method's
    groups, or in two extra groups, is an error.
    """
    declare = getattr(model, "param_groups", None)
    owner: dict[int, str] = {}
    declared = _claim(list(declare()) if callable(declare) else [], owner)
    declared += _claim(extra_groups, owner)  # after the method's: those keep their parameters
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in owner]
    groups = _split("decay", rest, weight_decay, exclude_from_wd, {})
    for pg in declared:
        extra: dict = {}
        if pg.lr is not None:
            extra["fixed_lr"] = float(pg.lr)
        if pg.lr_scale != 1.0:
            extra["lr_scale"] = float(pg.lr_scale)
        if pg.frozen_steps:
            extra["frozen_steps"] = int(pg.frozen_steps)
            if pg.frozen_by == "lr":
                extra["frozen_by_lr"] = True
        wd = weight_decay if pg.weight_decay is None else float(pg.weight_decay)
        groups += _split(pg.name, [p for p in pg.params if p.requires_grad], wd,
                         exclude_from_wd, extra)
    if not groups:
        raise ValueError("the model has no trainable parameters (requires_grad=False everywhere)")
    return groups


def _claim(declared: Sequence[ParamGroup], owner: dict[int, str]) -> list[ParamGroup]:
    """``declared`` less the parameters ``owner`` holds already (earlier groups keep theirs),
    each remaining one recorded in ``owner``; a parameter in two of ``declared`` is an error."""
    from dataclasses import replace

    before = set(owner)
    kept = []
    for pg in declared:
        params = [p for p in pg.params if id(p) not in before]
        for p in params:
            if id(p) in owner:
                raise ValueError(f"a parameter is in two declared groups: {owner[id(p)]!r} and "
                                 f"{pg.name!r}")
            owner[id(p)] = pg.name
        kept.append(pg if len(params) == len(pg.params) else replace(pg, params=params))
    return kept


class LARS(torch.optim.Optimizer):
    """SGD with momentum and LARS's layer-wise trust ratio (You et al. 2017, arXiv 1708.03888).

    Per parameter ``w`` with gradient ``g``, in a group with ``lars_adapt`` (weights):
    ``d = (g + wd w) * eta |w| / |g + wd w|`` (ratio 1 when either norm is 0); in other groups
    ``d = g + wd w``. Then ``mu = momentum mu + d`` and ``w -= lr mu`` (``w -= lr (d + momentum
    mu)`` with Nesterov).

    The ratio's denominator follows the authors' code, the official MoCo v3
    (``moco/optimizer.py``: ``update_norm = |dp + wd p|``) and SimCLR (``lars_optimizer.py``,
    weight decay added to the gradient before its norm), not the paper's Algorithm 1 nor timm's
    ``Lars``, which divide by ``|g| + wd |w|`` (+ eps): the two differ by about ``wd |w| / |g|``
    relative, which float32 tests could not tell apart.
    """

    def __init__(self, params: Any, lr: float, *, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coeff: float = 0.001,
                 nesterov: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0 or trust_coeff <= 0:
            raise ValueError(f"LARS: lr, momentum, weight_decay must be >= 0 and trust_coeff > 0,"
                             f" got {lr}, {momentum}, {weight_decay}, {trust_coeff}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coeff=trust_coeff, nesterov=nesterov, lars_adapt=True)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=g["weight_decay"]) if g["weight_decay"] else p.grad
                if g["lars_adapt"]:
                    w_norm, d_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(d)
                    ratio = torch.where((w_norm > 0) & (d_norm > 0),
                                        g["trust_coeff"] * w_norm / d_norm,
                                        torch.ones_like(w_norm))
                    d = d * ratio  # on the device: no host sync
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                mu = state["momentum_buffer"]
                mu.mul_(g["momentum"]).add_(d)
                p.add_(d.add(mu, alpha=g["momentum"]) if g["nesterov"] else mu, alpha=-g["lr"])
        return loss


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write the scheduled ``lr`` into every group: ``lr * lr_scale`` (1 unless declared), or
    the group's ``fixed_lr``."""
    for g in optimizer.param_groups:
        fixed = g.get("fixed_lr")
        g["lr"] = lr * g.get("lr_scale", 1.0) if fixed is None else fixed


def set_weight_decay(optimizer: torch.optim.Optimizer, weight_decay: float) -> None:
    """Apply a method's ``"weight_decay"`` schedule (DINO's cosine 0.04 -> 0.4) to the groups
    that decay: those built with a weight decay > 0 (biases, norm parameters and groups declared
    with ``weight_decay=0`` stay at 0). The choice is recorded in the group (``"decays"``), so it
    survives a resume through the optimiser's state dict."""
    for g in optimizer.param_groups:
        if g.setdefault("decays", g["weight_decay"] > 0):
            g["weight_decay"] = weight_decay


def hold_frozen_groups(optimizer: torch.optim.Optimizer, step: int) -> None:
    """Before the clip and ``optimizer.step()`` of optimiser step ``step`` (0-based), in the
    groups frozen for more than ``step`` steps: drop the gradients (SGD, AdamW and LARS then
    skip them entirely: DINO v1's ``cancel_gradients_last_layer``), or with ``frozen_by_lr`` set
    the lr to 0 (the next :func:`set_lr` writes it again; DINOv2's zeroed last-layer lr)."""
    for g in optimizer.param_groups:
        if g.get("frozen_steps", 0) > step:
            if g.get("frozen_by_lr", False):
                g["lr"] = 0.0
            else:
                for p in g["params"]:
                    p.grad = None


#: The optimisers with one of torch's fused kernels, and the devices this engine uses them on.
FUSED_OPTIMIZERS, FUSED_DEVICES = ("sgd", "adamw"), ("cpu", "cuda")


def fused_by_default(name: str, device_type: str) -> bool:
    """Whether an unset ``fused`` picks torch's fused kernel: for SGD and AdamW on the CPU and
    CUDA. One kernel updates every parameter of a group, instead of torch's default
    per-parameter loop on the CPU (and ``foreach`` lists on CUDA): on a 2-core AVX2 CPU at 1
    thread the AdamW step of a 4 x 312 BERT (14.3 M parameters) took 26 ms fused against 213
    looped, its whole training step 1.18x faster; SGD on cifar_resnet18 2.6x and 1.02x
    (``benchmarks/bench_optimizer.py``, ``benchmarks/results/train.md``). The update is the
    same formula up to float rounding."""
    return name.lower() in FUSED_OPTIMIZERS and device_type in FUSED_DEVICES


def optimizer_kernel(optimizer: torch.optim.Optimizer) -> str:
    """The kernel ``optimizer``'s groups step with: ``fused``, ``foreach`` or ``for-loop``
    (torch's default on the CPU; LARS is ours and loops), as its param groups say: after a
    resume, this run's (the checkpoint's optimiser state brings its own, which
    :meth:`~contrastive.engine.checkpoint.CheckpointManager.load` replaces)."""
    groups = getattr(optimizer, "param_groups", [{}])
    if any(g.get("fused") for g in groups):
        return "fused"
    return "foreach" if any(g.get("foreach") for g in groups) else "for-loop"


def build_optimizer(model: nn.Module, name: str, *, lr: float, weight_decay: float,
                    momentum: float = 0.9, nesterov: bool = False,
                    betas: tuple[float, float] = (0.9, 0.999), trust_coeff: float = 0.001,
                    exclude_from_wd: bool = True, fused: bool | None = None,
                    device_type: str | None = None,
                    extra_groups: Sequence[ParamGroup] = ()) -> torch.optim.Optimizer:
    """``sgd`` (torch SGD), ``adamw`` (torch AdamW) or ``lars`` (:class:`LARS`), over
    :func:`param_groups` (``extra_groups``: groups declared from outside the method).

    For LARS the decay group adapts (even at weight decay 0) and the no-decay group (biases,
    norm parameters) does not, as the official MoCo v3 / SimCLR code. ``fused``: torch's fused
    kernel for SGD and AdamW (True), torch's default implementation (False), or None: fused
    where :func:`fused_by_default` says so for ``device_type`` (the device the model trains
    on; default: its parameters' device). LARS has no fused kernel: ``fused=True`` with it
    raises ``ValueError``.
    """
    name = name.lower()
    if fused is None:
        if device_type is None:
            device_type = next(model.parameters(), torch.empty(0)).device.type
        fused = fused_by_default(name, device_type)
    if fused and name not in FUSED_OPTIMIZERS:
        raise ValueError(f"--fused-optimizer: {name} has no fused kernel (only "
                         f"{' and '.join(FUSED_OPTIMIZERS)}); leave it unset or pass false")
    kernel = {"fused": True} if fused else {}
    groups = param_groups(model, weight_decay, exclude_from_wd=exclude_from_wd,
                          extra_groups=extra_groups)
    for g in groups:  # the lr before the first set_lr: as set_lr would write it
        g["lr"] = g.get("fixed_lr", lr * g.get("lr_scale", 1.0))
    if name == "sgd":
        for g in groups:
            g.pop("lars_adapt")
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov,
                               weight_decay=weight_decay, **kernel)
    if name == "adamw":
        for g in groups:
            g.pop("lars_adapt")
        return torch.optim.AdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay, **kernel)
    if name == "lars":
        return LARS(groups, lr=lr, momentum=momentum, weight_decay=weight_decay,
                    trust_coeff=trust_coeff, nesterov=nesterov)
    raise ValueError(f"optimizer must be 'sgd', 'adamw' or 'lars', got {name!r}")
