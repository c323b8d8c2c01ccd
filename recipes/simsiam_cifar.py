#!/usr/bin/env python
"""SimSiam on CIFAR-10 (Chen & He, CVPR 2021). Following solo-learn's
``scripts/pretrain/cifar/simsiam.yaml`` (vturrisi/solo-learn): ResNet-18 with the CIFAR stem,
projector 2048 -> 2048, predictor bottleneck 512, SGD lr 0.5 per 256 images, weight decay 1e-5,
batch 256, 1000 epochs, warmup + cosine, the predictor at a fixed lr (the paper's ``fix_lr``),
MoCo v2-style augmentation without blur at 32 px. (The paper's own CIFAR setup, Appendix D:
SGD lr 0.03 x batch / 256, weight decay 5e-4, batch 512, 800 epochs, a 2-layer projector.)

    python recipes/simsiam_cifar.py --data cifar10
    python recipes/simsiam_cifar.py --data shapes --encoder small_cnn --epochs 5
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.engine.schedules import scaled_lr
from contrastive.methods import SimSiam

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SimSiam.from_preset("cifar") builds the same); the fields below default to them
PRESET = SimSiam.presets["cifar"]


@dataclass
class SimSiamCifar(CifarConfig):
    """SimSiam, CIFAR-10 (solo-learn's simsiam.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("sgd", "solo-learn: SGD")
    lr: float = override(0.5, "per 256 images (linear rule)")
    weight_decay: float = 1e-5
    sgd_momentum: float = 0.9

    dim: int = help_field(PRESET["dim"], "projection dimension")
    proj_hidden: int = help_field(PRESET["proj_hidden"], "projector hidden width")
    pred_hidden: int = help_field(PRESET["pred_hidden"], "predictor bottleneck")
    proj_layers: int = help_field(PRESET["proj_layers"], "projector Linear layers")
    fix_predictor_lr: bool = help_field(True, "the predictor keeps the peak lr (paper fix_lr)")
    stop_gradient: bool = help_field(True, "false only for the collapse control")
    crop_min: float = override(0.2, "RandomResizedCrop minimum scale (solo-learn: 0.2)")


def build_method(cfg: SimSiamCifar, data: DataInfo):
    peak = scaled_lr(cfg.lr, cfg.batch_size, cfg.lr_scaling)
    return SimSiam(encoder=cfg.encoder, dim=cfg.dim, proj_hidden=cfg.proj_hidden,
                   pred_hidden=cfg.pred_hidden, proj_layers=cfg.proj_layers,
                   predictor_lr=peak if cfg.fix_predictor_lr else None,
                   stop_gradient=cfg.stop_gradient, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SimSiamCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0),
                        blur_p=0.0)


if __name__ == "__main__":
    run(SimSiamCifar, build_method, build_pipeline, name="simsiam_cifar")
