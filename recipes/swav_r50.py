#!/usr/bin/env python
"""SwAV, ResNet-50, ImageNet: Caron et al., NeurIPS 2020 (arXiv 2006.09882), and the official
code's 800-epoch command (facebookresearch/swav README, ``main_swav.py``).

Hyper-parameters: multi-crop 2 x 224 px (scale 0.14-1) + 6 x 96 px (scale 0.05-0.14), codes from
the two global crops, temperature 0.1, epsilon 0.05, 3 Sinkhorn iterations, projector 2048 ->
128, 3000 prototypes frozen for the first 313 iterations, no queue at batch 4096 (64 GPUs x 64),
LARS, lr 4.8 (absolute, for batch 4096) with 10 warmup epochs then cosine to 0.0048, weight
decay 1e-6, SyncBN, 800 epochs. Reported linear top-1: 75.3 %.

    accelerate launch recipes/swav_r50.py --data /path/to/imagenet
    # small batches: add a queue, as the README's 256-batch commands
    accelerate launch recipes/swav_r50.py --data ... --batch-size 256 --queue-size 3840
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import SwAV

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SwAV.from_preset("resnet50") builds the same); the fields below default to them
PRESET = SwAV.presets["resnet50"]


@dataclass
class SwAVR50(ImageConfig):
    """SwAV, ResNet-50, ImageNet (NeurIPS 2020; official facebookresearch/swav, 800 epochs)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = 800
    batch_size: int = 4096
    optimizer: str = override("lars", "official: LARS")
    lr: float = override(4.8, "absolute lr at batch 4096 (official --base_lr)")
    lr_scaling: str = override("none", "the code gives the lr for its batch")
    min_lr: float = override(0.001, "cosine floor as a fraction: official --final_lr 0.0048")
    weight_decay: float = 1e-6
    warmup_epochs: float = 10
    schedule_per: str = override("step", "per iteration")
    sync_bn: bool = override(True, "official: SyncBN across GPU processes")

    dim: int = help_field(PRESET["dim"], "embedding dimension (--feat_dim)")
    mlp_hidden: int = help_field(PRESET["mlp_hidden"], "projector hidden width")
    num_prototypes: int = help_field(PRESET["num_prototypes"], "number of prototypes")
    temperature: float = help_field(PRESET["temperature"], "softmax temperature")
    epsilon: float = help_field(0.05, "Sinkhorn-Knopp entropy regularisation")
    queue_size: int = help_field(0, "queue of past embeddings (0 at batch 4096; 3840 at 256)")
    queue_start_steps: int = help_field(75075, "the queue starts at this step (the code's "
                                        "epoch_queue_starts 15, about 75,000 steps at batch 256)")
    freeze_prototypes_steps: int = help_field(313, "prototypes frozen for these iterations")
    local_crops: int = help_field(6, "96-px local crops besides the two global ones")


def build_method(cfg: SwAVR50, data: DataInfo):
    return SwAV(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                num_prototypes=cfg.num_prototypes, temperature=cfg.temperature,
                epsilon=cfg.epsilon, queue_size=cfg.queue_size,
                queue_start_steps=cfg.queue_start_steps,
                freeze_prototypes_steps=cfg.freeze_prototypes_steps,
                encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SwAVR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("multicrop", image_size=cfg.image_size, num_local=cfg.local_crops)


if __name__ == "__main__":
    run(SwAVR50, build_method, build_pipeline, name="swav_r50")
