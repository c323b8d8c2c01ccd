#!/usr/bin/env python
"""MoCo v2, ResNet-50, ImageNet: Chen, Fan, Girshick, He, "Improved Baselines with Momentum
Contrastive Learning", arXiv:2003.04297 (2020), and the official code (facebookresearch/moco,
``main_moco.py`` with ``--mlp --moco-t 0.2 --aug-plus --cos``).

Hyper-parameters (paper sec. 3 + official README): 200 epochs, batch 256, SGD lr 0.03 (linear
rule: 0.015 for batch 128, as the README advises), momentum 0.9, weight decay 1e-4 on every
parameter, cosine lr adjusted once per epoch; 2-layer MLP head 2048-2048-128, temperature 0.2,
65536 negative keys, key-encoder momentum 0.999, shuffle BN; "aug+" augmentation
(RandomResizedCrop 224 scale 0.2-1, colour jitter 0.4/0.4/0.4/0.1 p 0.8, grayscale p 0.2,
Gaussian blur sigma 0.1-2 p 0.5, flip). Reported ImageNet linear top-1: 67.5 +- 0.1 (200 epochs),
71.1 (800 epochs); 53 h for 200 epochs on 8 V100.

    accelerate launch recipes/moco_r50.py --data /path/to/imagenet --output-dir runs/mocov2
    accelerate launch recipes/moco_r50.py --data /path/to/imagenet --output-dir runs/mocov2 \\
        --resume auto                                   # after an interruption

``--data`` is an ImageNet-style folder (``train/`` + ``val/``); every field is a flag (--help).
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import MoCo

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (MoCo.from_preset("v2") builds the same); the fields below default to them
PRESET = MoCo.presets["v2"]


@dataclass
class MoCoV2R50(ImageConfig):
    """MoCo v2, ResNet-50, ImageNet (arXiv:2003.04297; official facebookresearch/moco)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 200
    batch_size: int = 256
    optimizer: str = override("sgd", "official: SGD")
    lr: float = override(0.03, "per 256 images (linear rule, as the official README)")
    weight_decay: float = 1e-4
    exclude_from_wd: bool = override(False, "official code decays every parameter")
    sgd_momentum: float = 0.9
    lr_schedule: str = override("cosine", "MoCo v2 '--cos'")
    schedule_per: str = override("epoch", "official: lr set once per epoch")

    dim: int = help_field(PRESET["dim"], "output (key) dimension")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "hidden width of the 2-layer MLP head")
    queue_size: int = help_field(PRESET["queue_size"], "negative keys K")
    momentum: float = help_field(PRESET["momentum"], "key-encoder EMA momentum m")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature tau")
    shuffle_bn: bool = help_field(True, "shuffle BN across processes")
    split_bn: int = help_field(0, "split-BN groups per process: the one-GPU stand-in for "
                               "shuffle BN of the MoCo CIFAR demo (0 = plain BN)")

    # augmentation: "aug+" (blur p 0.5 at 224 px; none for small images)
    crop_min: float = help_field(0.2, "RandomResizedCrop minimum scale")
    jitter: tuple[float, float, float, float] = help_field(
        (0.4, 0.4, 0.4, 0.1), "colour jitter brightness contrast saturation hue")
    jitter_p: float = help_field(0.8, "colour jitter probability")
    grayscale_p: float = help_field(0.2, "grayscale probability")


def build_method(cfg: MoCoV2R50, data: DataInfo):
    return MoCo(encoder=cfg.encoder, version=PRESET["version"], dim=cfg.dim,
                mlp_hidden=cfg.mlp_hidden, queue_size=cfg.queue_size, momentum=cfg.momentum,
                temperature=cfg.temperature, shuffle_bn=cfg.shuffle_bn,
                split_bn=cfg.split_bn,
                queue_labels=cfg.pass_indices, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: MoCoV2R50):
    from contrastive.augment import get_pipeline

    b, c, s, h = cfg.jitter
    return get_pipeline("mocov2", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0),
                        brightness=b, contrast=c, saturation=s, hue=h, jitter_p=cfg.jitter_p,
                        grayscale_p=cfg.grayscale_p)


if __name__ == "__main__":
    run(MoCoV2R50, build_method, build_pipeline, name="moco_r50")
