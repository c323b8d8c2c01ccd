#!/usr/bin/env python
"""iBOT, ViT-S/16, ImageNet: Zhou et al., "iBOT: Image BERT Pre-Training with Online
Tokenizer", ICLR 2022 (arXiv 2111.07832), with the authors' settings (bytedance/ibot README's
ViT-S/16 command and ``main_ibot.py``'s defaults, checked for these values).

Hyper-parameters: 800 epochs, batch 1024 (16 x 64), AdamW lr 5e-4 x batch / 256 after 10 linear
warm-up epochs, cosine to 1e-6, weight decay cosine 0.04 -> 0.4 (none on biases and norms), gradient
clipping 3.0 of each parameter apart (``utils.clip_gradients`` in ``train_one_epoch``; ``--clip-mode
parameter``, ``--clip-mode all`` clips all together), last layer frozen during the first epoch, drop
path 0.1; one iBOT head (``--shared_head true``) of 8192 prototypes, 2048 hidden, 256 bottleneck,
weight norm trainable (``--norm_last_layer false``); teacher momentum 0.996 -> 1 (cosine); teacher
temperatures 0.04 -> 0.07 over 30 epochs for the class and the patch terms, student 0.1, centre
momenta 0.9, lambda1 = lambda2 = 1; block masks (aspect 0.3 - 1/0.3) on half of the global crops at
0.3 +- 0.2 of the patches (``--pred_ratio 0 0.3 --pred_ratio_var 0 0.2``); multi-crop: 2 global
crops of 224 px (scale 0.25-1), 10 local crops of 96 px (0.05-0.25). Reported (README): 75.2 % k-NN,
77.9 % linear after 800 epochs. DINOv2's objective and optimiser (its default config, with
layer-wise lr decay and the patch-embedding lr factor) are ``recipes/dinov2_in1k.py``.

    accelerate launch recipes/ibot_in1k.py --data /path/to/imagenet
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.methods import IBOT
from contrastive.methods.base import CLIP_MODES

#: the method's keyword arguments in the paper's setting: the one home of these values
#: (IBOT.from_preset("vit_small") builds the same); the fields below default to them
PRESET = IBOT.presets["vit_small"]


@dataclass
class IBOTImageNet(ImageConfig):
    """iBOT, ViT-S/16, ImageNet-1k (ICLR 2022; bytedance/ibot)."""

    encoder: str = PRESET["encoder"]
    encoder_kwargs: str = override(json.dumps(PRESET["encoder_kwargs"]),
                                   "create_encoder keyword arguments (JSON)")
    image_size: int = 224
    epochs: int = 800
    batch_size: int = override(1024, "effective batch (16 GPUs x 64)")
    optimizer: str = override("adamw", "official: AdamW")
    lr: float = override(5e-4, "per 256 images (linear rule)")
    min_lr: float = override(5e-4, "cosine floor as a fraction: the code's 1e-6 at batch 1024")
    weight_decay: float = override(0.04, "start of the cosine weight-decay schedule")
    weight_decay_end: float = help_field(0.4, "end of the cosine weight-decay schedule")
    exclude_from_wd: bool = override(True, "official: no decay on biases and norms")
    warmup_epochs: float = 10
    schedule_per: str = override("step", "per iteration")
    clip_grad_norm: float = override(3.0, "official --clip_grad 3.0")
    clip_mode: str = help_field(PRESET["clip_mode"], "what --clip-grad-norm clips apart: "
                                "each parameter (the code's utils.clip_gradients), each part "
                                "(DINOv2) or all parameters together (before this was "
                                "reproduced)", choices=CLIP_MODES)

    out_dim: int = help_field(PRESET["out_dim"], "prototypes (one head for class and patches)")
    momentum: float = help_field(PRESET["momentum"], "teacher EMA momentum at the start (-> 1)")
    teacher_temperature: float = help_field(PRESET["teacher_temperature"],
                                            "class-token teacher temperature after warm-up")
    teacher_patch_temperature: float = help_field(PRESET["teacher_patch_temperature"],
                                                  "patch teacher temperature after warm-up")
    warmup_teacher_epochs: int = help_field(30, "teacher-temperature warm-up from 0.04")
    freeze_last_layer_epochs: int = help_field(1, "last layer frozen for these epochs")
    local_crops: int = help_field(10, "96-px local crops (README: 10)")


def build_method(cfg: IBOTImageNet, data: DataInfo):
    spe = data.steps_per_epoch
    kw = {k: v for k, v in PRESET.items() if k not in ("encoder", "encoder_kwargs")}
    kw.update(out_dim=cfg.out_dim, momentum=cfg.momentum,
              teacher_temperature=cfg.teacher_temperature,
              teacher_patch_temperature=cfg.teacher_patch_temperature,
              warmup_teacher_steps=cfg.warmup_teacher_epochs * spe,
              weight_decay=cfg.weight_decay, weight_decay_end=cfg.weight_decay_end,
              freeze_last_layer_steps=cfg.freeze_last_layer_epochs * spe,
              clip_mode=cfg.clip_mode)
    return IBOT(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), **kw)


def build_pipeline(cfg: IBOTImageNet):
    from contrastive.augment import get_pipeline

    return get_pipeline("dino", image_size=cfg.image_size, num_local=cfg.local_crops,
                        global_scale=(0.25, 1.0), local_scale=(0.05, 0.25))


if __name__ == "__main__":
    run(IBOTImageNet, build_method, build_pipeline, name="ibot_in1k")
