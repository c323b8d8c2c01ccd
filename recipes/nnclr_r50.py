#!/usr/bin/env python
"""NNCLR, ResNet-50, ImageNet: Dwibedi et al., "With a Little Help from My Friends:
Nearest-Neighbor Contrastive Learning of Visual Representations", ICCV 2021 (arXiv 2104.14548),
Sec. 4.1 "Implementation details". The authors released no code and no configuration; the
paper is the only source (solo-learn's and lightly's ImageNet settings are their own).

Hyper-parameters: batch 4096, LARS, base lr 0.3 per 256 images (4.8 at 4096), 10 warm-up
epochs then cosine, weight decay 1e-6, 1000 epochs; projector 3 layers 2048-2048-256 with BN,
predictor 4096 -> 256; support set 98,304; temperature 0.1; BYOL's augmentation. Reported
linear top-1: 75.6 %. The support set holds the embeddings of every process.
The heads, support set, temperature and 75.6 % were checked against the paper's text; the
optimiser values (batch, LARS, lr, weight decay, warm-up, epochs) come from Sec. 4.1 as we
read it, and could not be re-checked against a stored copy of that section: verify them
against the paper before a long run.

    accelerate launch recipes/nnclr_r50.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import NNCLR

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (NNCLR.from_preset("resnet50") builds the same); the fields below default to them
PRESET = NNCLR.presets["resnet50"]


@dataclass
class NNCLRR50(ImageConfig):
    """NNCLR, ResNet-50, ImageNet (ICCV 2021, Sec. 4.1)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 1000
    batch_size: int = 4096
    optimizer: str = override("lars", "paper: LARS")
    lr: float = override(0.3, "per 256 images (linear rule): 4.8 at batch 4096")
    weight_decay: float = 1e-6
    warmup_epochs: float = 10
    schedule_per: str = override("step", "per iteration")
    sync_bn: bool = override(True, "global BN across GPU processes")

    dim: int = help_field(PRESET["dim"], "embedding dimension d")
    proj_hidden: int = help_field(PRESET["proj_hidden"], "projector hidden width")
    pred_hidden: int = help_field(PRESET["pred_hidden"], "predictor hidden width")
    support_size: int = help_field(PRESET["support_size"], "support set size")
    temperature: float = help_field(PRESET["temperature"], "temperature tau")


def build_method(cfg: NNCLRR50, data: DataInfo):
    return NNCLR(encoder=cfg.encoder, dim=cfg.dim, proj_hidden=cfg.proj_hidden,
                 pred_hidden=cfg.pred_hidden, support_size=cfg.support_size,
                 temperature=cfg.temperature, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: NNCLRR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size)


if __name__ == "__main__":
    run(NNCLRR50, build_method, build_pipeline, name="nnclr_r50")
