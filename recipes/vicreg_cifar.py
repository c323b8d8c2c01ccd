#!/usr/bin/env python
"""VICReg on CIFAR-10 (Bardes et al., ICLR 2022). Following solo-learn's
``scripts/pretrain/cifar/vicreg.yaml`` (vturrisi/solo-learn): ResNet-18 with the CIFAR stem,
expander 2048-2048-2048, weights (25, 25, 1), LARS lr 0.3 per 256 images with trust coefficient
0.02, weight decay 1e-4, batch 256, 1000 epochs, warmup + cosine; augmentation: crop 0.2-1,
colour jitter 0.4/0.4/0.2/0.1 p 0.8, grayscale p 0.2, no blur, solarisation p 0.1 on both
views, flip.

    python recipes/vicreg_cifar.py --data cifar10
    python recipes/vicreg_cifar.py --data shapes --encoder small_cnn --epochs 5
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import VICReg

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (VICReg.from_preset("cifar") builds the same); the fields below default to them
PRESET = VICReg.presets["cifar"]


@dataclass
class VICRegCifar(CifarConfig):
    """VICReg, CIFAR-10 (solo-learn's vicreg.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("lars", "solo-learn: LARS")
    lr: float = override(0.3, "per 256 images (linear rule)")
    weight_decay: float = 1e-4

    dim: int = help_field(PRESET["dim"], "expander output width")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "expander hidden width")
    sim_coeff: float = help_field(25.0, "invariance weight lambda")
    std_coeff: float = help_field(25.0, "variance weight mu")
    cov_coeff: float = help_field(1.0, "covariance weight nu")
    crop_min: float = override(0.2, "RandomResizedCrop minimum scale (solo-learn: 0.2)")


def build_method(cfg: VICRegCifar, data: DataInfo):
    return VICReg(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                  sim_coeff=cfg.sim_coeff, std_coeff=cfg.std_coeff, cov_coeff=cfg.cov_coeff,
                  encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: VICRegCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0), blur_p=(0.0, 0.0),
                        solarize_p=(0.1, 0.1))


if __name__ == "__main__":
    run(VICRegCifar, build_method, build_pipeline, name="vicreg_cifar")
