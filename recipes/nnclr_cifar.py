#!/usr/bin/env python
"""NNCLR on CIFAR-10 (Dwibedi et al., ICCV 2021). Following solo-learn's
``scripts/pretrain/cifar/nnclr.yaml`` (vturrisi/solo-learn): ResNet-18 with the CIFAR stem,
projector 2048 -> 256, predictor 4096, support set 65,536, temperature 0.2, LARS lr 0.4 per 256
images with trust coefficient 0.02, weight decay 1e-5, batch 256, 1000 epochs, warmup + cosine,
BYOL's asymmetric augmentation at 32 px. The support set holds the embeddings of every process.

    python recipes/nnclr_cifar.py --data cifar10
    python recipes/nnclr_cifar.py --data shapes --encoder small_cnn --epochs 5
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import NNCLR

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (NNCLR.from_preset("cifar") builds the same); the fields below default to them
PRESET = NNCLR.presets["cifar"]


@dataclass
class NNCLRCifar(CifarConfig):
    """NNCLR, CIFAR-10 (solo-learn's nnclr.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("lars", "solo-learn: LARS")
    lr: float = override(0.4, "per 256 images (linear rule)")
    weight_decay: float = 1e-5

    dim: int = help_field(PRESET["dim"], "embedding dimension")
    proj_hidden: int = help_field(PRESET["proj_hidden"], "projector hidden width")
    pred_hidden: int = help_field(PRESET["pred_hidden"], "predictor hidden width")
    support_size: int = help_field(PRESET["support_size"], "support set size")
    temperature: float = help_field(PRESET["temperature"], "temperature tau")


def build_method(cfg: NNCLRCifar, data: DataInfo):
    return NNCLR(encoder=cfg.encoder, dim=cfg.dim, proj_hidden=cfg.proj_hidden,
                 pred_hidden=cfg.pred_hidden, support_size=cfg.support_size,
                 temperature=cfg.temperature, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: NNCLRCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(NNCLRCifar, build_method, build_pipeline, name="nnclr_cifar")
