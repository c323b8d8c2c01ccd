"""``contrastive-finetune``: fine-tune a pretrained image encoder with a classification head on
labelled images, on the training engine (resume, SIGTERM, ``accelerate launch``, trackers),
then score the test split once.

    # our run's encoder on CIFAR-10 (the JPEG folder), ResNet protocol, 10 % of the labels
    contrastive-finetune --init runs/moco_cifar --data /data/cifar10 --protocol sgd \\
        --label-fraction 0.1 --batch-size 256 --epochs 30 --output-dir runs/ft-moco-10pc
    # a timm ViT's published weights, MAE's protocol, 2 GPUs
    accelerate launch --multi_gpu --num_processes 2 -m contrastive.launch.finetune \\
        --init timm:vit_small_patch16_224.augreg_in21k --data /data/imagenet

The source is ``--init`` (:mod:`contrastive.eval.init`: a run folder, ``encoder.pt``, a
weights file, ``timm:NAME`` / ``torchvision:NAME``); its recorded architecture, crop size and
normalisation are used unless ``--encoder`` / ``--image-size`` / ``--init-mean`` say otherwise.
Without ``--init`` the encoder starts from random weights (the baseline).

Protocols (``--protocol``; each sets the defaults of the flags below it, every one a flag):

- ``vit``: MAE's fine-tuning (He et al. 2022, facebookresearch/mae ``main_finetune.py`` and
  ``FINETUNE.md``, after BEiT, Bao et al. 2022): AdamW (betas 0.9 / 0.999), base lr 5e-4 x
  batch / 256, batch 1024, 100 epochs, 5 warm-up epochs then cosine, weight decay 0.05,
  layer-wise lr decay 0.65 (ViT-B's; MAE's layer ids, ``util/lr_decay.py``), drop path 0.1,
  RandAugment ``rand-m9-mstd0.5-inc1``, random erasing 0.25, mixup 0.8, cutmix 1.0, label
  smoothing 0.1 (timm's ``create_transform``, ``Mixup``, ``SoftTargetCrossEntropy``). Layer
  decay applies to timm ViTs by default (block i is layer i + 1, the final norm and the head
  the top at the run's lr, so the last block trains at ``decay`` x it, as in MAE), drop path to
  timm encoders (ours have neither: 1 and 0).
- ``sgd``: SimCLR's fine-tuning (Chen et al. 2020, appendix B.5): SGD with Nesterov momentum
  0.9, lr 0.05 x batch / 256, batch 4096, no warm-up, cosine decay (the schedule of the
  authors' google-research/simclr code), no weight decay, random
  crop and flip only; 30 epochs (SimCLR: 30 for 10 % of ImageNet's labels, 60 for 1 %).

Those are the papers' ImageNet values. At CPU scale (CIFAR-10, a ResNet-18) pass a batch that
fits (``--batch-size 256``) and a budget in ``--epochs`` or ``--steps``; the lr scales with the
batch by itself.

Hyper-parameters are chosen on ``--val-fraction`` of the training split held out
(class-balanced, ``--data-seed``; ``val_top1`` / ``val_top5`` in metrics.jsonl every
``--eval-every`` steps and at the end); the test split is scored once, at the end
(``test_top1`` / ``test_top5`` in results.json). Low-label: ``--label-fraction 0.01`` or
``0.1`` (the class-balanced subsets of ``contrastive-linear-eval``) or ``--subset-file``.

Run folder: the engine's (config.json, metrics.jsonl, checkpoints/, run_state.json) plus
``results.json`` and ``classifier/``: for a timm encoder a timm model folder
(``timm.create_model("local-dir:RUN/classifier", pretrained=True)``), for ours
``model.safetensors`` + ``classifier.json``; :func:`load_finetuned` loads either in one line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from contrastive.engine import bad_input, cli, override, parse_config, run
from contrastive.engine.handoff import DataInfo
from contrastive.engine.kits.labelled_image import (
    LabelledImageAdapter,
    LabelledImageConfig,
    load_finetuned,
    save_classifier,
)

__all__ = ["VitFinetuneConfig", "SgdFinetuneConfig", "PROTOCOLS", "build_method",
           "save_classifier", "load_finetuned", "main"]

PROG = "contrastive-finetune"


@dataclass
class VitFinetuneConfig(LabelledImageConfig):
    """Fine-tune an image encoder with a classification head on labelled images (module
    docstring of contrastive.launch.finetune, or docs/tutorials/after-pretraining.md). --protocol vit: MAE / BEiT's
    fine-tuning (AdamW, layer-wise lr decay, drop path, RandAugment, mixup / cutmix, label
    smoothing). Example: contrastive-finetune --init runs/mae_cifar --data cifar10 --batch-size
    256 --epochs 50 --output-dir runs/ft. --protocol sgd --help shows the ResNet protocol's
    defaults."""

    protocol: str = override("vit", "MAE / BEiT's")
    optimizer: str = override("adamw", "MAE's")
    lr: float = override(5e-4, "MAE's base lr (blr), per 256 images")
    batch_size: int = override(1024, "MAE's (ImageNet; at CPU scale pass what fits, e.g. 256)")
    epochs: int = override(100, "MAE's ViT-B")
    warmup_epochs: float = override(5, "MAE's")
    weight_decay: float = override(0.05, "MAE's")
    auto_augment: str = override("rand-m9-mstd0.5-inc1", "MAE's RandAugment")
    reprob: float = override(0.25, "MAE's")
    mixup: float = override(0.8, "MAE's")
    cutmix: float = override(1.0, "MAE's")
    smoothing: float = override(0.1, "MAE's")
    log_every: int = 50


@dataclass
class SgdFinetuneConfig(LabelledImageConfig):
    """Fine-tune an image encoder with a classification head on labelled images (module
    docstring of contrastive.launch.finetune, or docs/tutorials/after-pretraining.md). --protocol sgd: SimCLR's
    fine-tuning of ResNets (Nesterov SGD, cosine, crop and flip only). Example:
    contrastive-finetune --protocol sgd --init runs/moco_cifar --data cifar10 --batch-size 256
    --label-fraction 0.1 --output-dir runs/ft-10pc."""

    protocol: str = override("sgd", "SimCLR's (ResNets)")
    optimizer: str = override("sgd", "SimCLR's: Nesterov momentum")
    nesterov: bool = override(True, "SimCLR's")
    lr: float = override(0.05, "SimCLR's: 0.05 x batch / 256")
    batch_size: int = override(4096, "SimCLR's (ImageNet; at CPU scale pass what fits, e.g. 256)")
    epochs: int = override(30, "SimCLR's for 10 %% of the labels (60 for 1 %%)")
    weight_decay: float = override(0.0, "SimCLR's: none")
    log_every: int = 50


#: --protocol -> its configuration class
PROTOCOLS: dict[str, type[LabelledImageConfig]] = {"vit": VitFinetuneConfig,
                                                    "sgd": SgdFinetuneConfig}


def build_method(cfg: LabelledImageConfig, data: DataInfo) -> nn.Module:
    """The encoder (``--encoder`` with its kwargs and timm's drop path) and a linear head over
    the data's classes."""
    from contrastive.methods.image_classifier import ImageClassifier
    from contrastive.nn import create_encoder

    kwargs = cfg.encoder_options()
    if cfg.drop_path:
        kwargs["drop_path_rate"] = cfg.drop_path
    assert data.num_classes is not None
    return ImageClassifier(create_encoder(cfg.encoder, **kwargs), data.num_classes,
                           smoothing=cfg.smoothing)


def _protocol(argv: Sequence[str]) -> str:
    """``--protocol``'s value in ``argv`` (``vit`` when absent; a bad one is the parser's)."""
    for i, arg in enumerate(argv):
        if arg == "--protocol" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--protocol="):
            return arg.split("=", 1)[1]
    return "vit"


def _main(argv: list[str] | None) -> Any:
    args = list(sys.argv[1:] if argv is None else argv)
    cls = PROTOCOLS.get(_protocol(args), VitFinetuneConfig)
    adapter = LabelledImageAdapter()
    cfg = parse_config(cls, args, prog=PROG)  # --help, a bad flag or value: exits here
    with bad_input():
        adapter.prepare(cfg)
    return run(cls, build_method, adapter=adapter, argv=args, name="finetune")


def main(argv: list[str] | None = None) -> int:
    """The console script: 0 when the run ends, 2 with one line for bad input, 75 when stopped
    (resume with ``--resume auto``)."""
    return cli(_main, PROG, argv)


if __name__ == "__main__":
    sys.exit(main())
