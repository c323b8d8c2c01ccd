#!/usr/bin/env python
"""SupCon, ResNet-50, ImageNet: Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020
(arXiv 2004.11362), Sec. 4, and the authors' TensorFlow code (google-research/google-research
``supcon/``, linked from the paper as https://t.ly/supcon): ``scripts/supcon_imagenet_resnet50.sh``
with ``scripts/configs.sh`` (``SUPCON_FLAGS``) and ``hparams_flags.py``.

Hyper-parameters (the script, stage 1): batch 6144, LARS, base lr 0.4 per 256 images (the
code: "the true learning rate is multiplied by batch_size/256": 9.6 at 6144), 12 warm-up epochs
(the flag's default) then cosine, weight decay 1e-3 (inside LARS, as the code), 350 epochs,
temperature 0.1 (paper: "0.1 works best"), the loss multiplied by the temperature
(``scale_by_temperature=True``: ``--base-temperature 1``), global BN, 128-d normalised
embedding. Labels required (every image's class). Reported linear top-1 of the paper's
ResNet-50: 78.7 % (with AutoAugment).

Differences, by what the toolkit offers: the code's projection head is one Linear to 128 on the
L2-normalised encoder output (``projection_head_layers=128``, ``normalize_embedding=True``);
ours is the paper's (Sec. 3) MLP with one 2048 hidden layer to 128 on the raw features. The
code trains on AutoAugment (magnitude 1) with blur 0.5; our presets have no AutoAugment, so the
SimCLR augmentation (the paper's ablation alternative) is used. The code also decays biases
(``use_bias_weight_decay=True``); ``--exclude-from-wd false`` does the same here.
HobbitLong/SupContrast (the PyTorch code linked from the paper) gives CIFAR settings only
(README: batch 1024, lr 0.5, cosine); its author's ImageNet runs used a MoCo-style momentum
encoder with MoCo v2's settings (issue #120: queue 8192, temperature 0.07, batch 1024) and
point to the paper otherwise, so this recipe follows the paper's TF code above.

    accelerate launch recipes/supcon_r50.py --data /path/to/imagenet
"""

from __future__ import annotations

from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import SupCon

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (SupCon.from_preset("resnet50") builds the same); the fields below default to them
PRESET = SupCon.presets["resnet50"]


@dataclass
class SupConR50(ImageConfig):
    """SupCon, ResNet-50, ImageNet (NeurIPS 2020; official google-research supcon script)."""

    encoder: str = PRESET["encoder"]
    image_size: int = 224
    epochs: int = override(350, "the official ResNet-50 script's stage-1 epochs")
    batch_size: int = 6144
    optimizer: str = override("lars", "official: LARS")
    lr: float = override(0.4, "per 256 images (linear rule): 9.6 at batch 6144")
    weight_decay: float = 1e-3
    warmup_epochs: float = 12
    schedule_per: str = override("step", "per iteration")
    sync_bn: bool = override(True, "official: global BN across cores")

    dim: int = help_field(PRESET["dim"], "embedding dimension")
    mlp_hidden: int = help_field(2048, "head hidden width (paper Sec. 3)")
    temperature: float = help_field(PRESET["temperature"], "temperature tau")
    base_temperature: float = help_field(1.0, "loss x tau / base: 1 = the code's "
                                         "scale_by_temperature")


def build_method(cfg: SupConR50, data: DataInfo):
    return SupCon(encoder=cfg.encoder, dim=cfg.dim, mlp_hidden=cfg.mlp_hidden,
                  temperature=cfg.temperature, base_temperature=cfg.base_temperature,
                  encoder_kwargs=cfg.encoder_options())


def build_pipeline(cfg: SupConR50):
    from contrastive.augment import get_pipeline

    return get_pipeline("simclr", image_size=cfg.image_size)


if __name__ == "__main__":
    run(SupConR50, build_method, build_pipeline, name="supcon_r50")
