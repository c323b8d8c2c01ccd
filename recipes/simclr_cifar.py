#!/usr/bin/env python
"""SimCLR on CIFAR-10: the paper's CIFAR-10 setup (Chen et al. ICML 2020, appendix B.9) with
the values of the official README's CIFAR-10 command (google-research/simclr):

    python run.py --train_mode=pretrain --train_batch_size=512 --train_epochs=1000
      --learning_rate=1.0 --weight_decay=1e-4 --temperature=0.5 --dataset=cifar10
      --image_size=32 --resnet_depth=18 --use_blur=False --color_jitter_strength=0.5

i.e. ResNet-18 with the CIFAR stem (3x3 conv stride 1, no max-pool: appendix B.9), batch 512,
1000 epochs, LARS (the code's default optimiser) with lr 1.0 x batch / 256 (linear scaling, the
code's default), 10 warmup epochs (code default) then cosine, weight decay 1e-4, temperature 0.5,
colour distortion strength 0.5, no blur; 2-layer projection head to 128-d. The README reports
about 91 % linear accuracy (its linear-eval command).

    python recipes/simclr_cifar.py --data cifar10
    python recipes/simclr_cifar.py --data shapes --encoder small_cnn --epochs 5   # CPU minutes
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import SimCLR

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SimCLR.from_preset("cifar") builds the same); the fields below default to them
PRESET = SimCLR.presets["cifar"]


@dataclass
class SimCLRCifar(ImageConfig):
    """SimCLR, CIFAR-10 (appendix B.9; official README CIFAR-10 command)."""

    data: str = "cifar10"
    encoder: str = "cifar_resnet18"
    image_size: int = 32
    epochs: int = 1000
    batch_size: int = 512
    optimizer: str = override("lars", "official code default")
    lr: float = override(1.0, "per 256 images (linear rule): 2.0 at batch 512")
    weight_decay: float = 1e-4
    sgd_momentum: float = 0.9
    warmup_epochs: float = 10
    lr_schedule: str = override("cosine", "warmup + cosine")
    sync_bn: bool = override(True, "global BN across GPU processes")
    knn_every: int = 10
    save_every_steps: int = 0

    dim: int = help_field(PRESET["dim"], "projection output dimension")
    mlp_hidden: int = help_field(512, "projection head hidden width (= backbone width)")
    proj_layers: int = help_field(2, "projection head layers")
    temperature: float = help_field(PRESET["temperature"], "NT-Xent temperature tau")
    color_strength: float = help_field(0.5, "colour distortion strength s")
    crop_min: float = help_field(0.08, "RandomResizedCrop minimum scale of the two views "
                                 "(1.0: whole image; not used with --local-crops)")
    local_crops: int = help_field(
        0, "multi-crop: this many extra local crops of --local-size px besides the two global "
        "views (the multicrop pipeline, SwAV's scales); every other view of an image is a "
        "positive (0 = the paper's two views)")
    local_size: int = help_field(16, "side of the local crops (multi-crop)")


def build_method(cfg: SimCLRCifar, data: DataInfo):
    return SimCLR(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                  num_layers=cfg.proj_layers, temperature=cfg.temperature,
                  encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SimCLRCifar):
    from contrastive.augment import get_pipeline

    if cfg.local_crops:
        return get_pipeline("multicrop", image_size=cfg.image_size, num_global=2,
                            num_local=cfg.local_crops, local_size=cfg.local_size,
                            s=cfg.color_strength)
    # the simclr preset drops the blur for small images, as the CIFAR-10 setup does
    return get_pipeline("simclr", image_size=cfg.image_size, s=cfg.color_strength,
                        scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(SimCLRCifar, build_method, build_pipeline, name="simclr_cifar")
