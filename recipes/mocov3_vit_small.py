#!/usr/bin/env python
"""MoCo v3, ViT-Small, ImageNet: Chen, Xie, He, ICCV 2021, and the official code
(facebookresearch/moco-v3, ``main_moco.py``, ``vits.py``, ``CONFIG.md``, checked for these values).

Hyper-parameters: 300 epochs, batch 4096 (CONFIG.md's one-node variant: ``-b 1024``), AdamW
lr 1.5e-4 x batch / 256, weight decay 0.1 on every parameter (the official AdamW gets
``model.parameters()``), 40 warmup epochs then half-cycle cosine per iteration; temperature 0.2,
3-layer projector and 2-layer predictor (4096 hidden, 256 out), key-encoder momentum 0.99 -> 1
(cosine), frozen random patch projection (``--stop-grad-conv1``), crop minimum scale 0.08.
The official ViT-S has 12 attention heads where timm's ``vit_small_patch16_224`` has 6 (same
weights shapes): ``--vit-num-heads 12`` builds the official one (``encoder.pt`` then records
``encoder_kwargs`` that evaluation must pass to ``create_encoder``); the default keeps timm's
model so that ``create_encoder(name)`` alone rebuilds it. The fixed 2-D sin-cos position embedding
of the official code is set on every ViT in the model. Reported linear top-1 73.2.

    accelerate launch recipes/mocov3_vit_small.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import MoCoV3

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (MoCoV3.from_preset("vit_small") builds the same); the fields below default to them
PRESET = MoCoV3.presets["vit_small"]


@dataclass
class MoCoV3ViTSmall(ImageConfig):
    """MoCo v3, ViT-Small/16, ImageNet (ICCV 2021; official facebookresearch/moco-v3)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 300
    batch_size: int = 4096
    optimizer: str = override("adamw", "official: AdamW")
    lr: float = override(1.5e-4, "per 256 images (linear rule)")
    weight_decay: float = 0.1
    exclude_from_wd: bool = override(False, "official AdamW decays every parameter")
    warmup_epochs: float = 40
    lr_schedule: str = override("cosine", "warmup + half-cycle cosine")
    schedule_per: str = override("step", "official: per iteration")
    sync_bn: bool = override(True, "official: SyncBN (in the heads) across GPU processes")

    dim: int = help_field(PRESET["dim"], "output dimension")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "hidden width of projector and predictor")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature tau")
    momentum: float = help_field(PRESET["momentum"], "initial key-encoder momentum m0")
    momentum_cosine: bool = help_field(True, "anneal m from m0 to 1 (half cosine)")
    crop_min: float = help_field(0.08, "RandomResizedCrop minimum scale")
    freeze_patch_embed: bool = help_field(
        PRESET["freeze_patch_embed"], "frozen random patch projection "
        "(--stop-grad-conv1)")
    vit_num_heads: int = help_field(0, "attention heads of timm ViTs (official ViT-S: 12; 0 = "
                                    "timm's default, 6)")
    fixed_pos_embed: bool = help_field(True, "fixed 2-D sin-cos position embedding (official)")

    def encoder_options(self) -> dict:
        kwargs = super().encoder_options()
        if self.encoder.startswith("timm:vit") and self.vit_num_heads:
            kwargs["num_heads"] = self.vit_num_heads
        return kwargs


def build_method(cfg: MoCoV3ViTSmall, data: DataInfo):
    vit = cfg.encoder.startswith("timm:vit")
    method = MoCoV3(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                    temperature=cfg.temperature, momentum=cfg.momentum,
                    momentum_schedule="cosine" if cfg.momentum_cosine else "constant", vit=vit,
                    freeze_patch_embed=cfg.freeze_patch_embed and vit,
                    encoder_kwargs=cfg.encoder_options())
    if cfg.fixed_pos_embed:
        from contrastive.nn.pos_embed import fix_sincos_pos_embed

        fix_sincos_pos_embed(method)  # query and key ViTs alike
    return method


def build_pipeline(cfg: MoCoV3ViTSmall):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov3", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(MoCoV3ViTSmall, build_method, build_pipeline, name="mocov3_vit_small")
