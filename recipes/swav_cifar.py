#!/usr/bin/env python
"""SwAV on CIFAR-10 (Caron et al., NeurIPS 2020). Following solo-learn's
``scripts/pretrain/cifar/swav.yaml`` (vturrisi/solo-learn): ResNet-18 with the CIFAR stem,
projector 2048 -> 128, 3000 prototypes, temperature 0.1, a queue of 3840 embeddings, LARS lr
0.6 per 256 images with trust coefficient 0.02, weight decay 1e-6, batch 256, 1000 epochs,
warmup + cosine; two 32-px views (solo-learn's "symmetric" augmentation). solo-learn freezes
the prototypes for 2 epochs and starts the queue at epoch 50: here the prototypes are frozen
for ``--freeze-prototypes-steps`` (2 epochs of 50k images at batch 256 = 390) and the queue
starts filling at ``--queue-start-steps`` (50 such epochs = 9750 steps) and joins the Sinkhorn
once full. Both are optimiser steps: rescale them with the batch size.

    python recipes/swav_cifar.py --data cifar10
    python recipes/swav_cifar.py --data cifar10 --local-crops 4   # multi-crop, 16-px locals
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import SwAV

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SwAV.from_preset("cifar") builds the same); the fields below default to them
PRESET = SwAV.presets["cifar"]


@dataclass
class SwAVCifar(CifarConfig):
    """SwAV, CIFAR-10 (solo-learn's swav.yaml)."""

    encoder: str = PRESET["encoder"]
    optimizer: str = override("lars", "solo-learn: LARS")
    lr: float = override(0.6, "per 256 images (linear rule)")
    weight_decay: float = 1e-6

    dim: int = help_field(PRESET["dim"], "embedding dimension")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "projector hidden width")
    num_prototypes: int = help_field(PRESET["num_prototypes"], "number of prototypes")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature")
    queue_size: int = help_field(PRESET["queue_size"], "queue of past embeddings (0: none)")
    queue_start_steps: int = help_field(9750, "the queue starts at this step (solo-learn: "
                                        "epoch 50 = 9750 steps at batch 256)")
    freeze_prototypes_steps: int = help_field(390, "prototypes frozen for these steps")
    local_crops: int = help_field(0, "extra local crops of --local-size px (multi-crop)")
    local_size: int = help_field(16, "side of the local crops")
    multicrop_scales = "SwAV's: global 0.14-1, local 0.05-0.14"  # --crop-min is refused with --local-crops


def build_method(cfg: SwAVCifar, data: DataInfo):
    return SwAV(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                num_prototypes=cfg.num_prototypes, temperature=cfg.temperature,
                queue_size=cfg.queue_size, queue_start_steps=cfg.queue_start_steps,
                freeze_prototypes_steps=cfg.freeze_prototypes_steps,
                encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SwAVCifar):
    from contrastive.augment import get_pipeline

    if cfg.local_crops:
        return get_pipeline("multicrop", image_size=cfg.image_size, num_local=cfg.local_crops,
                            local_size=cfg.local_size)
    return get_pipeline("simclr", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(SwAVCifar, build_method, build_pipeline, name="swav_cifar")
