#!/usr/bin/env python
"""SupCon on CIFAR-10 (Khosla et al., NeurIPS 2020), labels required. Following solo-learn's
``scripts/pretrain/cifar/supcon.yaml`` (vturrisi/solo-learn): ResNet-18 with the CIFAR stem,
head 2048 -> 256, temperature 0.2, SGD lr 0.4 per 256 images, weight decay 1e-5, batch 256,
1000 epochs, warmup + cosine, SimCLR's augmentation at 32 px. (The authors' code,
HobbitLong/SupContrast, trains CIFAR-10 with ResNet-50, batch 1024, lr 0.5, temperature 0.1.)

With a small encoder (``small_cnn``) the recipe's head lets the embeddings shrink to one point
in the first steps, and a short run often never leaves it; ``--head-bn`` (SimCLR's head, BN on
the output) keeps them spread out, as the learning check does (tests/recipes/
test_learning_family.py, EXTRA).

    python recipes/supcon_cifar.py --data cifar10
    python recipes/supcon_cifar.py --data shapes --encoder small_cnn --epochs 5 --head-bn
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import SupCon

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SupCon.from_preset("cifar") builds the same); the fields below default to them
PRESET = SupCon.presets["cifar"]


@dataclass
class SupConCifar(CifarConfig):
    """SupCon, CIFAR-10 (solo-learn's supcon.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("sgd", "solo-learn: SGD")
    lr: float = override(0.4, "per 256 images (linear rule)")
    weight_decay: float = 1e-5
    sgd_momentum: float = 0.9

    dim: int = help_field(PRESET["dim"], "head output dimension")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "head hidden width")
    head_bn: bool = help_field(False, "SimCLR's head: BN after the hidden layer and on the "
                               "output (for small encoders that start collapsed, see "
                               "SupCon's docstring)")
    temperature: float = help_field(PRESET["temperature"], "temperature tau")


def build_method(cfg: SupConCifar, data: DataInfo):
    return SupCon(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                  head_bn=cfg.head_bn,
                  temperature=cfg.temperature, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SupConCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("simclr", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(SupConCifar, build_method, build_pipeline, name="supcon_cifar")
