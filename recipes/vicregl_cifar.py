#!/usr/bin/env python
"""VICRegL on CIFAR-10 (Bardes, Ponce, LeCun, NeurIPS 2022; facebookresearch/VICRegL).

The authors give no CIFAR setting; this one is ours: ``recipes/vicreg_cifar.py``'s (solo-learn's
``scripts/pretrain/cifar/vicreg.yaml``) ResNet-18 with the CIFAR stem, expander 2048-2048-2048,
LARS lr 0.3 per 256 images with trust coefficient 0.02, weight decay 1e-4, batch 256, 1000
epochs, warm-up + cosine, and its augmentation (crop 0.2-1, jitter 0.4/0.4/0.2/0.1 p 0.8,
grayscale p 0.2, no blur, solarisation p 0.1, flip); VICRegL's part as the authors' code
(``main_vicregl.py``): local expander 512-512-512, alpha 0.75, weights 25 / 25 / 1, every
feature match kept. ResNet-18's map is 4 x 4 at 32 px: the location matches keep the code's
fractions of its 7 x 7 map (20 / 49 and 4 / 49 of 16 locations, rounded up: 7 and 2).

    python recipes/vicregl_cifar.py --data cifar10
    python recipes/vicregl_cifar.py --data shapes --encoder small_cnn --epochs 5

Every field below is a flag: ``python recipes/vicregl_cifar.py --help``.
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import VICRegL

#: the method's keyword arguments of this setting: the one home of these values
PRESET = VICRegL.presets["cifar"]


@dataclass
class VICRegLCifar(CifarConfig):
    """VICRegL, CIFAR-10 (see the module docstring for where each value comes from)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("lars", "solo-learn's VICReg: LARS")
    lr: float = override(0.3, "per 256 images (linear rule)")
    weight_decay: float = 1e-4

    dim: int = help_field(PRESET["dim"], "global expander output width")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "global expander hidden width")
    maps_dim: int = help_field(PRESET["maps_dim"], "local expander output width")
    maps_hidden: int = help_field(PRESET["maps_hidden"], "local expander hidden width")
    alpha: float = help_field(PRESET["alpha"], "global loss share: alpha global + (1 - alpha) "
                              "local")
    num_matches: tuple[int, int] = help_field(PRESET["num_matches"], "location matches kept, "
                                              "view i -> j and j -> i")
    crop_min: float = override(0.2, "RandomResizedCrop minimum scale (solo-learn: 0.2)")


def build_method(cfg: VICRegLCifar, data: DataInfo):
    return VICRegL(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                   maps_dim=cfg.maps_dim, maps_hidden=cfg.maps_hidden, alpha=cfg.alpha,
                   num_matches=cfg.num_matches, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: VICRegLCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0),
                        blur_p=(0.0, 0.0), solarize_p=(0.1, 0.1)).with_crop_boxes()


if __name__ == "__main__":
    run(VICRegLCifar, build_method, build_pipeline, name="vicregl_cifar")
