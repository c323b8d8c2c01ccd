#!/usr/bin/env python
"""I-JEPA on CIFAR-10 at CPU / one-GPU scale (Assran et al., CVPR 2023; facebookresearch/ijepa).

The paper gives no CIFAR setup; this keeps the authors' ViT-H/14 recipe
(``configs/in1k_vith14_ep300.yaml``, see ``recipes/ijepa_vith14_in1k.py``) and shrinks the
model: ViT-Tiny (timm's ``vit_tiny_patch16_224`` built at 32 px with 4-px patches, no class
token: an 8 x 8 patch grid, width 192, 12 blocks) and a predictor of 6 blocks of width 96 (the
code's: 12 x 384 for ViT-H's 32 x 1280). The masks are the code's (4 targets of scale 0.15-0.2,
aspect 0.75-1.5; a context of scale 0.85-1.0 without them) with ``min_keep`` 4, the collator's
default (the YAML's 10 of 256 patches would refuse the 3 x 3 target blocks of 64). The
optimiser is the YAML's: AdamW (torch's betas), lr 1e-3 at batch 2048 (1.25e-4 per 256),
40 warm-up epochs of 300 then cosine to 1e-3 of the peak (``final_lr`` 1e-6), weight decay
cosine 0.04 -> 0.4 except biases and 1-d parameters, target EMA linear 0.996 -> 1; one
RandomResizedCrop (0.3-1) view, no flip or colour. Warm-up from 0 (the code: from 2e-4).

The kNN monitor and the linear probe read the average-pooled normed patches of the encoder
(the paper evaluates the target encoder, whose pooled features are the method's logged
embeddings). Masked-image ViTs learn little at CPU scale (the methods table's ViT block).

    python recipes/ijepa_cifar.py --data cifar10
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contrastive.engine import CifarConfig, DataInfo, help_field, override, run
from contrastive.losses.regression import IJEPA_DISTANCES
from contrastive.methods import IJEPA

#: the method's keyword arguments at this scale: the one home of these values
#: (IJEPA.from_preset("cifar") builds the same); the fields below default to them
PRESET = IJEPA.presets["cifar"]


@dataclass
class IJEPACifar(CifarConfig):
    """I-JEPA, CIFAR-10, ViT-Tiny with 4-px patches and no class token."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    epochs: int = 300
    warmup_epochs: float = override(40, "the YAML's warmup 40 (of 300)")
    optimizer: str = override("adamw", "I-JEPA: AdamW")
    lr: float = override(1.25e-4, "per 256 images: the YAML's 1e-3 at batch 2048")
    min_lr: float = override(1e-3, "cosine floor as a fraction: final_lr 1e-6 of 1e-3")
    weight_decay: float = override(PRESET["weight_decay"],
                                   "start of the cosine schedule; none on 1-d parameters")
    weight_decay_end: float = help_field(PRESET["weight_decay_end"], "end of the cosine schedule")
    crop_min: float = override(0.3, "RandomResizedCrop minimum scale (the YAML's crop_scale)")
    sync_bn: bool = override(False, "a ViT has no BatchNorm")

    predictor_depth: int = help_field(PRESET["predictor_depth"], "predictor blocks")
    predictor_dim: int = help_field(PRESET["predictor_dim"], "predictor width")
    min_keep: int = help_field(PRESET["min_keep"], "a context block keeps more patches")
    distance: str = help_field("smooth_l1", "smooth_l1 (the code) | l2 (the paper's eq. 1)",
                               choices=IJEPA_DISTANCES)


def build_method(cfg: IJEPACifar, data: DataInfo):
    return IJEPA.from_preset("cifar", encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(),
                             predictor_depth=cfg.predictor_depth,
                             predictor_dim=cfg.predictor_dim, min_keep=cfg.min_keep,
                             weight_decay=cfg.weight_decay,
                             weight_decay_end=cfg.weight_decay_end, distance=cfg.distance)


def build_pipeline(cfg: IJEPACifar):
    from contrastive.augment import get_pipeline

    return get_pipeline("mae", image_size=cfg.image_size, scale=(cfg.crop_min, 1.0), flip_p=0.0)


if __name__ == "__main__":
    run(IJEPACifar, build_method, build_pipeline, name="ijepa_cifar")
