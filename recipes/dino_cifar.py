#!/usr/bin/env python
"""DINO on CIFAR-10 (Caron et al., ICCV 2021). Following solo-learn's
``scripts/pretrain/cifar/dino.yaml`` (vturrisi/solo-learn): ResNet-18 with the CIFAR stem, head
2048 hidden -> 256 bottleneck -> 4096 prototypes, teacher momentum 0.9995 -> 1, LARS lr 0.3 per
256 images with trust coefficient 0.02, weight decay 1e-6, batch 256, 1000 epochs, warmup +
cosine, two 32-px views with BYOL's asymmetric augmentation (solo-learn uses no local crops
here; ``--local-crops`` adds DINO's), the last layer frozen for the first epoch (the yaml sets
no ``freeze_last_layer``, so ``solo/methods/dino.py``'s default of 1 epoch holds: its gradients
dropped, as ``on_after_backward``), no gradient clip (its ``clip_grad`` default 0).
Temperatures: the official code's defaults (student 0.1, teacher 0.04), not solo-learn's
(teacher 0.07 from the start: its ``warmup_teacher_temperature_epochs`` default 0).

    python recipes/dino_cifar.py --data cifar10
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import DINO

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (DINO.from_preset("cifar") builds the same); the fields below default to them
PRESET = DINO.presets["cifar"]


@dataclass
class DINOCifar(CifarConfig):
    """DINO, CIFAR-10 (solo-learn's dino.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("lars", "solo-learn: LARS")
    lr: float = override(0.3, "per 256 images (linear rule)")
    weight_decay: float = 1e-6

    out_dim: int = help_field(PRESET["out_dim"], "number of prototypes")
    hidden_dim: int = help_field(PRESET["hidden_dim"], "head hidden width")
    bottleneck_dim: int = help_field(PRESET["bottleneck_dim"], "head bottleneck")
    momentum: float = help_field(
        PRESET["momentum"], "EMA momentum of the teacher at the start (-> 1)")
    teacher_temperature: float = help_field(0.04, "teacher temperature")
    local_crops: int = help_field(0, "DINO's local crops of --local-size px (0: two views)")
    local_size: int = help_field(16, "side of the local crops")
    multicrop_scales = "DINO's: global 0.4-1, local 0.05-0.4"  # --crop-min is refused with --local-crops
    freeze_last_layer_epochs: int = help_field(
        1, "last layer frozen for these epochs (solo-learn's freeze_last_layer default)")


def build_method(cfg: DINOCifar, data: DataInfo):
    return DINO(encoder=cfg.encoder, out_dim=cfg.out_dim, hidden_dim=cfg.hidden_dim,
                bottleneck_dim=cfg.bottleneck_dim, momentum=cfg.momentum,
                teacher_temperature=cfg.teacher_temperature,
                freeze_last_layer_steps=cfg.freeze_last_layer_epochs * data.steps_per_epoch,
                encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: DINOCifar):
    from contrastive.augment import get_pipeline

    if cfg.local_crops:
        return get_pipeline("dino", image_size=cfg.image_size, num_local=cfg.local_crops,
                            local_size=cfg.local_size)
    return get_pipeline("byol", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(DINOCifar, build_method, build_pipeline, name="dino_cifar")
