"""Fine-tuning controls for a backbone that starts from pretrained weights (issue 49 step 3): a
backbone learning-rate multiplier, a warm start that holds the backbone still for its first N
optimiser steps (the heads train first, then everything), and BatchNorm statistics frozen.

:class:`FinetuneFields` declares the flags once (a kit's configuration inherits them, as
:class:`~contrastive.engine.kits.init.InitFields`); :func:`resolve_finetune` reads them (in the
kit's ``prepare``: a bad value is one line before the run folder exists),
:func:`freeze_backbone_bn` is what the kit's ``prepare_method`` does with them and
:func:`backbone_groups` what its ``param_groups`` declares to the optimiser: a
:class:`~contrastive.methods.ParamGroup` with ``lr_scale`` and ``frozen_steps``, built like a
method's own groups (:func:`~contrastive.engine.optim.param_groups`), so that a checkpoint keeps
its settings and a resume restores this run's (:data:`~contrastive.engine.optim.DECLARED_KEYS`).

What others do (each checked in the source named):

- A smaller lr for the pretrained backbone than for the new heads. Lightning's
  ``BackboneFinetuning`` (``src/lightning/pytorch/callbacks/finetuning.py``): the backbone,
  frozen until ``unfreeze_backbone_at_epoch=10``, then starts at ``backbone_initial_ratio_lr=0.1``
  x the current lr and doubles each epoch (``lambda_func``) until it reaches it; here the ratio
  stays for the whole run. fastai's ``fine_tune(epochs, base_lr=2e-3, freeze_epochs=1,
  lr_mult=100)`` (``fastai/callback/schedule.py``): after the frozen epochs, discriminative lrs
  ``slice(base_lr / lr_mult, base_lr)``, the first layer group at 1/100 of the last. Layer-wise
  decay: DINOv2's ``layerwise_decay: 0.9`` and ``patch_embed_lr_mult: 0.2``
  (``dinov2/configs/ssl_default_config.yaml``), timm's ``create_optimizer_v2(layer_decay=...)``
  (``timm/optim/_param_groups.py``, after BEiT), LightlyTrain's EoMT segmentation ``llrd: 0.8``;
  LightlyTrain's image classification fine-tunes backbone and head at one lr (AdamW 3e-4 with
  a warm-up, ``backbone_freeze=False``: ``_task_models/image_classification/train_model.py``).
- Heads first, then everything: fastai's ``freeze_epochs=1``, Lightning's
  ``unfreeze_backbone_at_epoch=10`` (above). Held still here as DINO holds its last layer
  (gradients dropped: :func:`~contrastive.engine.optim.hold_frozen_groups`), in optimiser steps.
- BatchNorm statistics fixed: timm's ``freeze(..., include_bn_running_stats=True)``
  (``timm/utils/model.py``: "during fine tuning, it's good practice to freeze batch norm stats",
  which it tells apart from the affine parameters), ``FrozenBatchNorm2d`` in torchvision
  (``torchvision/ops/misc.py``; its detection models use it when the backbone is pretrained,
  ``models/detection/faster_rcnn.py``), timm (``freeze_batch_norm_2d``,
  ``timm/layers/norm_act.py``) and detectron2 (``detectron2/layers/batch_norm.py``, the default
  ``MODEL.RESNETS.NORM = "FrozenBN"``). Those also fix the affine weight and bias; here only the
  statistics are fixed (the layers normalise with them, in eval mode) and the affine parameters
  train with the backbone.

Without ``--init`` every control defaults to off (the run is what it was, bit for bit); with it,
to :data:`WITH_INIT` (``benchmarks/results/init.md`` has the measurement behind them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from contrastive.engine.fields import help_field
from contrastive.methods.base import ParamGroup

__all__ = ["FinetuneFields", "FinetuneSettings", "WITH_INIT", "WITHOUT_INIT", "resolve_finetune",
           "backbone_groups", "freeze_backbone_bn", "freeze_bn_stats"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinetuneSettings:
    """The resolved controls: ``lr_scale`` of the backbone's lr, ``frozen_steps`` optimiser
    steps with the backbone held still, ``freeze_bn`` its BatchNorm statistics fixed."""

    lr_scale: float = 1.0
    frozen_steps: int = 0
    freeze_bn: bool = False


#: without --init: nothing changes
WITHOUT_INIT = FinetuneSettings()
#: with --init: the backbone at 1/10 of the heads' lr (Lightning's initial ratio,
#: ``backbone_initial_ratio_lr``, kept) and its BatchNorm statistics kept (a one-process MoCo
#: without shuffle BN would otherwise overwrite ImageNet's statistics with those of 64-image
#: batches); no warm start
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
    ``cfg`` (the run's copy, which config.json records; a second call finds them set). A bad
    value is a one-line ``ValueError``."""
    base = WITH_INIT if pretrained else WITHOUT_INIT
    if cfg.backbone_lr_scale is None:
        cfg.backbone_lr_scale = base.lr_scale
    if cfg.backbone_frozen_steps is None:
        cfg.backbone_frozen_steps = base.frozen_steps
    if cfg.freeze_bn_stats is None:
        cfg.freeze_bn_stats = base.freeze_bn
    if not (math.isfinite(cfg.backbone_lr_scale) and cfg.backbone_lr_scale >= 0):
        raise ValueError(f"--backbone-lr-scale must be a number >= 0 (1: the run's lr), got "
                         f"{cfg.backbone_lr_scale}")
    if cfg.backbone_frozen_steps < 0:
        raise ValueError(f"--backbone-frozen-steps must be >= 0 (0: no warm start), got "
                         f"{cfg.backbone_frozen_steps}")
    return FinetuneSettings(float(cfg.backbone_lr_scale), int(cfg.backbone_frozen_steps),
                            bool(cfg.freeze_bn_stats))


def backbone_groups(backbones: Sequence[nn.Module],
                    settings: FinetuneSettings) -> list[ParamGroup]:
    """The ``backbone`` group the kit declares to the optimiser: the trainable parameters of
    ``backbones`` (those the recipe built from ``--encoder``; a method's own group keeps any
    of them it declares) at ``lr_scale`` x the scheduled lr, held still for the first
    ``frozen_steps`` optimiser steps. None when the multiplier is 1 and there is no warm
    start."""
    if settings.lr_scale == 1.0 and not settings.frozen_steps:
        return []
    _require(backbones)
    params = list({id(p): p for b in backbones for p in b.parameters()
                   if p.requires_grad}.values())
    logger.info("backbone: %d parameter tensors at %g x the lr%s", len(params), settings.lr_scale,
                f", held still for the first {settings.frozen_steps} optimiser steps"
                if settings.frozen_steps else "")
    return [ParamGroup("backbone", params, lr_scale=settings.lr_scale,
                       frozen_steps=settings.frozen_steps)]


def freeze_backbone_bn(method: nn.Module, backbones: Sequence[nn.Module],
                       settings: FinetuneSettings) -> None:
    """With ``freeze_bn``: BatchNorm statistics frozen (:func:`freeze_bn_stats`) in the
    ``backbones`` and in every copy ``method`` made of one (a momentum encoder, a teacher: a
    module of the same class with the same tensor names and shapes; a head is none, even when
    the backbone is a plain ``nn.Sequential``)."""
    if not settings.freeze_bn:
        return
    _require(backbones)
    layouts = {(type(b), _layout(b)) for b in backbones}
    kinds = {kind for kind, _ in layouts}
    copies = [m for m in method.modules()
              if type(m) in kinds and (type(m), _layout(m)) in layouts]
    frozen = sum(freeze_bn_stats(m) for m in copies)
    logger.info("BatchNorm statistics frozen in %d layers of %d backbone(s) and copies", frozen,
                len(copies))


def _layout(module: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((k, tuple(v.shape)) for k, v in module.state_dict().items())


def _require(backbones: Sequence[nn.Module]) -> None:
    from contrastive.engine.kits.base import KitOptionError

    if not backbones:
        raise KitOptionError("--backbone-lr-scale / --backbone-frozen-steps / --freeze-bn-stats: the "
                        "method built no --encoder backbone to apply them to (its recipe builds "
                        "the backbone another way); leave them unset")


def _hold_eval(module: nn.Module, args: Any) -> None:
    module.training = False


def freeze_bn_stats(module: nn.Module) -> int:
    """Every BatchNorm layer in ``module`` normalises with its running statistics and never
    updates them, even in ``train()`` mode (a forward pre-hook puts it in eval mode before each
    forward; the affine weights still get gradients). Returns the number of layers."""
    layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in layers:
        if not getattr(m, "_bn_stats_frozen", False):
            m.register_forward_pre_hook(_hold_eval)
            m._bn_stats_frozen = True  # type: ignore[assignment]
    return len(layers)
