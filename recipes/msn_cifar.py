#!/usr/bin/env python
"""MSN on CIFAR-10 at CPU / one-GPU scale (Assran et al., ECCV 2022; facebookresearch/msn).

The paper and the authors' code give no CIFAR setup; this keeps their ViT-S/16 settings
(``configs/pretrain/msn_vits16.yaml``, ``src/msn_train.py``; ``recipes/msn_vits16_in1k.py`` says
where each comes from) and shrinks the model and the views as ``recipes/ibot_cifar.py`` does:
ViT-Tiny (timm's ``vit_tiny_patch16_224`` built at 32 px with 4-px patches: 64 patches, width
192, ``dynamic_img_size`` for the focal views), 10 focal views of 16 px; the head (2048 hidden,
256 out, BN), 1024 prototypes, temperature 0.1, sharpening 0.25, Sinkhorn, me-max weight 1,
patch drop 0.15, teacher momentum 0.996 -> 1 (linear over 1.25 x the run), AdamW lr 1e-3
(absolute), 15 warm-up epochs, cosine weight decay 0.04 -> 0.4, gradient clipping 3.0, random
view scale 0.3-1 and focal 0.05-0.3 with colour strength 0.5 (blur off at 32 px, as every CIFAR
recipe here), solo-learn's CIFAR batch 256 and 1000 epochs (``CifarConfig``). The kNN monitor
reads the class token. ``--prior power_law`` trains PMSN (ICLR 2023).

    python recipes/msn_cifar.py --data cifar10
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import MSN
from contrastive.methods.msn import PRIORS

#: the method's keyword arguments at this scale: the one home of these values
#: (MSN.from_preset("cifar") builds the same); the fields below default to them
PRESET = MSN.presets["cifar"]


@dataclass
class MSNCifar(CifarConfig):
    """MSN, CIFAR-10, ViT-Tiny with 4-px patches."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    optimizer: str = override("adamw", "MSN: AdamW")
    lr: float = override(1e-3, "MSN's lr (absolute)")
    lr_scaling: str = override("none", "MSN does not scale its lr by the batch")
    min_lr: float = override(1e-3, "cosine floor as a fraction: MSN's final_lr 1e-6")
    warmup_epochs: float = 15
    weight_decay: float = override(0.04, "start of the cosine weight-decay schedule")
    weight_decay_end: float = help_field(0.4, "end of the cosine weight-decay schedule")
    exclude_from_wd: bool = override(True, "no decay on biases and norms (MSN's groups)")
    clip_grad_norm: float = override(3.0, "MSN's clip_grad 3.0 (encoder and head)")
    crop_min: float = override(0.3, "the random views' minimum scale and the focal views' "
                               "maximum (MSN: rand_crop_scale 0.3-1, focal 0.05-0.3)")

    hidden_dim: int = help_field(PRESET["hidden_dim"], "head hidden width")
    out_dim: int = help_field(PRESET["out_dim"], "head output width (the prototypes' too)")
    num_prototypes: int = help_field(PRESET["num_prototypes"], "prototypes")
    prior: str = help_field("uniform", "uniform: MSN's me-max; power_law: PMSN",
                            choices=PRIORS)
    power_law_exponent: float = help_field(0.25, "PMSN's prior exponent")
    patch_drop: float = help_field(PRESET["patch_drop"], "fraction of the random view's "
                                   "patches dropped")
    momentum: float = help_field(PRESET["momentum"], "teacher EMA momentum at the start (-> 1)")
    focal_views: int = help_field(10, "focal views")
    focal_size: int = help_field(16, "focal view side")


def build_method(cfg: MSNCifar, data: DataInfo):
    return MSN(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), **MSN.options_of(cfg))


def build_pipeline(cfg: MSNCifar):
    from contrastive.augment import get_pipeline

    # the target view and the random view, then the focal views
    return get_pipeline("multicrop", image_size=cfg.image_size, num_global=2,
                        num_local=cfg.focal_views, local_size=cfg.focal_size,
                        global_scale=(cfg.crop_min, 1.0), local_scale=(0.05, cfg.crop_min),
                        s=0.5)


if __name__ == "__main__":
    run(MSNCifar, build_method, build_pipeline, name="msn_cifar")
