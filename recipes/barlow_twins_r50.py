#!/usr/bin/env python
"""Barlow Twins, ResNet-50, ImageNet: Zbontar et al., ICML 2021 (arXiv 2103.03230), Sec. 4
"Implementation details", and the official code (facebookresearch/barlowtwins, ``main.py``).

Hyper-parameters: batch 2048, LARS (biases and BN parameters neither decayed nor adapted),
lr 0.2 for the weights and 0.0048 for the biases and BN parameters, both per 256 images ("we
multiply the learning rate by the batch size and divide it by 256"; the code's
``adjust_learning_rate``: ``base_lr = batch_size / 256``, so 1.6 and 0.0384 at batch 2048), 10
warmup epochs then cosine to 1/1000 of the peak (the code's ``end_lr = base_lr * 0.001``), the
same schedule for both groups (the biases' lr is ``--bias-lr-scale`` 0.024 = 0.0048 / 0.2 times
the weights'), weight decay 1.5e-6 (the paper; the code's default is 1e-6), 1000 epochs;
projector 8192-8192-8192; lambda 0.0051 (the code; 5e-3 in the paper); BYOL's augmentation.
Reported linear top-1: 73.2 %.

    accelerate launch recipes/barlow_twins_r50.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import BarlowTwins

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (BarlowTwins.from_preset("resnet50") builds the same); the fields below default to them
PRESET = BarlowTwins.presets["resnet50"]


@dataclass
class BarlowTwinsR50(ImageConfig):
    """Barlow Twins, ResNet-50, ImageNet (ICML 2021; official facebookresearch/barlowtwins)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 1000
    batch_size: int = 2048
    optimizer: str = override("lars", "paper: LARS")
    lr: float = override(0.2, "the weights' lr per 256 images (1.6 at batch 2048)")
    lr_scaling: str = override("linear", "lr x batch / 256, as the paper and code")
    bias_lr_scale: float = help_field(
        PRESET["bias_lr_scale"], "biases and BN parameters: this times the "
        "weights' lr (official 0.0048 / 0.2)")
    weight_decay: float = 1.5e-6
    warmup_epochs: float = 10
    min_lr: float = override(0.001, "cosine floor: 1/1000 of the peak (official end_lr)")
    schedule_per: str = override("step", "per iteration")
    sync_bn: bool = override(True, "official: SyncBN across GPU processes")

    dim: int = help_field(PRESET["dim"], "projector output width")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "projector hidden width")
    lambd: float = help_field(PRESET["lambd"], "off-diagonal weight (code 0.0051, paper 5e-3)")


def build_method(cfg: BarlowTwinsR50, data: DataInfo):
    return BarlowTwins(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                       lambd=cfg.lambd, bias_lr_scale=cfg.bias_lr_scale,
                       encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: BarlowTwinsR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size)


if __name__ == "__main__":
    run(BarlowTwinsR50, build_method, build_pipeline, name="barlow_twins_r50")
