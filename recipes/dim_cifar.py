#!/usr/bin/env python
"""Deep InfoMax (local, DIM(L)) on CIFAR-10: the paper's own setup (Hjelm et al., ICLR 2019,
arXiv 1808.06670, sec. 4 and appendix A) with the details of the authors' code (rdevon/DIM):

- encoder ``dcgan32`` (``cortex_DIM/configs/convnets.py`` ``basic32x32``, "used in Table 1
  CIFAR10 and CIFAR100 results"): convs 64-128-256 (4x4, stride 2, BN, ReLU), fc 1024 (BN,
  ReLU), a 64-d output, the global feature; local features: the 128 x 8 x 8 map of the second
  conv (``local_task_idx=(1, -1)``);
- MI networks: ``MI1x1ConvNet`` on both sides with ``mi_units`` 2048 (``models/dim.py``
  ``LocalDIM``; the older ``scripts/deep_infomax.py`` had 1024 and an MLP on the global side);
- estimator InfoNCE (the paper's comparison of estimators: infoNCE gives the best downstream
  classification, JSD is more stable; ``--estimator jsd`` is the code's default
  ``measure='JSD'``), negatives from the whole global batch;
- Adam, lr 1e-4 constant, batch 64 (``models/controller.py`` defaults ``learning_rate=1e-4``,
  ``batch_size=64``), betas (0.5, 0.999) (cortex's Adam default, ``cortex/_lib/optimizer.py``),
  no weight decay: ``--optimizer adamw --weight-decay 0`` is exactly Adam;
- 1000 epochs (the code's ``epochs=1000``; its README reports 71-72 % for this setup from the
  classifiers it trains alongside, "for monitoring purposes only").
- Views: NO augmentation (the paper augments STL-10 only): one view per image, the whole 32-px
  image normalised (the ``eval`` pipeline); ``--crop-min`` below 1 adds random resized crops.
- Not included: the prior-matching term and global DIM (the paper's DIM(L) rows use neither).

The paper's CIFAR-10 evaluation trains classifiers on the conv, fc and 64-d features (Table 1);
our kNN monitor uses the encoder output (the 64-d feature).

    python recipes/dim_cifar.py --data cifar10
    python recipes/dim_cifar.py --data shapes --epochs 5 --mi-units 256   # CPU minutes
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, DIMConfig, help_field, override, run


@dataclass
class DIMCifar(DIMConfig):
    """Deep InfoMax DIM(L), CIFAR-10 (paper sec. 4, appendix A; rdevon/DIM defaults)."""

    data: str = "cifar10"
    encoder: str = override("dcgan32", "the paper's DCGAN encoder (64-d output)")
    image_size: int = 32
    epochs: int = override(1000, "the code's epochs=1000")
    knn_every: int = 10
    crop_min: float = help_field(
        1.0, "minimum area fraction of the view's random resized crop: 1.0 = the whole image, "
        "no augmentation (the paper); below 1, crops of [crop_min, 1] of the area, resized")

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.crop_min <= 1.0:
            raise ValueError(f"--crop-min must be in (0, 1] (a fraction of the image area), got "
                             f"{self.crop_min}")


def build_method(cfg: DIMCifar, data: DataInfo):
    from contrastive.methods import DeepInfoMax

    return DeepInfoMax(encoder=cfg.encoder, local_stage=cfg.local_stage_index(),
                       mi_units=cfg.mi_units, estimator=cfg.estimator,
                       encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: DIMCifar):
    from contrastive.augment import Pipeline, ViewConfig, get_pipeline

    if cfg.crop_min < 1.0:  # not the paper: one random resized crop per image
        return Pipeline([ViewConfig(size=cfg.image_size, scale=(cfg.crop_min, 1.0))],
                        name="dim_crop")
    # the paper: no augmentation, one view, the whole image, normalised
    return get_pipeline("eval", image_size=cfg.image_size, crop_pct=1.0)


if __name__ == "__main__":
    run(DIMCifar, build_method, build_pipeline, name="dim_cifar")
