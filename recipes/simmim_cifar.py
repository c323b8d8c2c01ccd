#!/usr/bin/env python
"""SimMIM on CIFAR-10 at CPU / one-GPU scale (Xie et al., CVPR 2022; microsoft/SimMIM).

The paper gives no CIFAR setup; this keeps the authors' ViT-B recipe and shrinks the model:
ViT-Tiny (timm's ``vit_tiny_patch16_224`` built at 32 px with 4-px patches: 64 tokens, width
192, 12 blocks) with 8-px mask units (2 x 2 patches each, as ViT-B's 32-px units cover 2 x 2 of
its 16-px patches; 16 units), 60 % of them masked, a linear head on raw pixels, the l1 loss on
the masked pixels. Optimiser as the code's ViT-B configuration
(``configs/vit_base__800ep/simmim_pretrain__vit_base__img224__800ep.yaml``, ``config.py``,
``main_simmim.py``): AdamW, betas (0.9, 0.999), weight decay 0.05 except biases, norms, the
class token and position embedding, lr 1e-4 per 512 images (5e-5 per 256 here), 10 warm-up
epochs then x 0.1 at epoch 700 of 800 (per step), gradient norm clipped at 5; augmentation
``data/data_simmim.py``'s: RandomResizedCrop (0.67-1, aspect 3/4-4/3) and a flip. The code
warms up from 5e-7 x batch / 512, ours from 0. The kNN monitor and the linear probe read the
class token.

SimMIM's standard evaluation is end-to-end fine-tuning, which the toolkit does not have; the
paper reports no linear probe, and masked-image models' linear and kNN figures are known to be
low (MAE's Table 9: 68.0 % linear for ViT-L/16 against 84.9 % fine-tuned).

    python recipes/simmim_cifar.py --data cifar10
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.methods import SimMIM
from contrastive.methods.mae import LOSS_ON

#: the method's keyword arguments at this scale: the one home of these values
#: (SimMIM.from_preset("cifar") builds the same); the fields below default to them
PRESET = SimMIM.presets["cifar"]


@dataclass
class SimMIMCifar(CifarConfig):
    """SimMIM, CIFAR-10, ViT-Tiny with 4-px patches and 8-px mask units."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    epochs: int = 800
    warmup_epochs: float = override(10, "the code's WARMUP_EPOCHS 10 (of 800)")
    optimizer: str = override("adamw", "SimMIM: AdamW")
    lr: float = override(5e-5, "per 256 images: the code's BASE_LR 1e-4 per 512")
    weight_decay: float = override(0.05, "none on biases, norms, class token, position embedding")
    betas: tuple[float, float] = override((0.9, 0.999), "the code's OPTIMIZER.BETAS")
    lr_schedule: str = override("step", "the code's multistep schedule")
    lr_milestones: tuple[int, ...] = override((700,), "the code's MULTISTEPS [700]")
    lr_gamma: float = override(0.1, "the code's GAMMA 0.1")
    clip_grad_norm: float = override(5.0, "the code's CLIP_GRAD 5.0")
    crop_min: float = override(0.67, "RandomResizedCrop minimum scale (SimMIM: 0.67)")
    sync_bn: bool = override(False, "a ViT has no BatchNorm")

    mask_ratio: float = help_field(PRESET["mask_ratio"], "fraction of the mask units masked")
    mask_patch_size: int = help_field(PRESET["mask_patch_size"],
                                      "mask unit side in pixels (a multiple of the patch size)")
    loss_on: str = help_field("masked", "pixels the loss is taken on: masked (SimMIM) | all | "
                              "visible (a copy task: the negative control)", choices=LOSS_ON)


def build_method(cfg: SimMIMCifar, data: DataInfo):
    return SimMIM(encoder=cfg.encoder, mask_ratio=cfg.mask_ratio,
                  mask_patch_size=cfg.mask_patch_size, loss_on=cfg.loss_on,
                  encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SimMIMCifar):
    from contrastive.augment import get_pipeline

    # one view, RandomResizedCrop + flip, no colour: the "mae" pipeline with SimMIM's scale
    return get_pipeline("mae", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(SimMIMCifar, build_method, build_pipeline, name="simmim_cifar")
