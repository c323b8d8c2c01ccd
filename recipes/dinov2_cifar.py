#!/usr/bin/env python
"""DINOv2's objective and optimiser on CIFAR-10 at CPU / one-GPU scale (Oquab et al., TMLR
2024; facebookresearch/dinov2). NOT the paper's settings: DINOv2 gives no CIFAR setup.

The model and the crops are ``recipes/ibot_cifar.py``'s: ViT-Tiny (timm's
``vit_tiny_patch16_224`` at 32 px with 4-px patches: 64 tokens, width 192, 12 blocks,
``dynamic_img_size`` for the local crops), one head of 4096 prototypes for the class and patch
tokens, teacher momentum 0.996 -> 1, teacher temperature 0.04 -> 0.07 over 30 epochs, masks on
half of the global crops at 10-50 % of the patches, local crops of 16 px. From DINOv2
(``IBOT.presets["dinov2_cifar"]``, cited there): Sinkhorn-Knopp centring (``train/vitl14.yaml``),
KoLeo 0.1, layer-wise lr decay 0.9 and patch-embedding lr x 0.2, and the optimiser of
``ssl_default_config.yaml``: AdamW at 0.004 x sqrt(batch / 1024) (0.002 at batch 256: the engine's
``--lr-scaling sqrt`` with ``--lr`` 0.004 / 32), 10 warm-up epochs then cosine, weight decay cosine
0.04 -> 0.4, clipping 3.0 of the ViT and the head apart (``train/train.py``: ``do_train``), last
layer frozen for the first epoch by a zero lr (``build_schedulers``), 2 global crops at scale 0.32-1
and 8 local crops at 0.05-0.32. Epochs here are passes over CIFAR-10 (DINOv2's are 1250 iterations:
see ``recipes/dinov2_in1k.py``). The kNN monitor and the linear probe read the class token. No drop
path (DINOv2's uniform drop path, ``drop_path_uniform`` in the encoder kwargs, has no rate to spread
here). Not reproduced: as ``recipes/dinov2_in1k.py`` (masks).

    python recipes/dinov2_cifar.py --data cifar10
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import IBOT
from contrastive.methods.base import CLIP_MODES, FROZEN_BY
from contrastive.methods.ibot import CENTERING

#: the method's keyword arguments at this scale: the one home of these values
#: (IBOT.from_preset("dinov2_cifar") builds the same); the fields below default to them
PRESET = IBOT.presets["dinov2_cifar"]


@dataclass
class DINOv2Cifar(CifarConfig):
    """DINOv2's objective, CIFAR-10, ViT-Tiny with 4-px patches (no paper setting)."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    epochs: int = 800
    optimizer: str = override("adamw", "DINOv2: AdamW")
    lr: float = override(0.004 / math.sqrt(1024), "per sqrt(image): DINOv2's base_lr 0.004 "
                         "at batch 1024, sqrt_wrt_1024 rule")
    lr_scaling: str = override("sqrt", "lr x sqrt(batch): DINOv2's sqrt_wrt_1024")
    weight_decay: float = override(0.04, "start of the cosine weight-decay schedule")
    weight_decay_end: float = help_field(0.4, "end of the cosine weight-decay schedule")
    exclude_from_wd: bool = override(True, "no decay on biases, norms, layer-scale gammas")
    clip_grad_norm: float = override(3.0, "DINOv2's optim.clip_grad")
    sync_bn: bool = override(False, "a ViT has no BatchNorm")

    out_dim: int = help_field(PRESET["out_dim"], "prototypes (one head for class and patches)")
    momentum: float = help_field(PRESET["momentum"], "teacher EMA momentum at the start (-> 1)")
    teacher_temperature: float = help_field(PRESET["teacher_temperature"],
                                            "class-token teacher temperature after warm-up")
    teacher_patch_temperature: float = help_field(PRESET["teacher_patch_temperature"],
                                                  "patch teacher temperature after warm-up")
    warmup_teacher_epochs: int = help_field(30, "teacher-temperature warm-up from 0.04")
    freeze_last_layer_epochs: int = help_field(1, "last layer frozen for these epochs")
    freeze_last_layer_by: str = help_field(PRESET["freeze_last_layer_by"],
                                           "lr: lr 0, AdamW's moments moving (DINOv2); grad: "
                                           "gradients dropped (DINO, iBOT)",
                                           choices=FROZEN_BY)
    clip_mode: str = help_field(PRESET["clip_mode"], "what --clip-grad-norm clips apart: "
                                "each part, the ViT and the head (DINOv2), each parameter "
                                "(DINO, iBOT) or all parameters together", choices=CLIP_MODES)
    centering: str = help_field(PRESET["centering"], "sinkhorn (DINOv2 vitl14) | mean | none",
                                choices=CENTERING)
    koleo_weight: float = help_field(PRESET["koleo_weight"], "KoLeo weight (DINOv2: 0.1)")
    layer_decay: float = help_field(PRESET["layer_decay"], "layer-wise lr decay (DINOv2: 0.9)")
    patch_embed_lr_scale: float = help_field(PRESET["patch_embed_lr_scale"],
                                             "patch-embedding lr factor (DINOv2: 0.2)")
    local_crops: int = help_field(8, "local crops (DINOv2: 8)")
    local_size: int = help_field(16, "side of the local crops")
    crop_min: float = override(0.32, "the global crops' minimum scale and the local "
                               "crops' maximum (DINOv2 ssl_default_config.yaml: "
                               "global 0.32-1, local 0.05-0.32)")


def build_method(cfg: DINOv2Cifar, data: DataInfo):
    spe = data.steps_per_epoch
    kw = {k: v for k, v in PRESET.items() if k not in ("encoder", "encoder_kwargs")}
    kw.update(out_dim=cfg.out_dim, momentum=cfg.momentum,
              teacher_temperature=cfg.teacher_temperature,
              teacher_patch_temperature=cfg.teacher_patch_temperature,
              warmup_teacher_steps=cfg.warmup_teacher_epochs * spe, centering=cfg.centering,
              koleo_weight=cfg.koleo_weight, layer_decay=cfg.layer_decay,
              patch_embed_lr_scale=cfg.patch_embed_lr_scale, weight_decay=cfg.weight_decay,
              weight_decay_end=cfg.weight_decay_end,
              freeze_last_layer_steps=cfg.freeze_last_layer_epochs * spe,
              freeze_last_layer_by=cfg.freeze_last_layer_by, clip_mode=cfg.clip_mode)
    return IBOT(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), **kw)


def build_pipeline(cfg: DINOv2Cifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("dino", image_size=cfg.image_size, num_local=cfg.local_crops,
                        local_size=cfg.local_size, global_scale=(cfg.crop_min, 1.0),
                        local_scale=(0.05, cfg.crop_min))


if __name__ == "__main__":
    run(DINOv2Cifar, build_method, build_pipeline, name="dinov2_cifar")
