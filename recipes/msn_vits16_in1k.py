#!/usr/bin/env python
"""MSN, ViT-S/16, ImageNet: Assran et al., "Masked Siamese Networks for Label-Efficient
Learning", ECCV 2022 (arXiv 2204.07141), with the authors' settings: facebookresearch/msn
``configs/pretrain/msn_vits16.yaml`` and ``src/msn_train.py`` (values read there; the paper's
text was not read here, so where it differs from the code this follows the code).

From the config: deit_small (timm's ViT-S/16), drop path 0, a 3-layer head 384-2048-2048-256
with BN, 1024 prototypes, temperature 0.1, target sharpening 0.25 (start = final: constant; the
target's temperature 0.025), Sinkhorn-Knopp on the targets, me-max weight 1 (``ent_weight`` 0),
patch drop 0.15 on the random view, 1 random + 10 focal views (96 px, scale 0.05-0.3; random
224 px, scale 0.3-1; colour jitter strength 0.5, blur p 0.5), 64 images per GPU (16 GPUs in the
README's command: batch 1024), 800 epochs, AdamW lr 1e-3 (absolute, not scaled), 15 warm-up
epochs, cosine to 1e-6, weight decay 0.04 -> 0.4 (cosine; none on biases, norms, BN and the
prototypes), gradient clipping 3.0 (encoder and head); from ``msn_train.py``: teacher momentum
0.996 -> 1 (linear), SyncBatchNorm over several processes, the prototypes uniform in
+-1/sqrt(256).

Where the engine differs from the code (stated, not hidden): the warm-up starts at 0, not
``start_lr`` 2e-4; the lr cosine ends at the run's end, where the code's runs to 1.25 x the run
(so its last lr is above 1e-6); the prototypes' gradient is clipped apart at 3.0 (the code
leaves it unclipped) and averaged over the processes (the code sums it: AdamW all but cancels
the factor); the class token and position embedding get no weight decay here (1-D or norm
parameters only in the code's groups; ``--exclude-from-wd``). The momentum and weight-decay
schedules are the code's, 1.25 x stretch included (the method's schedules).

PMSN (Assran et al., ICLR 2023, arXiv 2210.07277): ``--prior power_law`` (exponent
``--power-law-exponent``, 0.25); its ImageNet / iNaturalist settings are not read here.

    accelerate launch recipes/msn_vits16_in1k.py --data /path/to/imagenet
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import MSN
from contrastive.methods.msn import PRIORS

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (MSN.from_preset("vit_small") builds the same); the fields below default to them
PRESET = MSN.presets["vit_small"]


@dataclass
class MSNImageNet(ImageConfig):
    """MSN, ViT-S/16, ImageNet-1k (ECCV 2022; facebookresearch/msn)."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    image_size: int = 224
    epochs: int = 800
    batch_size: int = override(1024, "effective batch (16 GPUs x 64, the code's batch_size)")
    optimizer: str = override("adamw", "the code: AdamW")
    lr: float = override(1e-3, "the code's lr (absolute)")
    lr_scaling: str = override("none", "the code does not scale its lr by the batch")
    min_lr: float = override(1e-3, "cosine floor as a fraction: the code's final_lr 1e-6")
    warmup_epochs: float = 15
    weight_decay: float = override(0.04, "start of the cosine weight-decay schedule")
    weight_decay_end: float = help_field(0.4, "end of the cosine weight-decay schedule")
    exclude_from_wd: bool = override(True, "no decay on biases and norms (the code's groups)")
    schedule_per: str = override("step", "per iteration")
    clip_grad_norm: float = override(3.0, "the code's clip_grad 3.0 (encoder and head)")
    sync_bn: bool = override(True, "the code's SyncBatchNorm over several processes")

    hidden_dim: int = help_field(PRESET["hidden_dim"], "head hidden width")
    out_dim: int = help_field(PRESET["out_dim"], "head output width (the prototypes' too)")
    num_prototypes: int = help_field(PRESET["num_prototypes"], "prototypes")
    temperature: float = help_field(0.1, "anchor softmax temperature")
    sharpen_temperature: float = help_field(0.25, "target sharpening (x temperature: 0.025)")
    sinkhorn_iterations: int = help_field(3, "Sinkhorn-Knopp on the targets (0: none)")
    regularization_weight: float = help_field(1.0, "me-max (or PMSN's KL) weight")
    prior: str = help_field("uniform", "uniform: MSN's me-max; power_law: PMSN",
                            choices=PRIORS)
    power_law_exponent: float = help_field(0.25, "PMSN's prior exponent")
    patch_drop: float = help_field(PRESET["patch_drop"], "fraction of the random view's "
                                   "patches dropped")
    momentum: float = help_field(PRESET["momentum"], "teacher EMA momentum at the start (-> 1)")
    focal_views: int = help_field(10, "focal views")
    focal_size: int = help_field(96, "focal view side")


def build_method(cfg: MSNImageNet, data: DataInfo):
    return MSN(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), **MSN.options_of(cfg))


def build_pipeline(cfg: MSNImageNet):
    from contrastive.augment import get_pipeline

    # the target view and the random view (the code's rand_views + 1), then the focal views
    return get_pipeline("multicrop", image_size=cfg.image_size, num_global=2,
                        num_local=cfg.focal_views, local_size=cfg.focal_size,
                        global_scale=(0.3, 1.0), local_scale=(0.05, 0.3), s=0.5, blur_p=0.5)


if __name__ == "__main__":
    run(MSNImageNet, build_method, build_pipeline, name="msn_vits16_in1k")
