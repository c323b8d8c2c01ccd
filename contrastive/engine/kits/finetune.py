"""Fine-tuning controls for a backbone that starts from pretrained weights (issue 49 step 3): a
backbone learning-rate multiplier, a warm start that holds the backbone still for its first N
optimiser steps (the heads train first, then everything), and BatchNorm statistics frozen.

:class:`FinetuneFields` declares the flags once (a kit's configuration inherits them, as
:class:`~contrastive.engine.kits.init.InitFields`); :func:`apply_finetune` is what a kit's
``prepare_method`` does with them. The multiplier and the warm start are a declared
:class:`~contrastive.methods.ParamGroup` (``lr_scale``, ``frozen_steps``), so the optimiser
builds them like a method's own groups and a resume keeps this run's settings
(:data:`~contrastive.engine.optim.DECLARED_KEYS`).

What the field does, and where the defaults come from:

- A smaller lr for the pretrained backbone than for the new heads: Lightning's
  ``BackboneFinetuning`` (``backbone_initial_ratio_lr=0.1``), fastai's discriminative lr
  (``fine_tune(lr_mult=100)``: the first layers at 1/100 of the last), DINOv2's
  ``layerwise_decay: 0.9`` and ``patch_embed_lr_mult: 0.2``
  (``dinov2/configs/ssl_default_config.yaml``), BEiT / timm's ``--layer-decay``.
- Heads first, then everything: fastai's ``fine_tune(freeze_epochs=1)``, Lightning's
  ``BackboneFinetuning(unfreeze_backbone_at_epoch=10)``; the same mechanism as DINO's frozen last
  layer (gradients dropped: :func:`~contrastive.engine.optim.hold_frozen_groups`).
- BatchNorm statistics frozen (the layers normalise with their running statistics, which never
  change; their affine weights still train): torchvision's ``references/.../norm.py
  freeze_batch_norm`` (``m.eval()``), timm's ``freeze_batch_norm_2d`` and detectron2's
  ``FrozenBatchNorm2d`` (fixed statistics), Lightning's ``train_bn``.

Without ``--init`` every control defaults to off (the run is what it was, bit for bit); with it,
to :data:`WITH_INIT` (see ``benchmarks/results/init.md`` for the measurement behind them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from contrastive.engine.fields import help_field
from contrastive.methods.base import ParamGroup

__all__ = ["FinetuneFields", "FinetuneSettings", "WITH_INIT", "WITHOUT_INIT", "resolve_finetune",
           "apply_finetune", "freeze_bn_stats"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinetuneSettings:
    """The resolved controls: ``lr_scale`` of the backbone's lr, ``frozen_steps`` optimiser
    steps with the backbone held still, ``freeze_bn`` its BatchNorm statistics fixed."""

    lr_scale: float = 1.0
    frozen_steps: int = 0
    freeze_bn: bool = False

    @property
    def active(self) -> bool:
        return self != WITHOUT_INIT


#: without --init: nothing changes
WITHOUT_INIT = FinetuneSettings()
#: with --init: the backbone at 1/10 of the heads' lr (Lightning's ``backbone_initial_ratio_lr``)
#: and its BatchNorm statistics kept (a one-process MoCo without shuffle BN would otherwise
#: overwrite ImageNet's statistics with those of 64-image batches); no warm start
WITH_INIT = FinetuneSettings(lr_scale=0.1, frozen_steps=0, freeze_bn=True)


@dataclass
class FinetuneFields:
    """The fine-tuning flags (a kit's configuration inherits them with its other fields); unset
    (None) = :data:`WITH_INIT`'s value with ``--init``, :data:`WITHOUT_INIT`'s without."""

    backbone_lr_scale: float | None = help_field(
        None, "the backbone's learning rate as a multiple of the run's (the heads keep 1); "
        f"unset = {WITH_INIT.lr_scale} with --init, 1 without")
    backbone_frozen_steps: int | None = help_field(
        None, "hold the backbone still for the first N optimiser steps (the heads train "
        f"first, then everything); unset = {WITH_INIT.frozen_steps} with --init, 0 without")
    freeze_bn_stats: bool | None = help_field(
        None, "keep the backbone's BatchNorm running statistics fixed and normalise with them "
        f"(their affine weights train); unset = {WITH_INIT.freeze_bn} with --init, false "
        "without")


def resolve_finetune(cfg: FinetuneFields, pretrained: bool) -> FinetuneSettings:
    """The controls of ``cfg``, unset ones by ``pretrained`` (``--init`` given), written back on
    ``cfg`` (the run's copy, which config.json records). A bad value is a one-line
    ``ValueError``."""
    base = WITH_INIT if pretrained else WITHOUT_INIT
    if cfg.backbone_lr_scale is None:
        cfg.backbone_lr_scale = base.lr_scale
    if cfg.backbone_frozen_steps is None:
        cfg.backbone_frozen_steps = base.frozen_steps
    if cfg.freeze_bn_stats is None:
        cfg.freeze_bn_stats = base.freeze_bn
    if cfg.backbone_lr_scale < 0:
        raise ValueError(f"--backbone-lr-scale must be >= 0, got {cfg.backbone_lr_scale}")
    if cfg.backbone_frozen_steps < 0:
        raise ValueError(f"--backbone-frozen-steps must be >= 0, got {cfg.backbone_frozen_steps}")
    return FinetuneSettings(float(cfg.backbone_lr_scale), int(cfg.backbone_frozen_steps),
                            bool(cfg.freeze_bn_stats))


def apply_finetune(method: nn.Module, backbones: Sequence[nn.Module],
                   settings: FinetuneSettings) -> None:
    """Give ``method`` the controls for its ``backbones`` (those its recipe built from
    ``--encoder``): a declared ``backbone`` group (its trainable parameters that no group of the
    method's claims) with ``lr_scale`` and ``frozen_steps``, and BatchNorm statistics frozen in
    every module of a backbone's class (the momentum encoder, the teacher: copies of it).
    Nothing with the controls off."""
    if not settings.active:
        return
    if not backbones:
        raise ValueError("--backbone-lr-scale / --backbone-frozen-steps / --freeze-bn-stats: the "
                         "method built no --encoder backbone to apply them to; leave them unset")
    if settings.lr_scale != 1.0 or settings.frozen_steps:
        _declare_backbone_group(method, backbones, settings)
    if settings.freeze_bn:
        kinds = tuple({type(b) for b in backbones})
        frozen = sum(freeze_bn_stats(m) for m in method.modules() if isinstance(m, kinds))
        logger.info("BatchNorm statistics frozen in %d layers of the backbone and its copies",
                    frozen)


def _declare_backbone_group(method: nn.Module, backbones: Sequence[nn.Module],
                            settings: FinetuneSettings) -> None:
    declare = getattr(method, "param_groups", None)
    own: list[ParamGroup] = list(declare()) if callable(declare) else []
    claimed = {id(p) for g in own for p in g.params}
    seen: set[int] = set()
    params = []
    for backbone in backbones:
        for p in backbone.parameters():
            if p.requires_grad and id(p) not in claimed and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    group = ParamGroup("backbone", params, lr_scale=settings.lr_scale,
                       frozen_steps=settings.frozen_steps)

    def param_groups() -> list[ParamGroup]:
        return [*(declare() if callable(declare) else []), group]

    # the instance's groups: the method's own, then the backbone's (optim.param_groups reads them)
    method.param_groups = param_groups  # type: ignore[assignment]
    logger.info("backbone: %d parameter tensors at %g x the lr%s", len(params), settings.lr_scale,
                f", held still for the first {settings.frozen_steps} optimiser steps"
                if settings.frozen_steps else "")


def _hold_eval(module: nn.Module, args: Any) -> None:
    module.training = False


def freeze_bn_stats(module: nn.Module) -> int:
    """Every BatchNorm layer in ``module`` normalises with its running statistics and never
    updates them, even in ``train()`` mode (a forward pre-hook puts it in eval mode, as
    torchvision's ``freeze_batch_norm``; the affine weights still get gradients). Returns the
    number of layers."""
    layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in layers:
        if not getattr(m, "_bn_stats_frozen", False):
            m.register_forward_pre_hook(_hold_eval)
            m._bn_stats_frozen = True  # type: ignore[assignment]
    return len(layers)
