#!/usr/bin/env python
"""MAE, ViT-L/16 (or ViT-B/16), ImageNet: He et al., "Masked Autoencoders Are Scalable Vision
Learners", CVPR 2022 (arXiv 2111.06377), with the authors' code's settings
(facebookresearch/mae ``PRETRAIN.md``, ``main_pretrain.py``, ``models_mae.py``, checked for
these values; the paper's appendix A.1 / Table 8 lists the same).

Hyper-parameters: 800 epochs (the paper's best runs: 1600), batch 4096, AdamW lr 1.5e-4 x
batch / 256 (``--blr``), betas (0.9, 0.95), weight decay 0.05 except biases and norms (timm's
``add_weight_decay``), 40 linear warm-up epochs then half-cycle cosine to 0 per iteration;
mask ratio 0.75, decoder 8 blocks of width 512 with 16 heads, normalised-pixel targets
(``--norm_pix_loss``), augmentation RandomResizedCrop (0.2-1, bicubic in the code) + flip.
ViT-L is ``PRETRAIN.md``'s recommended default; ``--encoder timm:vit_base_patch16_224`` for
ViT-B. Reported: ViT-L 800 epochs 85.5 % fine-tuned (``PRETRAIN.md``); linear probing is low
by design (paper Table 9: 68.0 % ViT-L) and fine-tuning is not in the toolkit.

    accelerate launch recipes/mae_in1k.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import MAE

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (MAE.from_preset("vit_large") builds the same); the fields below default to them
PRESET = MAE.presets["vit_large"]


@dataclass
class MAEImageNet(ImageConfig):
    """MAE, ViT-L/16, ImageNet-1k (CVPR 2022; official facebookresearch/mae)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = override(800, "PRETRAIN.md: 800 (the paper's longest: 1600)")
    batch_size: int = override(4096, "effective batch (PRETRAIN.md)")
    optimizer: str = override("adamw", "official: AdamW")
    lr: float = override(1.5e-4, "per 256 images (--blr, linear rule)")
    betas: tuple[float, float] = override((0.9, 0.95), "main_pretrain.py's AdamW betas")
    weight_decay: float = override(0.05, "none on biases and norms (timm's add_weight_decay)")
    exclude_from_wd: bool = True
    warmup_epochs: float = 40
    min_lr: float = override(0.0, "the code's --min_lr 0")
    schedule_per: str = override("step", "per iteration (util/lr_sched.py)")
    crop_min: float = help_field(0.2, "RandomResizedCrop minimum scale")

    mask_ratio: float = help_field(PRESET["mask_ratio"], "fraction of patches removed")
    decoder_dim: int = help_field(PRESET["decoder_dim"], "decoder width")
    decoder_depth: int = help_field(PRESET["decoder_depth"], "decoder blocks")
    decoder_heads: int = help_field(PRESET["decoder_heads"], "decoder attention heads")
    norm_pix: bool = help_field(PRESET["norm_pix"], "per-patch normalised pixel targets")

    def validate(self) -> None:
        """The base checks and a crop scale in (0, 1]."""
        super().validate()
        if not 0.0 < self.crop_min <= 1.0:
            raise ValueError(f"--crop-min must be in (0, 1], got {self.crop_min}")


def build_method(cfg: MAEImageNet, data: DataInfo):
    return MAE(encoder=cfg.encoder, mask_ratio=cfg.mask_ratio, decoder_dim=cfg.decoder_dim,
               decoder_depth=cfg.decoder_depth, decoder_heads=cfg.decoder_heads,
               norm_pix=cfg.norm_pix, encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: MAEImageNet):
    from contrastive.augment import get_pipeline

    return get_pipeline("mae", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0))


if __name__ == "__main__":
    run(MAEImageNet, build_method, build_pipeline, name="mae_in1k")
