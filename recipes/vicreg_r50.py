#!/usr/bin/env python
"""VICReg, ResNet-50, ImageNet: Bardes, Ponce, LeCun, ICLR 2022 (arXiv 2105.04906), Sec. 4.1
and Appendix C, and the official code (facebookresearch/vicreg, ``main_vicreg.py``:
``--mlp 8192-8192-8192 --base-lr 0.2 --wd 1e-6 --batch-size 2048``).

Hyper-parameters: batch 2048, LARS (biases and BN parameters neither decayed nor adapted), base
lr 0.2 x batch / 256, weight decay 1e-6, 10 warmup epochs then cosine to 1/1000, 1000 epochs
(the code's README example runs 100); expander 8192-8192-8192; weights (25, 25, 1); BYOL's
augmentation. Reported linear top-1: 73.2 % (1000 epochs).

    accelerate launch recipes/vicreg_r50.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import VICReg

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (VICReg.from_preset("resnet50") builds the same); the fields below default to them
PRESET = VICReg.presets["resnet50"]


@dataclass
class VICRegR50(ImageConfig):
    """VICReg, ResNet-50, ImageNet (ICLR 2022; official facebookresearch/vicreg)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 1000
    batch_size: int = 2048
    optimizer: str = override("lars", "official: LARS")
    lr: float = override(0.2, "per 256 images (linear rule, the code's --base-lr)")
    weight_decay: float = 1e-6
    warmup_epochs: float = 10
    schedule_per: str = override("step", "per iteration")
    sync_bn: bool = override(True, "global BN across GPU processes")

    dim: int = help_field(PRESET["dim"], "expander output width")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "expander hidden width")


def build_method(cfg: VICRegR50, data: DataInfo):
    return VICReg(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                  encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: VICRegR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size)


if __name__ == "__main__":
    run(VICRegR50, build_method, build_pipeline, name="vicreg_r50")
