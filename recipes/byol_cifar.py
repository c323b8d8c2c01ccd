#!/usr/bin/env python
"""BYOL on CIFAR-10 (Grill et al., NeurIPS 2020). The paper gives no CIFAR setup; this follows
solo-learn's ``scripts/pretrain/cifar/byol.yaml`` (vturrisi/solo-learn): ResNet-18 with the
CIFAR stem, projector and predictor 4096 -> 256, target momentum 0.99 -> 1 (cosine), LARS lr
1.0 per 256 images with trust coefficient 0.02, weight decay 1e-5, batch 256, 1000 epochs,
warmup + cosine, BYOL's asymmetric augmentation at 32 px (no blur at this size, solarisation on
the second view). solo-learn also clips the LARS rate (``clip_lr``), which ours does not.

    python recipes/byol_cifar.py --data cifar10
    python recipes/byol_cifar.py --data shapes --encoder small_cnn --epochs 5   # CPU minutes
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import BYOL

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (BYOL.from_preset("cifar") builds the same); the fields below default to them
PRESET = BYOL.presets["cifar"]


@dataclass
class BYOLCifar(CifarConfig):
    """BYOL, CIFAR-10 (solo-learn's byol.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("lars", "solo-learn: LARS")
    lr: float = override(1.0, "per 256 images (linear rule)")
    weight_decay: float = 1e-5

    dim: int = help_field(PRESET["dim"], "projection dimension")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "hidden width of projector and predictor")
    momentum: float = help_field(PRESET["momentum"], "EMA momentum of the target network at the "
                                 "start (tau_base; -> 1 on a half cosine)")


def build_method(cfg: BYOLCifar, data: DataInfo):
    return BYOL(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                momentum=cfg.momentum, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: BYOLCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(BYOLCifar, build_method, build_pipeline, name="byol_cifar")
