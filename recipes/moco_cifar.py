#!/usr/bin/env python
"""MoCo on CIFAR-10: the setup of the official MoCo CIFAR-10 demo (facebookresearch/moco,
``colab/moco_cifar10_demo.ipynb``, He et al. CVPR 2020).

ResNet-18 with the CIFAR stem (3x3 conv, stride 1, no max-pool) and a LINEAR 512->128 head,
batch 512, SGD lr 0.06 with a per-epoch cosine schedule, weight decay 5e-4 on every parameter,
a 4096-key queue, key-encoder momentum 0.99, temperature 0.1, split BN with 8 groups (the demo's
one-GPU stand-in for shuffle BN), 200 epochs; augmentation RandomResizedCrop 32 (scale 0.08-1),
colour jitter 0.4/0.4/0.4/0.1 p 0.8, grayscale p 0.2, flip, no blur; weighted kNN (k 200,
t 0.1) on the 128-d output every epoch. The demo reports 82.6 % kNN top-1 after 200 epochs
(85.3 % with ``--symmetric``), about 20 s per epoch on one V100.

    accelerate launch recipes/moco_cifar.py --data cifar10
    accelerate launch recipes/moco_cifar.py --data cifar10 --resident  # GPU: data held there
    python recipes/moco_cifar.py --data shapes --encoder small_cnn --epochs 5   # CPU minutes

Precision: the default ``--mixed-precision auto`` trains under bf16 autocast where the CPU or
GPU computes bf16 natively (about 2x fp32 on an AVX-512-bf16 CPU) and in fp32 elsewhere: on a CPU
without native bf16 (AVX2, or AVX-512 without AVX512_BF16) bf16 is emulated and about 10x SLOWER
than fp32 (benchmarks/results/train.md).
Every field below is a flag: ``python recipes/moco_cifar.py --help``.
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import MoCo

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (MoCo.from_preset("cifar") builds the same); the fields below default to them
PRESET = MoCo.presets["cifar"]

# CIFAR-10 per-channel statistics used by the demo's transforms.Normalize
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)


@dataclass
class MoCoCifar(ImageConfig):
    """MoCo CIFAR-10 demo (see the module docstring for the sources)."""

    data: str = "cifar10"
    encoder: str = PRESET["encoder"]
    image_size: int = 32
    epochs: int = 200
    batch_size: int = 512
    lr: float = override(0.03, "per 256 images (linear rule): 0.06 at the demo's batch 512")
    lr_schedule: str = override("cosine", "the demo's cosine schedule")
    schedule_per: str = override("epoch", "the demo adjusts the lr once per epoch")
    weight_decay: float = 5e-4
    exclude_from_wd: bool = override(False, "the demo decays every parameter")
    sgd_momentum: float = 0.9
    knn_every: int = 1
    knn_feature: str = override("head", "the demo runs kNN on the 128-d output")
    save_every_steps: int = 0

    # MoCo
    dim: int = help_field(PRESET["dim"], "output (key) dimension; the head is Linear(512, dim)")
    queue_size: int = help_field(PRESET["queue_size"], "negative keys K")
    momentum: float = help_field(PRESET["momentum"], "key-encoder EMA momentum m")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature tau")
    symmetric: bool = help_field(False, "symmetric loss L(q1,k2) + L(q2,k1) (85.3 %% in the "
                                 "demo)")
    split_bn: int = help_field(PRESET["split_bn"], "split-BN groups per process (0 = plain BN)")
    shuffle_bn: bool = help_field(True, "shuffle BN (across processes; locally with split BN)")

    # augmentation (the demo's: mocov2 at 32 px without blur)
    crop_min: float = help_field(0.08, "RandomResizedCrop minimum scale")
    jitter: tuple[float, float, float, float] = help_field(
        (0.4, 0.4, 0.4, 0.1), "colour jitter brightness contrast saturation hue")
    jitter_p: float = help_field(0.8, "colour jitter probability")
    grayscale_p: float = help_field(0.2, "grayscale probability")


def build_method(cfg: MoCoCifar, data: DataInfo):
    return MoCo(encoder=cfg.encoder, version=PRESET["version"], dim=cfg.dim,
                queue_size=cfg.queue_size, momentum=cfg.momentum, temperature=cfg.temperature,
                symmetric=cfg.symmetric, split_bn=cfg.split_bn, shuffle_bn=cfg.shuffle_bn,
                queue_labels=cfg.pass_indices,  # diagnostics: data-set index of each key
                encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: MoCoCifar):
    from contrastive.augment import get_pipeline

    b, c, s, h = cfg.jitter  # mocov2 at 32 px has no blur, as the demo
    return get_pipeline("mocov2", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0),
                        brightness=b, contrast=c, saturation=s, hue=h, jitter_p=cfg.jitter_p,
                        grayscale_p=cfg.grayscale_p, mean=CIFAR_MEAN, std=CIFAR_STD)


if __name__ == "__main__":
    run(MoCoCifar, build_method, build_pipeline, name="moco_cifar")
