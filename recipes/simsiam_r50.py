#!/usr/bin/env python
"""SimSiam, ResNet-50, ImageNet: Chen & He, "Exploring Simple Siamese Representation
Learning", CVPR 2021 (arXiv 2011.10566), Sec. 4, and the official code (facebookresearch/simsiam,
``main_simsiam.py --fix-pred-lr``).

Hyper-parameters: batch 512, SGD momentum 0.9, lr 0.05 x batch / 256, weight decay 1e-4,
cosine decay without warmup, 100 epochs; projector 3 layers at 2048 with BN (no affine on the
output BN), predictor 2048 -> 512 -> 2048; the predictor's lr fixed at the base lr; MoCo v2
augmentation (crop 0.2-1). Reported linear top-1: 68.1 % (100 epochs).

    accelerate launch recipes/simsiam_r50.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.engine.schedules import scaled_lr
from contrastive.methods import SimSiam

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SimSiam.from_preset("resnet50") builds the same); the fields below default to them
PRESET = SimSiam.presets["resnet50"]


@dataclass
class SimSiamR50(ImageConfig):
    """SimSiam, ResNet-50, ImageNet (CVPR 2021; official facebookresearch/simsiam)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 100
    batch_size: int = 512
    optimizer: str = override("sgd", "official: SGD")
    lr: float = override(0.05, "per 256 images (linear rule)")
    weight_decay: float = 1e-4
    exclude_from_wd: bool = override(False, "official code decays every parameter")
    sgd_momentum: float = 0.9
    warmup_epochs: float = 0
    schedule_per: str = override("epoch", "official: cosine per epoch")
    sync_bn: bool = override(True, "official: SyncBN across GPU processes")

    dim: int = help_field(PRESET["dim"], "projection dimension")
    pred_hidden: int = help_field(PRESET["pred_hidden"], "predictor bottleneck")
    fix_predictor_lr: bool = help_field(True, "official --fix-pred-lr")


def build_method(cfg: SimSiamR50, data: DataInfo):
    peak = scaled_lr(cfg.lr, cfg.batch_size, cfg.lr_scaling)
    return SimSiam(encoder=cfg.encoder, dim=cfg.dim, pred_hidden=cfg.pred_hidden,
                   predictor_lr=peak if cfg.fix_predictor_lr else None,
                   encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SimSiamR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size, scale=(0.2, 1.0))


if __name__ == "__main__":
    run(SimSiamR50, build_method, build_pipeline, name="simsiam_r50")
