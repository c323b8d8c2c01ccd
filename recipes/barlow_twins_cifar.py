#!/usr/bin/env python
"""Barlow Twins on CIFAR-10 (Zbontar et al., ICML 2021). Following solo-learn's
``scripts/pretrain/cifar/barlow.yaml`` (vturrisi/solo-learn): ResNet-18 with the CIFAR stem,
projector 2048-2048-2048, lambda 0.0051, loss scale 0.1, LARS lr 0.3 per 256 images with trust
coefficient 0.02, weight decay 1e-4, batch 256, 1000 epochs, warmup + cosine, BYOL's asymmetric
augmentation at 32 px. One lr for all parameters, as solo-learn (LARS with
``exclude_bias_n_norm``; no separate bias lr): ``--bias-lr-scale`` 1, where the official
ImageNet code trains biases and BN parameters at 0.024 of the weights' lr.

    python recipes/barlow_twins_cifar.py --data cifar10
    python recipes/barlow_twins_cifar.py --data shapes --encoder small_cnn --epochs 5
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import BarlowTwins

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (BarlowTwins.from_preset("cifar") builds the same); the fields below default to them
PRESET = BarlowTwins.presets["cifar"]


@dataclass
class BarlowTwinsCifar(CifarConfig):
    """Barlow Twins, CIFAR-10 (solo-learn's barlow.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("lars", "solo-learn: LARS")
    lr: float = override(0.3, "per 256 images (linear rule)")
    weight_decay: float = 1e-4

    dim: int = help_field(PRESET["dim"], "projector output width")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "projector hidden width")
    lambd: float = help_field(PRESET["lambd"], "off-diagonal weight lambda")
    loss_scale: float = help_field(PRESET["scale"], "solo-learn's scale_loss")
    bias_lr_scale: float = help_field(1.0, "biases and BN parameters: this times the lr "
                                      "(solo-learn 1; the official ImageNet code 0.024)")


def build_method(cfg: BarlowTwinsCifar, data: DataInfo):
    return BarlowTwins(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                       lambd=cfg.lambd, scale=cfg.loss_scale, bias_lr_scale=cfg.bias_lr_scale,
                       encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: BarlowTwinsCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(BarlowTwinsCifar, build_method, build_pipeline, name="barlow_twins_cifar")
