#!/usr/bin/env python
"""VICRegL, ResNet-50, ImageNet: Bardes, Ponce, LeCun, "VICRegL: Self-Supervised Learning of
Local Visual Features", NeurIPS 2022 (arXiv 2210.01571), and the authors' code
(facebookresearch/VICRegL at 803ae4c: ``README.md`` and ``main_vicregl.py``).

The ResNet-50 setting (the ConvNeXt ones train with AdamW and multi-crop; not this recipe). The
paper's text could not be read here (its abstract only: 55.9 mIoU linear frozen on Pascal VOC
with ResNet-50, the README's alpha-0.75 checkpoint), so every value is the code's:

- the README's multi-node ResNet-50 command (README.md 146-150): 300 epochs, batch 2048, LARS,
  base lr 0.2, weight decay 1e-6, two 224-px crops of scale 0.08-1, alpha 0.75. Which command
  trained the released checkpoints is not stated; its single-node example (README.md 132-136)
  runs 100 epochs at batch 512 with base lr 0.3 (``--epochs 100 --batch-size 512 --base-lr 0.3``).
- ``main_vicregl.py``: expander ``--mlp 8192-8192-8192`` (line 50), local expander
  ``--maps-mlp 512-512-512`` (51), ``--alpha 0.75`` (54), ``--num_matches 20 4`` (55-61),
  ``--l2_all_matches 1`` (62: every feature match kept), weights 25 / 25 / 1 (63-65), 10
  warm-up epochs (70), end lr 1/1000 of the peak (74), lr = base lr x batch / 256 per step
  (``utils.learning_schedule``), SyncBatchNorm (124).
- ``optimizers.py`` 104-113: LARS, momentum 0.9, eta 1e-3, biases and norms neither decayed
  nor adapted (our ``lars`` is the same update).
- ``transforms.py``: BYOL's colour augmentation per view (blur p 1.0 / 0.1, solarize 0 / 0.2,
  jitter 0.4/0.4/0.2/0.1 p 0.8, grayscale 0.2, flip; our ``byol`` pipeline); the grid ignores
  the flip (``--no-flip-grid 1``, main_vicregl.py 44). Differences: the code resizes bicubic
  and normalises with std 0.228 for red (ours: bilinear, ImageNet's 0.229).

    accelerate launch recipes/vicregl_in1k.py --data /path/to/imagenet --output-dir runs/vicregl

``--data`` is an ImageNet-style folder (``train/`` + ``val/``); every field is a flag (--help).
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import VICRegL

#: the method's keyword arguments in the code's ResNet-50 setting: the one home of these values
PRESET = VICRegL.presets["resnet50"]


@dataclass
class VICRegLIn1k(ImageConfig):
    """VICRegL, ResNet-50, ImageNet (arXiv 2210.01571; facebookresearch/VICRegL)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 300
    batch_size: int = 2048
    optimizer: str = override("lars", "the code's ResNet-50 command: LARS")
    lr: float = override(0.2, "per 256 images (linear rule, the code's --base-lr)")
    weight_decay: float = 1e-6
    warmup_epochs: float = 10
    min_lr: float = override(0.001, "the code's --end-lr-ratio")
    schedule_per: str = override("step", "per iteration")
    sync_bn: bool = override(True, "the code converts BN to SyncBatchNorm")

    dim: int = help_field(PRESET["dim"], "global expander output width")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "global expander hidden width")
    maps_dim: int = help_field(PRESET["maps_dim"], "local expander output width")
    maps_hidden: int = help_field(PRESET["maps_hidden"], "local expander hidden width")
    alpha: float = help_field(PRESET["alpha"], "global loss share: alpha global + (1 - alpha) "
                              "local")
    num_matches: tuple[int, int] = help_field(PRESET["num_matches"], "location matches kept, "
                                              "view i -> j and j -> i")
    crop_min: float = help_field(0.08, "RandomResizedCrop minimum scale")


def build_method(cfg: VICRegLIn1k, data: DataInfo):
    return VICRegL(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                   maps_dim=cfg.maps_dim, maps_hidden=cfg.maps_hidden, alpha=cfg.alpha,
                   num_matches=cfg.num_matches, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: VICRegLIn1k):
    from contrastive.augment import get_pipeline

    return get_pipeline("byol", image_size=cfg.image_size,
                        scale=(cfg.crop_min, 1.0)).with_crop_boxes()


if __name__ == "__main__":
    run(VICRegLIn1k, build_method, build_pipeline, name="vicregl_in1k")
