#!/usr/bin/env python
"""BYOL, ResNet-50, ImageNet: Grill et al., "Bootstrap Your Own Latent", NeurIPS 2020
(arXiv 2006.07733), Sec. 3.3 and Appendix C, and the authors' code (deepmind-research ``byol``).

Hyper-parameters: batch 4096, LARS (biases and BN parameters neither decayed nor adapted), base
lr 0.2 x batch / 256, weight decay 1.5e-6, 10 warmup epochs then cosine, 1000 epochs (300 in
the ablations); projector and predictor 4096 -> 256 with BN; target momentum
tau = 1 - (1 - 0.996)(cos(pi k / K) + 1) / 2; BYOL's asymmetric augmentation (Table 6).
Reported linear top-1: 74.3 % (1000 epochs).

    accelerate launch recipes/byol_r50.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import BYOL

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (BYOL.from_preset("resnet50") builds the same); the fields below default to them
PRESET = BYOL.presets["resnet50"]


@dataclass
class BYOLR50(ImageConfig):
    """BYOL, ResNet-50, ImageNet (NeurIPS 2020, Sec. 3.3)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 1000
    batch_size: int = 4096
    optimizer: str = override("lars", "paper: LARS")
    lr: float = override(0.2, "per 256 images (linear rule): 3.2 at batch 4096")
    weight_decay: float = 1.5e-6
    warmup_epochs: float = 10
    schedule_per: str = override("step", "per iteration")
    sync_bn: bool = override(True, "global BN across GPU processes")

    dim: int = help_field(PRESET["dim"], "projection dimension")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "hidden width of projector and predictor")
    momentum: float = help_field(PRESET["momentum"], "EMA momentum of the target network at the "
                                 "start (tau_base; -> 1 on a half cosine)")


def build_method(cfg: BYOLR50, data: DataInfo):
    return BYOL(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                momentum=cfg.momentum, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: BYOLR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size)


if __name__ == "__main__":
    run(BYOLR50, build_method, build_pipeline, name="byol_r50")
