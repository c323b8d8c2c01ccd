#!/usr/bin/env python
"""MAE on CIFAR-10 at CPU / one-GPU scale (He et al., CVPR 2022; facebookresearch/mae).

The paper gives no CIFAR setup; this keeps its recipe and shrinks the model: ViT-Tiny (timm's
``vit_tiny_patch16_224`` built at 32 px with 4-px patches: 64 tokens, width 192, 12 blocks),
a decoder of 2 blocks of width 128 (the paper's Table 1a/b shows shallow, narrow decoders
still work), 75 % of the patches masked, per-patch normalised pixel targets; the paper's
optimiser (``main_pretrain.py``): AdamW, betas (0.9, 0.95), weight decay 0.05 except biases
and norms, lr 1.5e-4 x batch / 256, linear warm-up then half-cycle cosine per step; MAE's
augmentation (one RandomResizedCrop 0.2-1 view with a flip). The warm-up is the paper's 40 of
800 epochs. The kNN monitor and the linear probe read the class token.

MAE's standard evaluation is end-to-end fine-tuning, which the toolkit does not have; its
linear-probe and kNN figures are known to be low (the paper's Table 9: 68.0 % linear for
ViT-L/16 on ImageNet against 84.9 % fine-tuned).

    python recipes/mae_cifar.py --data cifar10
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import MAE
from contrastive.methods.mae import LOSS_ON

#: the method's keyword arguments at this scale: the one home of these values
#: (MAE.from_preset("cifar") builds the same); the fields below default to them
PRESET = MAE.presets["cifar"]


@dataclass
class MAECifar(CifarConfig):
    """MAE, CIFAR-10, ViT-Tiny with 4-px patches."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    epochs: int = 800
    warmup_epochs: float = override(40, "the paper's 40 warm-up epochs")
    optimizer: str = override("adamw", "MAE: AdamW")
    lr: float = override(1.5e-4, "per 256 images (the paper's base lr, linear rule)")
    weight_decay: float = override(0.05, "none on biases and norms (timm's add_weight_decay)")
    betas: tuple[float, float] = override((0.9, 0.95), "MAE's AdamW betas")
    crop_min: float = override(0.2, "RandomResizedCrop minimum scale (MAE: 0.2)")
    sync_bn: bool = override(False, "a ViT has no BatchNorm")

    mask_ratio: float = help_field(PRESET["mask_ratio"], "fraction of patches removed")
    decoder_dim: int = help_field(PRESET["decoder_dim"], "decoder width")
    decoder_depth: int = help_field(PRESET["decoder_depth"], "decoder blocks")
    decoder_heads: int = help_field(PRESET["decoder_heads"], "decoder attention heads")
    norm_pix: bool = help_field(PRESET["norm_pix"], "per-patch normalised pixel targets")
    loss_on: str = help_field("masked", "patches the loss is taken on: masked (MAE) | all | "
                              "visible (a copy task: the negative control)",
                              choices=LOSS_ON)


def build_method(cfg: MAECifar, data: DataInfo):
    return MAE(encoder=cfg.encoder, mask_ratio=cfg.mask_ratio, decoder_dim=cfg.decoder_dim,
               decoder_depth=cfg.decoder_depth, decoder_heads=cfg.decoder_heads,
               norm_pix=cfg.norm_pix, loss_on=cfg.loss_on, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: MAECifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("mae", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(MAECifar, build_method, build_pipeline, name="mae_cifar")
