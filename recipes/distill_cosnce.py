#!/usr/bin/env python
"""COS-NCE contrastive distillation (LRC-BERT, Fu et al. AAAI 2021, arXiv 2012.07335) of a frozen
teacher encoder into a smaller student, on images.

Per step: COS-NCE between each student stage (pooled, projected by a learned W) and its teacher
stage (uniform mapping), negatives = the other images of the batch (or ``--queue-size`` K past
teacher features); KD soft loss at t = 1.1 when the teacher has a classifier; CE hard loss on the
data's class labels; weights alpha:beta:gamma = 1:0:0 for the first 80 % of the steps, then
1:1:3; gradient perturbation of the student's stem output (TWO student forward passes per step,
the teacher runs once). Without a teacher classifier and with ``--no-use-labels`` (or unlabelled
data) it is representation-only distillation.

    # a teacher of ours (encoder.pt or a run folder), the student trained from scratch
    python recipes/distill_cosnce.py --data shapes --teacher small_cnn \\
        --teacher-checkpoint runs/teacher/encoder.pt --student small_cnn --epochs 10
    # a timm / torchvision teacher with its ImageNet classifier (downloads the weights)
    accelerate launch recipes/distill_cosnce.py --data /path/to/imagenet --image-size 224 \\
        --teacher timm:resnet50 --teacher-pretrained --student timm:resnet18

    # the pretrained EfficientNet-Lite0 file (trained on inputs at mean = std = 0.5) into a small
    # student, itself started from --init weights (or left out: random)
    python recipes/distill_cosnce.py --data /path/to/images --image-size 128 \\
        --teacher timm:efficientnet_lite0 --teacher-checkpoint efficientnet_lite0/model.safetensors \\
        --teacher-mean 0.5 0.5 0.5 --teacher-std 0.5 0.5 0.5 --student timm:resnet18 --init FILE

Normalisation: teacher and student see the same crop of each image from ONE pipeline, normalised
with the recipe's ``--mean`` / ``--std`` (the student's); the method re-normalises the teacher's
copy on the device to the statistics its weights were trained with, (x * std + mean - mean_t) /
std_t: ``--teacher-mean`` / ``--teacher-std``, else what the teacher's source records (encoder.pt,
a run folder, timm's ``pretrained_cfg``), else the student's (logged). ``--init`` starts the
student (the exported backbone), never the teacher, which is built from its own name and file.

Defaults build offline (``--data shapes``, a random ``small_cnn`` teacher: a smoke run only;
pass ``--teacher-checkpoint``). The run's ``encoder.pt`` holds the student backbone. Every field
below is a flag: ``python recipes/distill_cosnce.py --help``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from contrastive.engine import DataInfo, ImageConfig, help_field, override, run
from contrastive.engine.config import parse_json_object
from contrastive.eval.teacher import Teacher, load_teacher

log = logging.getLogger("distill_cosnce")


@dataclass
class DistillCosNCE(ImageConfig):
    """COS-NCE distillation (LRC-BERT) of --teacher into --student; see the module docstring."""

    data: str = "shapes"
    image_size: int = 32
    epochs: int = 20
    batch_size: int = 128
    optimizer: str = override("adamw", "sgd | adamw | lars (LRC-BERT trains with Adam)")
    lr: float = override(2e-3, "peak learning rate (absolute: --lr-scaling none)")
    lr_scaling: str = override("none", "linear | sqrt | none")
    weight_decay: float = 1e-4
    warmup_epochs: float = 0.0
    save_every_steps: int = 0
    ddp_find_unused_parameters: bool = override(
        True, "DDP find_unused_parameters: stage 1 leaves the student classifier unused")
    encoder: str = override("", "ignored: the student is --student (kept equal to it, it names "
                            "the backbone in encoder.pt)")

    # teacher and student
    teacher: str = help_field("", "teacher encoder name (timm:<m>, torchvision:<m>, "
                              "cifar_resnet18, small_cnn...); empty = the name recorded in "
                              "--teacher-checkpoint, or a random small_cnn without one")
    teacher_checkpoint: str = help_field(
        "", "teacher weights: our encoder.pt, a run folder, an accelerate checkpoint, a MoCo "
        "checkpoint or a timm/torchvision weight file; empty = random init (smoke runs only)")
    teacher_pretrained: bool = help_field(
        False, "take --teacher's own pretrained weights with its classifier (downloads)")
    teacher_head: str = help_field(
        "auto", "the teacher classifier for the KD soft loss: auto = the checkpoint's single "
        "Linear head when its classes match the data's; use = whenever there is one; none",
        choices=("auto", "use", "none"))
    student: str = help_field("small_cnn", "student encoder name (the exported backbone)")
    student_kwargs: str = help_field(
        "", 'create_encoder keyword arguments of the student as JSON, e.g. \'{"widths": [16, 32, '
        '64, 128]}\' (recorded in encoder.pt)')
    teacher_kwargs: str = help_field(
        "", "the same for the teacher built from --teacher (e.g. '{\"img_size\": 32}' for a ViT)")
    use_labels: bool = help_field(True, "CE hard loss on the data's class labels (stage 2), when "
                                  "the data has labels")

    # LRC-BERT
    student_layers: tuple[str, ...] = help_field((), "student stage modules (default: all stages)")
    teacher_layers: tuple[str, ...] = help_field((), "teacher stage modules (default: all stages)")
    layer_map: tuple[int, ...] = help_field((), "teacher-layer index for each student layer "
                                            "(default: uniform, ceil((i+1) N / M) - 1)")
    token_pool: str = help_field("auto", "ViT blocks: cls token or mean token",
                                 choices=("auto", "cls", "mean"))
    queue_size: int = help_field(0, "0 = in-batch negatives (K = batch - 1); K > 0 = a queue of "
                                 "K teacher features per teacher stage")
    stage1_fraction: float = help_field(0.8, "share of the steps trained with --stage1-weights")
    stage1_weights: tuple[float, float, float] = help_field((1.0, 0.0, 0.0),
                                                            "alpha beta gamma of stage 1")
    stage2_weights: tuple[float, float, float] = help_field((1.0, 1.0, 3.0),
                                                            "alpha beta gamma of stage 2")
    temperature: float = help_field(1.1, "KD soft-loss temperature t (paper 1.1)")
    perturb: bool = help_field(True, "gradient perturbation of the student's stem output: TWO "
                               "student forward passes per step (about 2x the student's cost)")
    perturb_scale: float = help_field(1.0, "norm of the per-sample perturbation g / ||g||")
    stem: str = help_field("", "student module whose output is perturbed (default: patch_embed, "
                           "the ResNet stem, or the first stage)")

    # augmentation (one view: teacher and student see the same image)
    crop_scale: tuple[float, float] = help_field((0.35, 1.0), "RandomResizedCrop area range")
    flip_p: float = help_field(0.5, "horizontal flip probability")
    mean: tuple[float, float, float] = help_field((0.485, 0.456, 0.406), "normalisation mean "
                                                  "of the pipeline (the student's)")
    std: tuple[float, float, float] = help_field((0.229, 0.224, 0.225), "normalisation std")
    teacher_mean: tuple[float, ...] = help_field(
        (), "the per-channel mean the teacher's weights were trained with (e.g. 0.5 0.5 0.5); "
        "its input is re-normalised to it on the device; empty = the teacher source's record, "
        "else --mean")
    teacher_std: tuple[float, ...] = help_field((), "the same for the std (see --teacher-mean)")

    def __post_init__(self) -> None:
        self.encoder = self.student  # save_encoder names encoder.pt's backbone from it

    def encoder_options(self) -> dict[str, Any]:
        """--encoder-kwargs and --student-kwargs (the student is the exported encoder)."""
        return {**super().encoder_options(), **parse_json_object("student_kwargs", self.student_kwargs)}

    def validate(self) -> None:
        super().validate()
        if not self.student:
            raise ValueError("--student is required (e.g. small_cnn, timm:resnet18)")
        if self.teacher_pretrained and not self.teacher.startswith(("timm:", "torchvision:")):
            raise ValueError(f"--teacher-pretrained needs a timm:<m> or torchvision:<m> teacher, "
                             f"got {self.teacher!r}")
        for name in ("student_kwargs", "teacher_kwargs"):
            parse_json_object(name, getattr(self, name))
        if bool(self.teacher_mean) != bool(self.teacher_std):
            raise ValueError("give both --teacher-mean and --teacher-std (or neither)")
        for name in ("teacher_mean", "teacher_std"):
            values = getattr(self, name)
            if values and (len(values) not in (1, 3) or (name == "teacher_std" and min(values) <= 0)):
                raise ValueError(f"--{name.replace('_', '-')} takes 1 or 3 numbers (std above 0), "
                                 f"got {list(values)}")
        if not 0 <= self.stage1_fraction <= 1:
            raise ValueError(f"--stage1-fraction must be in [0, 1], got {self.stage1_fraction}")


Norm = tuple[tuple[float, ...], tuple[float, ...]]


def input_norm(cfg: DistillCosNCE) -> Norm:
    """(mean, std) of the pipeline's images: the student's normalisation."""
    return tuple(cfg.mean), tuple(cfg.std)


def build_teacher(cfg: DistillCosNCE, num_classes: int | None) -> Teacher:
    """The teacher (backbone, classifier or None, normalisation) from --teacher /
    --teacher-checkpoint, its normalisation overridden by --teacher-mean / --teacher-std."""
    teacher = load_teacher(cfg.teacher, cfg.teacher_checkpoint, pretrained=cfg.teacher_pretrained,
                           encoder_kwargs=parse_json_object("teacher_kwargs", cfg.teacher_kwargs),
                           head=cfg.teacher_head, num_classes=num_classes)
    if cfg.teacher_mean:
        teacher.mean, teacher.std = tuple(cfg.teacher_mean), tuple(cfg.teacher_std)
    elif teacher.mean is None or teacher.std is None:
        teacher.mean = teacher.std = None
        log.info("the teacher's source records no normalisation: it sees the student's (--mean "
                 "%s --std %s); --teacher-mean/--teacher-std give its own", cfg.mean, cfg.std)
    return teacher


def build_method(cfg: DistillCosNCE, data: DataInfo) -> nn.Module:
    from contrastive.methods.distill import Distiller

    n_cls = data.num_classes
    loaded = build_teacher(cfg, n_cls)
    teacher, teacher_head = loaded.encoder, loaded.head
    use_labels = cfg.use_labels and n_cls is not None  # the loader's batch["labels"], -1 unknown
    method = Distiller(
        teacher, cfg.student, teacher_head=teacher_head,
        num_classes=n_cls if use_labels and teacher_head is None else None,
        student_layers=cfg.student_layers or None, teacher_layers=cfg.teacher_layers or None,
        layer_map=cfg.layer_map or None, token_pool=cfg.token_pool, queue_size=cfg.queue_size,
        stage_weights=(cfg.stage1_weights, cfg.stage2_weights),
        stage1_fraction=cfg.stage1_fraction, use_labels=use_labels,
        temperature=cfg.temperature,
        perturb=cfg.perturb, perturb_scale=cfg.perturb_scale, stem=cfg.stem or None,
        image_size=cfg.image_size,
        student_kwargs=cfg.encoder_options(),
        input_norm=(data.pipeline.mean, data.pipeline.std) if data.pipeline is not None
        else input_norm(cfg),  # the views' normalisation: --init's when it records one
        teacher_norm=(loaded.mean, loaded.std) if loaded.mean is not None and loaded.std is not None
        else None,
    )
    if method.teacher_input is not None:
        log.info("the teacher's input is re-normalised: %s", method.teacher_input.extra_repr())
    log.info("distilling %s -> %s: student layers %s -> teacher layers %s; stage 2 after %.0f %% "
             "of the steps", type(method.teacher).__name__, cfg.student, method.student_layers,
             [method.teacher_layers[j] for j in method.layer_map], 100 * cfg.stage1_fraction)
    return method


def build_pipeline(cfg: DistillCosNCE):
    from contrastive.augment import Pipeline, ViewConfig

    view = ViewConfig(size=cfg.image_size, scale=tuple(cfg.crop_scale), flip_p=cfg.flip_p)
    mean, std = input_norm(cfg)
    return Pipeline([view], mean=mean, std=std, name="distill")


def main(argv: list[str] | None = None):
    return run(DistillCosNCE, build_method, build_pipeline, argv=argv, name="distill_cosnce")


if __name__ == "__main__":
    main()
