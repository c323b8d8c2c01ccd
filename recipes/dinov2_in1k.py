#!/usr/bin/env python
"""DINOv2, ViT-L/16, ImageNet-1k: Oquab et al., "DINOv2: Learning Robust Visual Features without
Supervision", TMLR 2024 (arXiv 2304.07193), with the authors' "fast setup" (facebookresearch/
dinov2 README: ``dinov2/configs/train/vitl16_short.yaml`` on 4 nodes of 8 GPUs, which is
``ssl_default_config.yaml`` with 64 images per GPU; values checked in those files and in
``dinov2/train/train.py``, ``dinov2/utils/config.py``, ``dinov2/utils/param_groups.py``).

Hyper-parameters (config keys in brackets): batch 2048 (32 GPUs x ``train.batch_size_per_gpu`` 64);
AdamW, betas 0.9 / 0.999 (``optim.adamw_beta1/2``), lr 0.004 for a batch of 1024 scaled by the
square root (``optim.base_lr``, ``scaling_rule: sqrt_wrt_1024``: lr = 0.004 x sqrt(batch / 1024),
0.00566 at 2048); 10 warm-up epochs from 0, cosine to 1e-6 (``optim.warmup_epochs``, ``min_lr``);
weight decay cosine 0.04 -> 0.4 (none on biases, norms, layer-scale gammas); gradient clipping 3.0
of each student part apart (``optim.clip_grad``; ``do_train``: backbone and head); last layer frozen
for 1 epoch by a zero lr (``freeze_last_layer_epochs``; ``build_schedulers``: AdamW's moments keep
moving); layer-wise lr decay 0.9 and patch-embedding lr x 0.2 (``optim.layerwise_decay``,
``patch_embed_lr_mult``); 100 epochs (``optim.epochs``). The method's settings are
``IBOT.presets["dinov2_in1k"]`` (one DINO head of 65536 prototypes for class and patch tokens, KoLeo
0.1, running centres with the patch centre over the masked patches, teacher momentum 0.992 -> 1,
teacher temperature 0.04 -> 0.07 over 30 epochs, masks on half the images at 0.1-0.5, layer scale
1e-5, drop path 0.3 in every block: ``student.drop_path_uniform``). Crops (``crops.*``): 2 global of
224 px at scale 0.32-1, 8 local of 96 px at 0.05-0.32, DINO's colour / blur / solarisation. Reported
(README): 81.6 % k-NN, 82.9 % linear.

How the settings map onto the engine:

- DINOv2's "epoch" is ``train.OFFICIAL_EPOCH_LENGTH`` = 1250 iterations whatever the data size
  (``build_schedulers``), so the budget and every length here are optimiser steps: 100 epochs
  = ``--steps 125000``, warm-up 12500 steps, teacher-temperature warm-up 37500, last layer
  frozen 1250; they stay the same at another batch size, as in DINOv2.
- The sqrt rule is the engine's ``--lr-scaling sqrt`` (lr x sqrt(batch)) with ``--lr`` 0.004 /
  sqrt(1024) = 1.25e-4: the same lr at every batch size. The cosine floor is a fraction of
  the peak: 1e-6 / 0.00566 at batch 2048.

- DINOv2's parts are reproduced by the preset: clipping per part (``IBOT(clip_mode="part")``,
  :meth:`IBOT.clip_parts`: the ViT with its mask token, the head), the last layer frozen by a
  zero lr (``freeze_last_layer_by="lr"``), the same drop path in every block (the encoder's
  ``drop_path_uniform``; kept only while ``--encoder-kwargs`` keeps it).

Not reproduced: DINOv2's masks follow its own generator (``MaskingGenerator``, ratios spread
over 0.1-0.5 by strata), here iBOT's block masks with independent ratios; its drop path above
0.1 runs each block's residual on a random ``int(B x 0.7)`` of the B samples
(``dinov2/layers/block.py``: ``drop_add_residual_stochastic_depth``), timm's ``DropPath`` on
each sample with probability 0.7 (the same expectation); resizing is bicubic there. Its ViT-L
(``vit_large``, patch 16) is timm's ``vit_large_patch16_224`` with layer scale.

    accelerate launch recipes/dinov2_in1k.py --data /path/to/imagenet
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import IBOT
from contrastive.methods.base import CLIP_MODES, FROZEN_BY

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (IBOT.from_preset("dinov2_in1k") builds the same); the fields below default to them
PRESET = IBOT.presets["dinov2_in1k"]
#: train.OFFICIAL_EPOCH_LENGTH: iterations per DINOv2 "epoch", whatever the data size
EPOCH = 1250


@dataclass
class DINOv2ImageNet(ImageConfig):
    """DINOv2, ViT-L/16, ImageNet-1k (vitl16_short.yaml = ssl_default_config.yaml)."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    image_size: int = 224
    steps: int = override(100 * EPOCH, "optimiser steps: 100 DINOv2 epochs of 1250 "
                          "iterations (OFFICIAL_EPOCH_LENGTH), not passes over the data")
    batch_size: int = override(2048, "effective batch (README: 32 GPUs x 64)")
    optimizer: str = override("adamw", "DINOv2: AdamW")
    lr: float = override(0.004 / math.sqrt(1024), "per sqrt(image): base_lr 0.004 at batch "
                         "1024 under DINOv2's sqrt_wrt_1024 rule")
    lr_scaling: str = override("sqrt", "lr x sqrt(batch): DINOv2's sqrt_wrt_1024")
    betas: tuple[float, float] = override((0.9, 0.999), "optim.adamw_beta1 / beta2")
    min_lr: float = override(1e-6 / (0.004 * math.sqrt(2)), "cosine floor as a fraction: "
                             "min_lr 1e-6 at batch 2048")
    weight_decay: float = override(0.04, "start of the cosine weight-decay schedule")
    weight_decay_end: float = help_field(0.4, "end of the cosine weight-decay schedule")
    exclude_from_wd: bool = override(True, "no decay on biases, norms, layer-scale gammas")
    warmup_epochs: float = 0
    warmup_steps: int = override(10 * EPOCH, "linear lr warm-up: 10 DINOv2 epochs")
    schedule_per: str = override("step", "per iteration")
    clip_grad_norm: float = override(3.0, "optim.clip_grad")

    out_dim: int = help_field(PRESET["out_dim"], "prototypes (one head for class and patches)")
    momentum: float = help_field(PRESET["momentum"], "teacher EMA momentum at the start (-> 1)")
    teacher_temperature: float = help_field(PRESET["teacher_temperature"],
                                            "class-token teacher temperature after warm-up")
    teacher_patch_temperature: float = help_field(PRESET["teacher_patch_temperature"],
                                                  "patch teacher temperature after warm-up")
    warmup_teacher_steps: int = help_field(30 * EPOCH, "teacher-temperature warm-up from 0.04 "
                                           "(30 DINOv2 epochs)")
    freeze_last_layer_steps: int = help_field(EPOCH, "last layer frozen (1 DINOv2 epoch)")
    freeze_last_layer_by: str = help_field(PRESET["freeze_last_layer_by"],
                                           "lr: lr 0, AdamW's moments moving (DINOv2); grad: "
                                           "gradients dropped (DINO, iBOT)",
                                           choices=FROZEN_BY)
    clip_mode: str = help_field(PRESET["clip_mode"], "what --clip-grad-norm clips apart: "
                                "each part, the ViT and the head (DINOv2), each parameter "
                                "(DINO, iBOT) or all parameters together", choices=CLIP_MODES)
    koleo_weight: float = help_field(PRESET["koleo_weight"], "dino.koleo_loss_weight")
    layer_decay: float = help_field(PRESET["layer_decay"], "optim.layerwise_decay")
    patch_embed_lr_scale: float = help_field(PRESET["patch_embed_lr_scale"],
                                             "optim.patch_embed_lr_mult")
    local_crops: int = help_field(8, "96-px local crops (crops.local_crops_number)")

    #: the --epochs refusal beside the --steps budget (parse_config's, every recipe's) names
    #: the --steps of that many DINOv2 epochs
    epoch_steps: ClassVar[int] = EPOCH


def build_method(cfg: DINOv2ImageNet, data: DataInfo):
    kw = {k: v for k, v in PRESET.items() if k not in ("encoder", "encoder_kwargs")}
    kw.update(out_dim=cfg.out_dim, momentum=cfg.momentum,
              teacher_temperature=cfg.teacher_temperature,
              teacher_patch_temperature=cfg.teacher_patch_temperature,
              warmup_teacher_steps=cfg.warmup_teacher_steps, koleo_weight=cfg.koleo_weight,
              layer_decay=cfg.layer_decay, patch_embed_lr_scale=cfg.patch_embed_lr_scale,
              weight_decay=cfg.weight_decay, weight_decay_end=cfg.weight_decay_end,
              freeze_last_layer_steps=cfg.freeze_last_layer_steps,
              freeze_last_layer_by=cfg.freeze_last_layer_by, clip_mode=cfg.clip_mode)
    return IBOT(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), **kw)


def build_pipeline(cfg: DINOv2ImageNet):
    from contrastive.augment import get_pipeline

    return get_pipeline("dino", image_size=cfg.image_size, num_local=cfg.local_crops,
                        global_scale=(0.32, 1.0), local_scale=(0.05, 0.32))


if __name__ == "__main__":
    run(DINOv2ImageNet, build_method, build_pipeline, name="dinov2_in1k")
