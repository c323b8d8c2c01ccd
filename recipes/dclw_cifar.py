#!/usr/bin/env python
"""DCLW on CIFAR-10: DCL with the von Mises-Fisher weighting of the positive term (Yeh et al.,
"Decoupled Contrastive Learning", ECCV 2022, arXiv 2110.06848, sec. 4; sigma 0.5).

Everything else is recipes/dcl_cifar.py (see its docstring for what is and is not checked);
the method's settings live in ``DCLW.presets["cifar"]``.

    python recipes/dclw_cifar.py --data cifar10
    python recipes/dclw_cifar.py --data shapes --encoder small_cnn --epochs 5   # CPU minutes
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import TrainConfig, help_field, run
from contrastive.methods import DCLW

#: the method's keyword arguments in the paper's setting: the one home of these values
PRESET = DCLW.presets["cifar"]


@dataclass
class DCLWCifar(TrainConfig):
    """DCLW, CIFAR-10 (DCL's recipe with the weighted loss)."""

    data: str = "cifar10"
    encoder: str = PRESET["encoder"]
    image_size: int = 32
    epochs: int = 200
    batch_size: int = 256
    optimizer: str = help_field("lars", "SimCLR's code default", choices=("sgd", "adamw", "lars"))
    lr: float = help_field(1.0, "per 256 images (linear rule)")
    weight_decay: float = 1e-4
    sgd_momentum: float = 0.9
    warmup_epochs: float = 10
    lr_schedule: str = help_field("cosine", "warmup + cosine", choices=("cosine", "step",
                                                                      "constant"))
    sync_bn: bool = help_field(True, "global BN across GPU processes")
    knn_every: int = 10
    save_every_steps: int = 0

    dim: int = help_field(PRESET["dim"], "projection output dimension")
    mlp_hidden: int = help_field(512, "projection head hidden width (= backbone width)")
    proj_layers: int = help_field(2, "projection head layers")
    temperature: float = help_field(PRESET["temperature"], "DCLW temperature tau")
    sigma: float = help_field(PRESET["sigma"], "von Mises-Fisher weighting concentration sigma")
    color_strength: float = help_field(0.5, "colour distortion strength s")
    crop_min: float = help_field(0.08, "RandomResizedCrop minimum scale of the two views")


def build_method(cfg: DCLWCifar):
    return DCLW(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
               num_layers=cfg.proj_layers, temperature=cfg.temperature,
                sigma=cfg.sigma, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: DCLWCifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("simclr", image_size=cfg.image_size, s=cfg.color_strength,
                        scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(DCLWCifar, build_method, build_pipeline, name="dclw_cifar")
