#!/usr/bin/env python
"""SimCLR, ResNet-50, ImageNet: Chen, Kornblith, Norouzi, Hinton, "A Simple Framework for
Contrastive Learning of Visual Representations", ICML 2020 (and google-research/simclr).

Hyper-parameters (paper sec. 2.3 "Default setting", sec. 4-5, and the official README command):
batch 4096, 100 epochs, LARS with lr 0.3 x batch / 256 (= 4.8; the README's equivalent is 0.075
x sqrt(batch)), weight decay 1e-6 (biases and BN excluded from decay and adaptation), 10 warmup
epochs then cosine decay; 2-layer projection head 2048-2048-128 with BN; NT-Xent with
temperature 0.1 (paper Table 5 at batch 4096, README ``--temperature=0.1``); global BN across
devices; augmentation RandomResizedCrop 224 (0.08-1) + flip, colour distortion strength 1.0,
Gaussian blur p 0.5. Negatives are gathered from all processes WITH gradient. Reported linear
top-1: 69.3 (1000 epochs; 69.1 released); about 64.5 after 100 epochs (README).

    accelerate launch recipes/simclr_r50.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import SimCLR

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SimCLR.from_preset("imagenet") builds the same); the fields below default to them
PRESET = SimCLR.presets["imagenet"]


@dataclass
class SimCLRR50(ImageConfig):
    """SimCLR, ResNet-50, ImageNet (ICML 2020; google-research/simclr)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 100
    batch_size: int = 4096
    optimizer: str = override("lars", "paper: LARS")
    lr: float = override(0.3, "per 256 images (linear rule): 4.8 at batch 4096")
    weight_decay: float = 1e-6
    sgd_momentum: float = 0.9
    warmup_epochs: float = 10
    lr_schedule: str = override("cosine", "warmup + cosine")
    sync_bn: bool = override(True, "paper: global BN across devices")

    dim: int = help_field(PRESET["dim"], "projection output dimension")
    mlp_hidden: int = help_field(2048, "projection head hidden width")
    proj_layers: int = help_field(2, "projection head layers (SimCLR v1: 2; v2: 3)")
    temperature: float = help_field(PRESET["temperature"], "NT-Xent temperature tau")
    color_strength: float = help_field(1.0, "colour distortion strength s")


def build_method(cfg: SimCLRR50, data: DataInfo):
    return SimCLR(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                  num_layers=cfg.proj_layers, temperature=cfg.temperature,
                  encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SimCLRR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("simclr", image_size=cfg.image_size, s=cfg.color_strength)


if __name__ == "__main__":
    run(SimCLRR50, build_method, build_pipeline, name="simclr_r50")
