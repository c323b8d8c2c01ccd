#!/usr/bin/env python
"""MoCo v3, ResNet-50, ImageNet: Chen, Xie, He, "An Empirical Study of Training Self-Supervised
Vision Transformers", ICCV 2021, and the official code (facebookresearch/moco-v3, ``main_moco.py``
and ``CONFIG.md``, checked for these values).

Hyper-parameters: batch 4096, LARS (trust coefficient 0.001, momentum 0.9; biases and BN
parameters neither decayed nor adapted), lr 0.6 x batch / 256 for 100 epochs (CONFIG.md uses
``--lr=.3`` for 300 and 1000 epochs, with ``--wd=1.5e-6 --moco-m=0.996`` for 1000), weight decay
1e-6, 10 warmup epochs then half-cycle cosine, both per iteration; projector 2048-4096-256,
predictor 256-4096-256, temperature 1.0, key-encoder momentum from 0.99 to 1 on a cosine
schedule (``--moco-m-cos``), SyncBN across GPUs, torchvision ResNet-50 with
``zero_init_residual=True``; BYOL augmentation with ``--crop-min=.2``. Reported linear top-1
68.9 / 72.8 / 74.6 at 100 / 300 / 1000 epochs.

    accelerate launch recipes/mocov3_r50.py --data /path/to/imagenet --mixed-precision fp16
    accelerate launch recipes/mocov3_r50.py --data ... --epochs 300 --lr 0.3
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import MoCoV3

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (MoCoV3.from_preset("resnet50") builds the same); the fields below default to them
PRESET = MoCoV3.presets["resnet50"]


@dataclass
class MoCoV3R50(ImageConfig):
    """MoCo v3, ResNet-50, ImageNet (ICCV 2021; official facebookresearch/moco-v3 CONFIG.md)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 100
    batch_size: int = 4096
    optimizer: str = override("lars", "official: LARS")
    lr: float = override(0.6, "per 256 images (linear rule); 0.3 for 300/1000 epochs")
    weight_decay: float = override(1e-6, "1.5e-6 for 1000 epochs")
    sgd_momentum: float = 0.9
    warmup_epochs: float = 10
    lr_schedule: str = override("cosine", "warmup + half-cycle cosine")
    schedule_per: str = override("step", "official: per iteration")
    sync_bn: bool = override(True, "official: SyncBN across GPU processes")

    dim: int = help_field(PRESET["dim"], "output dimension")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "hidden width of projector and predictor")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature tau")
    momentum: float = help_field(
        PRESET["momentum"], "initial key-encoder momentum m0 (0.996 for 1000 epochs)")
    momentum_cosine: bool = help_field(True, "anneal m from m0 to 1 (half cosine)")
    crop_min: float = help_field(0.2, "RandomResizedCrop minimum scale (CONFIG.md: .2)")
    zero_init_residual: bool = help_field(True, "torchvision ResNets: zero-init the last BN of "
                                          "each residual block (official)")


def build_method(cfg: MoCoV3R50, data: DataInfo):
    kwargs = cfg.encoder_options()
    if cfg.encoder.startswith("torchvision:resnet") and cfg.zero_init_residual:
        kwargs["zero_init_residual"] = True
    return MoCoV3(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                  temperature=cfg.temperature, momentum=cfg.momentum,
                  momentum_schedule="cosine" if cfg.momentum_cosine else "constant", vit=False,
                  encoder_kwargs=kwargs)


def build_pipeline(cfg: MoCoV3R50):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov3", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(MoCoV3R50, build_method, build_pipeline, name="mocov3_r50")
