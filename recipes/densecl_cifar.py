#!/usr/bin/env python
"""DenseCL on CIFAR-10 at CPU / one-GPU scale (Wang et al., CVPR 2021; WXinlong/DenseCL).

The authors give no CIFAR setting (their configs are ImageNet and COCO); this one is ours: the
MoCo CIFAR-10 demo's (facebookresearch/moco ``colab/moco_cifar10_demo.ipynb``, as
``recipes/moco_cifar.py``) ResNet-18 with the CIFAR stem, batch 512, SGD lr 0.06 with a
per-epoch cosine schedule, weight decay 5e-4 on every parameter, a 4096-key queue (each of the
two), key momentum 0.99, split BN with 8 groups, 200 epochs, its augmentation (mocov2 at 32 px
without blur, crop scale 0.08-1); DenseCL's part as the authors' code: both heads 2-layer
(512-512-128 here: the hidden width follows the backbone's, as 2048 on ResNet-50), temperature
0.2, dense share lambda 0.5. The dense head runs on ResNet-18's 4 x 4 map at 32 px. Weighted kNN
(k 200, t 0.1) on the global 128-d output every epoch.

    accelerate launch recipes/densecl_cifar.py --data cifar10
    python recipes/densecl_cifar.py --data shapes --encoder small_cnn --epochs 5   # CPU minutes

Every field below is a flag: ``python recipes/densecl_cifar.py --help``.
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import DenseCL

#: the method's keyword arguments of this setting: the one home of these values
PRESET = DenseCL.presets["cifar"]

# CIFAR-10 per-channel statistics used by the MoCo demo's transforms.Normalize
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)


@dataclass
class DenseCLCifar(ImageConfig):
    """DenseCL on CIFAR-10 (see the module docstring for where each value comes from)."""

    data: str = "cifar10"
    encoder: str = PRESET["encoder"]
    image_size: int = 32
    epochs: int = 200
    batch_size: int = 512
    lr: float = override(0.03, "per 256 images (linear rule): 0.06 at the demo's batch 512")
    lr_schedule: str = override("cosine", "the MoCo demo's cosine schedule")
    schedule_per: str = override("epoch", "the demo adjusts the lr once per epoch")
    weight_decay: float = 5e-4
    exclude_from_wd: bool = override(False, "the demo and DenseCL's code decay every parameter")
    sgd_momentum: float = 0.9
    knn_every: int = 1
    knn_feature: str = override("head", "kNN on the global 128-d output, as the MoCo demo")
    save_every_steps: int = 0

    dim: int = help_field(PRESET["dim"], "output (key) dimension of both heads")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "hidden width of both heads")
    queue_size: int = help_field(PRESET["queue_size"], "keys K of each queue")
    momentum: float = help_field(PRESET["momentum"], "key-encoder EMA momentum m")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature tau")
    dense_weight: float = help_field(PRESET["dense_weight"], "lambda, the dense loss's share")
    grid: int = help_field(PRESET["grid"], "pool the map to grid x grid (0 = as it is)")
    split_bn: int = help_field(PRESET["split_bn"], "split-BN groups per process (0 = plain BN)")
    shuffle_bn: bool = help_field(True, "shuffle BN (across processes; locally with split BN)")

    crop_min: float = help_field(0.08, "RandomResizedCrop minimum scale")


def build_method(cfg: DenseCLCifar, data: DataInfo):
    return DenseCL(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                   queue_size=cfg.queue_size, momentum=cfg.momentum,
                   temperature=cfg.temperature, dense_weight=cfg.dense_weight, grid=cfg.grid,
                   shuffle_bn=cfg.shuffle_bn, split_bn=cfg.split_bn,
                   encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: DenseCLCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0),
                        mean=CIFAR_MEAN, std=CIFAR_STD)


if __name__ == "__main__":
    run(DenseCLCifar, build_method, build_pipeline, name="densecl_cifar")
