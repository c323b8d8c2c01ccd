#!/usr/bin/env python
"""MoCo v1, ResNet-50, ImageNet: He, Fan, Wu, Xie, Girshick, "Momentum Contrast for Unsupervised
Visual Representation Learning", CVPR 2020, and the official code (facebookresearch/moco,
``main_moco.py`` defaults).

Hyper-parameters (paper sec. 3.3 / 4 + official defaults): 200 epochs, batch 256, SGD lr 0.03,
momentum 0.9, weight decay 1e-4 on every parameter, lr x0.1 at epochs 120 and 160; linear
2048->128 head, temperature 0.07, 65536 negative keys, key-encoder momentum 0.999, shuffle BN;
augmentation RandomResizedCrop 224 (scale 0.2-1), grayscale p 0.2, colour jitter 0.4 (each),
flip. Reported ImageNet linear top-1: 60.6 (released checkpoint; 60.8 +- 0.2 in the README).

    accelerate launch recipes/mocov1_r50.py --data /path/to/imagenet --output-dir runs/mocov1
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import MoCo

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (MoCo.from_preset("v1") builds the same); the fields below default to them
PRESET = MoCo.presets["v1"]


@dataclass
class MoCoV1R50(ImageConfig):
    """MoCo v1, ResNet-50, ImageNet (He et al. CVPR 2020; official facebookresearch/moco)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 200
    batch_size: int = 256
    lr: float = override(0.03, "per 256 images (linear rule)")
    weight_decay: float = 1e-4
    exclude_from_wd: bool = override(False, "official code decays every parameter")
    sgd_momentum: float = 0.9
    lr_schedule: str = override("step", "x lr_gamma at each of --lr-milestones")
    lr_milestones: tuple[int, ...] = override((120, 160), "official '--schedule 120 160'")
    lr_gamma: float = 0.1
    schedule_per: str = override("epoch", "official: lr set once per epoch")

    dim: int = help_field(PRESET["dim"], "output (key) dimension; the head is Linear(2048, dim)")
    queue_size: int = help_field(PRESET["queue_size"], "negative keys K")
    momentum: float = help_field(PRESET["momentum"], "key-encoder EMA momentum m")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature tau")
    shuffle_bn: bool = help_field(True, "shuffle BN across processes")
    split_bn: int = help_field(0, "split-BN groups per process: the one-GPU stand-in for "
                               "shuffle BN of the MoCo CIFAR demo (0 = plain BN)")


def build_method(cfg: MoCoV1R50, data: DataInfo):
    return MoCo(encoder=cfg.encoder, version=PRESET["version"], dim=cfg.dim,
                queue_size=cfg.queue_size, momentum=cfg.momentum, temperature=cfg.temperature,
                shuffle_bn=cfg.shuffle_bn, split_bn=cfg.split_bn,
                queue_labels=cfg.pass_indices, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: MoCoV1R50):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov1", image_size=cfg.image_size)


if __name__ == "__main__":
    run(MoCoV1R50, build_method, build_pipeline, name="mocov1_r50")
