#!/usr/bin/env python
"""Deep InfoMax (local, DIM(L)) on STL-10 at 64 x 64: the paper's own setup (Hjelm et al., ICLR
2019, arXiv 1808.06670, sec. 4 and appendix A) with the details of the authors' code
(rdevon/DIM); everything not listed is as ``recipes/dim_cifar.py`` (Adam lr 1e-4 constant,
betas (0.5, 0.999), batch 64, ``mi_units`` 2048, InfoNCE, no prior term, no global DIM).

- Data: the 100,000 unlabelled plus the 5,000 labelled training images (``stl10:unlabeled=true``).
- Views (sec. 4: "We use data augmentation with this dataset, taking random 64 x 64 crops and
  flipping horizontally during unsupervised learning"): one view per image, a random 64 x 64
  window of the 96 x 96 image at full resolution (a random resized crop whose area is
  (64/96)^2 of the image with aspect ratio 1, so nothing is resized; ``--source-size`` says
  the source side) and a horizontal flip with p 0.5.
- Encoder: ``alexnet64``, the paper's encoder for "all other datasets" than CIFAR (appendix A;
  the code's ``alex64x64``, "used for STL10 and tiny Imagenet results", README: ``--encoder_type
  alexnet``): five 3x3 convs with max-pooling, two fc 4096, a 64-d output; local features the
  384 x 15 x 15 map of the third conv (``local_task_idx=(2, -1)``). ``--encoder dcgan64`` is the
  code's ``basic64x64`` (the DCGAN design one conv deeper, local map 256 x 8 x 8), smaller.
- Epochs: 100, the README's STL-10 command (``--t.epochs 100``).
- kNN monitor off by default: with ``unlabeled=true`` the train split (the monitor's bank) is
  mostly unlabelled images; use ``--data stl10 --knn-every N`` for a labelled-only monitor run.

    python recipes/dim_stl.py --data stl10:unlabeled=true
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, DIMConfig, help_field, override, run


@dataclass
class DIMSTL(DIMConfig):
    """Deep InfoMax DIM(L), STL-10 at 64 px (paper sec. 4, appendix A; rdevon/DIM)."""

    data: str = "stl10:unlabeled=true"
    encoder: str = override("alexnet64", "the paper's STL-10 encoder (64-d output)")
    image_size: int = override(64, "side of the random crops (the paper: 64)")
    source_size: int = help_field(96, "side of the source images (STL-10: 96); the crops are "
                                  "image-size windows of it, not resized")
    flip_p: float = help_field(0.5, "horizontal flip probability")
    epochs: int = override(100, "the README's STL-10 command")
    knn_every: int = override(0, "off: the unlabeled=true train split is mostly unlabelled")

    def validate(self) -> None:
        super().validate()
        if not 8 <= self.image_size <= self.source_size:
            raise ValueError(f"--image-size {self.image_size} must be in [8, --source-size "
                             f"{self.source_size}]: the views are windows of the source images")
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"--flip-p is a probability, got {self.flip_p}")


def build_method(cfg: DIMSTL, data: DataInfo):
    from contrastive.methods import DeepInfoMax

    return DeepInfoMax(encoder=cfg.encoder, local_stage=cfg.local_stage_index(),
                       mi_units=cfg.mi_units, estimator=cfg.estimator,
                       encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: DIMSTL):
    from contrastive.augment import Pipeline, ViewConfig

    area = (cfg.image_size / cfg.source_size) ** 2  # a window of image_size x image_size pixels
    view = ViewConfig(size=cfg.image_size, scale=(area, area), ratio=(1.0, 1.0),
                      flip_p=cfg.flip_p)
    return Pipeline([view], name="dim_stl")


if __name__ == "__main__":
    run(DIMSTL, build_method, build_pipeline, name="dim_stl")
