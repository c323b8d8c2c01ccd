#!/usr/bin/env python
"""DINO, ViT-S/16, ImageNet: Caron et al., ICCV 2021 (arXiv 2104.14294), with the official
code's defaults (facebookresearch/dino ``main_dino.py``; README: "vanilla DINO training" of
ViT-S/16 for 100 epochs).

Hyper-parameters: AdamW, lr 0.0005 x batch / 256 after 10 linear-warmup epochs, cosine to 1e-6,
weight decay cosine 0.04 -> 0.4 (a declared schedule), batch 1024 (16 x 64), 100 epochs, gradient
clipping 3.0 of each parameter apart (``utils.clip_gradients`` in ``train_one_epoch``, before
``cancel_gradients_last_layer``; ``--clip-mode parameter``, ``--clip-mode all`` clips all parameters
together); DINOHead 2048 hidden, 256 bottleneck, 65536 prototypes with the last layer's norm fixed
and the layer frozen during the first epoch; teacher momentum 0.996 -> 1 (cosine), teacher
temperature 0.04 (the README's best ViT-S/16 runs warm it up from 0.04 to 0.07 over 30 epochs:
``--teacher-temperature 0.07 --warmup-teacher-epochs 30``), student 0.1, centre momentum 0.9; DINO's
multi-crop augmentation (2 x 224 px, 8 x 96 px). The ViT is built with ``dynamic_img_size``
(``--encoder-kwargs``): the 96-px local crops pass through it with the position embedding resampled
to their 6 x 6 patch grid (bicubic, timm's ``resample_abs_pos_embed``, as the code's
``interpolate_pos_encoding`` in ``vision_transformer.py``; timm anti-aliases the downsampling, the
code does not). Reported k-NN / linear top-1 after 100 epochs: 69.3 / 74.0 %.

    accelerate launch recipes/dino_vit_small.py --data /path/to/imagenet
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import DINO
from contrastive.methods.base import CLIP_MODES

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (DINO.from_preset("vit_small") builds the same); the fields below default to them
PRESET = DINO.presets["vit_small"]


@dataclass
class DINOViTSmall(ImageConfig):
    """DINO, ViT-S/16, ImageNet (ICCV 2021; official facebookresearch/dino defaults)."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    image_size: int = 224
    epochs: int = 100
    batch_size: int = 1024
    optimizer: str = override("adamw", "official: AdamW")
    lr: float = override(0.0005, "per 256 images (linear rule)")
    min_lr: float = override(0.0005, "cosine floor as a fraction: official 1e-6 at batch 1024")
    weight_decay: float = override(0.04, "start of the cosine weight-decay schedule")
    weight_decay_end: float = help_field(0.4, "end of the cosine weight-decay schedule")
    exclude_from_wd: bool = override(True, "official: no decay on biases and norms")
    warmup_epochs: float = 10
    schedule_per: str = override("step", "per iteration")
    clip_grad_norm: float = override(3.0, "official --clip_grad 3.0")
    clip_mode: str = help_field(PRESET["clip_mode"], "what --clip-grad-norm clips apart: "
                                "each parameter (the code's utils.clip_gradients), each part "
                                "(encoder, head) or all parameters together (before this was "
                                "reproduced)", choices=CLIP_MODES)

    out_dim: int = help_field(PRESET["out_dim"], "number of prototypes")
    momentum: float = help_field(
        PRESET["momentum"], "EMA momentum of the teacher at the start (-> 1; "
        "the code's --momentum_teacher)")
    teacher_temperature: float = help_field(
        PRESET["teacher_temperature"], "teacher temperature after the warm-up")
    warmup_teacher_temperature: float = help_field(0.04, "teacher temperature at the start")
    warmup_teacher_epochs: int = help_field(0, "teacher-temperature warm-up epochs")
    norm_last_layer: bool = help_field(True, "fix the prototypes' norm")
    freeze_last_layer_epochs: int = help_field(1, "last layer frozen for these epochs")
    local_crops: int = help_field(8, "96-px local crops")


def build_method(cfg: DINOViTSmall, data: DataInfo):
    spe = data.steps_per_epoch
    return DINO(encoder=cfg.encoder, out_dim=cfg.out_dim, norm_last_layer=cfg.norm_last_layer,
                momentum=cfg.momentum, teacher_temperature=cfg.teacher_temperature,
                warmup_teacher_temperature=cfg.warmup_teacher_temperature,
                warmup_teacher_steps=cfg.warmup_teacher_epochs * spe,
                weight_decay=cfg.weight_decay, weight_decay_end=cfg.weight_decay_end,
                freeze_last_layer_steps=cfg.freeze_last_layer_epochs * spe,
                clip_mode=cfg.clip_mode,
                encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: DINOViTSmall):
    from contrastive.augment import get_pipeline

    return get_pipeline("dino", image_size=cfg.image_size, num_local=cfg.local_crops)


if __name__ == "__main__":
    run(DINOViTSmall, build_method, build_pipeline, name="dino_vit_small")
