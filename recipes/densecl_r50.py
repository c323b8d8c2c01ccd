#!/usr/bin/env python
"""DenseCL, ResNet-50, ImageNet: Wang, Zhang, Shen, Kong, Li, "Dense Contrastive Learning for
Self-Supervised Visual Pre-Training", CVPR 2021 (arXiv 2011.09157), and the authors' code
(WXinlong/DenseCL, ``configs/selfsup/densecl/densecl_imagenet_200ep.py``, ``configs/base.py``).

Settings (all read from that config; the paper's full text could not be read here, only its
abstract, so the values are the code's): 200 epochs, batch 256
(32 x 8 GPUs), SGD lr 0.03 (NOT 0.3), momentum 0.9, weight decay 1e-4 on every parameter (the
config has no parameter-wise options), cosine to 0 (mmcv's ``CosineAnnealing``, per epoch, no
warm-up); MoCo v2's head 2048-2048-128 plus the dense head (1x1 conv 2048-2048, ReLU, 1x1 conv
2048-128) on ResNet-50's own 7 x 7 map (``num_grid=None``), queues of 65536, key momentum 0.999,
temperature 0.2, dense share lambda 0.5, shuffle BN; MoCo v2's "aug+" augmentation
(RandomResizedCrop 224 scale 0.2-1, colour jitter 0.4/0.4/0.4/0.1 p 0.8, grayscale p 0.2,
Gaussian blur sigma 0.1-2 p 0.5, flip). The paper's headline is transfer (its abstract: +2.0 AP
on VOC detection, +1.1 AP on COCO detection over MoCo v2), not ImageNet linear accuracy.

    accelerate launch recipes/densecl_r50.py --data /path/to/imagenet --output-dir runs/densecl

``--data`` is an ImageNet-style folder (``train/`` + ``val/``); every field is a flag (--help).
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import DenseCL

#: the method's keyword arguments in the paper's setting: the one home of these values
PRESET = DenseCL.presets["r50"]


@dataclass
class DenseCLR50(ImageConfig):
    """DenseCL, ResNet-50, ImageNet (arXiv 2011.09157; WXinlong/DenseCL's 200-epoch config)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 200
    batch_size: int = 256
    optimizer: str = override("sgd", "the code: SGD")
    lr: float = override(0.03, "per 256 images (the config's lr at its batch 256)")
    weight_decay: float = 1e-4
    exclude_from_wd: bool = override(False, "the code decays every parameter")
    sgd_momentum: float = 0.9
    warmup_epochs: float = override(0, "the config has no warm-up")
    lr_schedule: str = override("cosine", "mmcv CosineAnnealing, min_lr 0")
    schedule_per: str = override("epoch", "mmcv's CosineAnnealing is by epoch")

    dim: int = help_field(PRESET["dim"], "output (key) dimension of both heads")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "hidden width of both heads")
    queue_size: int = help_field(PRESET["queue_size"], "keys K of each queue")
    momentum: float = help_field(PRESET["momentum"], "key-encoder EMA momentum m")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature tau")
    dense_weight: float = help_field(PRESET["dense_weight"], "lambda, the dense loss's share")
    grid: int = help_field(PRESET["grid"], "pool the map to grid x grid (0 = as it is)")
    shuffle_bn: bool = help_field(True, "shuffle BN across processes")
    split_bn: int = help_field(0, "split-BN groups per process (0 = plain BN)")

    crop_min: float = help_field(0.2, "RandomResizedCrop minimum scale")


def build_method(cfg: DenseCLR50, data: DataInfo):
    return DenseCL(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                   queue_size=cfg.queue_size, momentum=cfg.momentum,
                   temperature=cfg.temperature, dense_weight=cfg.dense_weight, grid=cfg.grid,
                   shuffle_bn=cfg.shuffle_bn, split_bn=cfg.split_bn,
                   encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: DenseCLR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(DenseCLR50, build_method, build_pipeline, name="densecl_r50")
