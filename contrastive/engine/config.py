"""Training configuration: one dataclass, every field a command-line flag.

A recipe subclasses :class:`RunConfig` (what every run has) or, on images, :class:`TrainConfig`
(plus the image fields), sets the paper's values as defaults (:func:`override`: a declared
field's choices and help are kept, so each choice list has one home) and adds the method's own
fields (:func:`help_field`); :func:`parse_config` turns the dataclass into an ``argparse``
parser where every field ``foo_bar`` is ``--foo-bar`` (``--foo_bar`` works too), ``--help``
lists each field with its default, and an unknown flag is an error that names the closest
field.

Field help comes from ``field(metadata={"help": ...})``; booleans take ``--flag`` /
``--no-flag`` or ``--flag true|false``; tuples take several values (``--lr-milestones 120 160``).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
import types
import typing
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from contrastive.engine.compat import RENAMED_FIELDS, renamed_to
from contrastive.hardware import PRECISIONS

__all__ = ["RunConfig", "TrainConfig", "ImageTextConfig", "TextRunConfig", "TextConfig",
           "BertSizes", "LabelledTextConfig", "CifarConfig", "SCHEDULES", "parse_config",
           "config_to_dict", "config_from_dict", "help_field", "override", "field_options",
           "parse_json_object"]

C = TypeVar("C", bound="RunConfig")

#: the learning-rate schedules (:func:`contrastive.engine.schedules.lr_at`)
SCHEDULES = ("cosine", "linear", "step", "constant")


def help_field(default: Any, help: str, **kwargs: Any) -> Any:
    """A new field: ``dataclasses.field`` with a help text (shown by ``--help``) and options
    such as ``choices``. A subclass changes a field its base declares with :func:`override`."""
    _check_default(default)
    return field(default=default, metadata={"help": help, **kwargs})


def override(default: Any, note: str = "", *, only: tuple[Any, ...] = (), why: str = "") -> Any:
    """A subclass's default for a field that a base configuration declares, keeping the base's
    choices and help (each choice list is written once, where the field is declared).

    ``note`` says what the new default is (``--help`` shows it before the base's help). ``only``
    narrows the choices to a subset, for a recipe that cannot run the others; ``why`` (required
    with ``only``) says why, in ``--help``. A bare new
    default (``batch_size: int = 128``) also keeps the base's choices and help.

        lr_schedule: str = override("linear", "BERT's: linear decay to 0 after the warm-up")
    """
    _check_default(default)
    if bool(only) != bool(why):
        raise TypeError("override: narrowing the choices (only=...) needs why=..., the reason")
    return field(default=default, metadata={"note": note, "only": tuple(only), "why": why})


def _check_default(default: Any) -> None:
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple for sequence defaults (dataclass fields must be immutable)")


def field_options(cls: type, name: str) -> dict[str, Any]:
    """The command-line options of field ``name`` of ``cls`` (``help``, ``choices``): those of
    the class that declares it first, with each subclass's :func:`override` applied (its note
    before the declared help, its narrowed choices and their reason). A subclass that declares
    the field again with :func:`help_field` is refused: it would drop or copy the choices."""
    options: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        f = vars(klass).get("__dataclass_fields__", {}).get(name)
        if f is None or name not in vars(klass).get("__annotations__", {}):
            continue  # klass inherits the field or does not have it
        meta = dict(f.metadata)
        if not options and "note" in meta:
            raise TypeError(f"{klass.__qualname__}.{name}: override() changes a field that a "
                            "base configuration declares, and none does: use help_field")
        if not options:
            options = meta or {"help": ""}
        elif "help" in meta:
            raise TypeError(f"{klass.__qualname__}.{name} declares a field that a base "
                            f"configuration declares: write `{name}: ... = override(default, "
                            "note)`, which keeps its choices and help")
        elif meta:
            declared = options.get("declared_help", options["help"])
            options["declared_help"] = declared
            note = meta["note"].rstrip(".")
            options["help"] = f"{note}. {declared}" if note else declared
            if meta["only"]:
                base = options.get("choices")
                if base is not None and not set(meta["only"]) <= set(base):
                    raise TypeError(f"{klass.__qualname__}.{name}: only={meta['only']} is not a "
                                    f"subset of the declared choices {tuple(base)}")
                options["choices"] = meta["only"]
                options["help"] += f" (here only {' | '.join(map(str, meta['only']))}: " \
                                   f"{meta['why']})"
    return options


@dataclass
class RunConfig:
    """Fields every run has, whatever it trains on (images, text, image-text pairs).

    Image recipes subclass :class:`TrainConfig` (these fields plus the image ones: encoder, crop
    size, augmentation path, kNN monitor, online probe); text and image-text recipes subclass
    this class with their own fields, so they carry no image fields.

    Budget: ``--epochs`` or ``--steps`` (optimiser steps; when set it is the budget and the
    schedules follow it, and ``--epochs`` is unused). ``--epochs`` given on the command line (or
    by a ``--config`` file) while ``--steps`` is positive, by the recipe's default or given too,
    is refused by :func:`parse_config` rather than ignored: pass ``--steps 0 --epochs N`` for an
    epoch budget, or ``--steps N`` alone. Batch size and learning rate: ``batch_size`` is GLOBAL (samples per
    optimiser step, summed over processes and gradient-accumulation micro-steps), as in the
    official MoCo code. ``lr_scaling``: ``linear`` uses ``lr * batch_size / 256`` (``lr`` per
    256 samples), ``sqrt`` uses ``lr * sqrt(batch_size)`` (SimCLR's rule: the batch size itself,
    not divided by 256), ``none`` uses ``lr``; sources in
    :func:`contrastive.engine.schedules.scaled_lr`.
    """

    #: fields that ``__post_init__`` fills in from others when they are left at their default
    #: (a warm-up from ``--warmup-fraction`` and the budget): a ``--config`` file's values of them
    #: that were so derived are derived again after the flags (a new ``--steps`` moves them)
    derived_fields: ClassVar[tuple[str, ...]] = ()

    #: optimiser steps in one of the recipe's own epochs where its default ``--steps`` budget
    #: counts in them (DINOv2's 1250 iterations): the refusal of an ``--epochs`` beside that
    #: budget then names the ``--steps`` those epochs make; 0 = none
    epoch_steps: ClassVar[int] = 0

    # --- data and run ---------------------------------------------------------------------
    data: str = help_field(
        "",
        "data spec: shapes | shapes:n=2000,size=32,seed=0 | synthetic | cifar10 | cifar10:/path "
        "| imagefolder:/path | /path (a folder; train/ and val/ or test/ inside are used when "
        "present)",
    )
    output_dir: str = help_field(
        "", "run folder (config.json, metrics.jsonl, checkpoints/, encoder.pt); "
        "default runs/<recipe>"
    )
    resume: str = help_field(
        "", "'auto' (newest complete checkpoint in --output-dir, or start fresh and say so) "
        "or a checkpoint PATH; empty = new run (the output folder must then be empty)"
    )
    epochs: int = help_field(
        100, "training epochs; the lr / momentum schedules follow them. Used only with --steps "
        "0: given while --steps is positive (the recipe's default or given too) it is refused")
    steps: int = help_field(
        0, "the budget in optimiser steps instead of --epochs (0 = --epochs decide): the "
        "schedules follow it and the last epoch may be partial; a recipe whose default is "
        "positive needs --steps 0 with --epochs")
    max_steps: int = help_field(
        0, "stop after this many optimiser steps (0 = no limit) WITHOUT changing the schedules "
        "(smoke runs, resume tests); the run checkpoints when it stops"
    )
    batch_size: int = help_field(
        256, "GLOBAL batch: images per optimiser step over all processes and accumulation "
        "micro-steps (split across processes, as in the official MoCo code)"
    )
    num_workers: int = help_field(
        min(8, os.cpu_count() or 1), "data loader worker processes per training process"
    )
    seed: int = help_field(0, "seed for model init, data order and augmentation")
    strict_data: bool = help_field(False, "unreadable images are errors instead of skipped")

    # --- precision, device, speed ---------------------------------------------------------
    mixed_precision: str = help_field(
        "auto", "auto | no | bf16 | fp16. auto: accelerate's configuration if it sets one, else "
        "the precision of the run being resumed, else bf16 on CUDA devices and CPUs with native "
        "bf16 and fp32 elsewhere (bf16 is emulated and several times slower on other CPUs); "
        "resolved once and recorded in config.json. fp16 on the CPU is refused (accelerate "
        "would silently run fp32)",
        choices=PRECISIONS,
    )
    cpu: bool = help_field(False, "train on the CPU even when a GPU is visible")
    float64: bool = help_field(
        False, "train in float64 (model, inputs, optimiser state): several times slower; for "
        "numerical checks such as 2 processes against 1, where float32 rounding of sums taken "
        "in another order would otherwise hide or fake a difference")
    compile: bool = help_field(False, "torch.compile the backbone (nn.Module.compile, in place)")
    sync_bn: bool = help_field(False, "convert every BatchNorm of the method to SyncBatchNorm "
                               "when several GPU processes train (global BN: MoCo v3, SimCLR, "
                               "BYOL...); the one switch, methods have none of their own")
    ddp_find_unused_parameters: bool = help_field(
        False, "DDP find_unused_parameters (needed when some trainable parameters get no grad)")

    # --- optimiser and schedules ----------------------------------------------------------
    optimizer: str = help_field("sgd", "sgd | adamw | lars (LARS as the official MoCo v3 code)",
                                choices=("sgd", "adamw", "lars"))
    fused_optimizer: bool | None = help_field(
        None, "torch's fused kernel for the SGD / AdamW step: one kernel over all parameters, "
        "4-7x faster than the default per-parameter loop on the CPU (measured), faster on GPUs "
        "too; the same update up to float rounding. Unset: fused for SGD and AdamW on the CPU "
        "and CUDA; false: torch's default implementation (runs before 2026-11-28). A resume "
        "uses this run's setting; config.json records the kernel used")
    lr: float = help_field(0.03, "learning rate; absolute or per 256 images: see --lr-scaling")
    lr_scaling: str = help_field(
        "linear", "linear: used lr = lr * batch_size / 256 (lr is per 256 images); sqrt: lr * "
        "sqrt(batch_size), the batch itself, not / 256 (SimCLR appendix B.1: 0.075 x "
        "sqrt(batch)); none: lr is absolute", choices=("linear", "sqrt", "none"),
    )
    weight_decay: float = help_field(1e-4, "weight decay")
    exclude_from_wd: bool = help_field(
        True, "no weight decay on biases and norm parameters (SimCLR, MoCo v3 LARS); the "
        "official MoCo v1/v2 SGD and MoCo v3 ViT AdamW decay every parameter")
    sgd_momentum: float = help_field(0.9, "SGD / LARS momentum")
    nesterov: bool = help_field(False, "Nesterov momentum for SGD")
    betas: tuple[float, float] = help_field((0.9, 0.999), "AdamW betas")
    lars_trust_coeff: float = help_field(0.001, "LARS trust coefficient (eta)")
    lr_schedule: str = help_field(
        "cosine", "cosine (half-cycle, after linear warmup) | linear (decay to the floor after "
        "linear warmup, BERT's) | step (x lr_gamma at each milestone epoch) | constant",
        choices=SCHEDULES,
    )
    warmup_epochs: float = help_field(0.0, "linear warmup from 0, in epochs (fractions allowed)")
    warmup_steps: int = help_field(0, "linear warmup from 0, in optimiser steps (added to "
                                   "--warmup-epochs)")
    min_lr: float = help_field(0.0, "cosine / linear floor, as a fraction of the peak lr")
    lr_milestones: tuple[int, ...] = help_field((120, 160), "epochs where the step schedule "
                                                "multiplies the lr by --lr-gamma")
    lr_gamma: float = help_field(0.1, "step schedule factor")
    schedule_per: str = help_field(
        "step", "'step': schedules change every optimiser step (fractional epoch, MoCo v3); "
        "'epoch': once per epoch (official MoCo v1/v2 code)", choices=("step", "epoch"),
    )
    grad_accum_steps: int = help_field(
        1, "gradient accumulation micro-steps per optimiser step: the loader serves the batch "
        "in that many parts, trained as one step through the gradient cache (the EMA, queue and "
        "centre updates and the heads see the whole batch: equal to the whole batch). Refused "
        "where the loss couples the samples of a batch (SimCLR, SupCon, NNCLR, Barlow Twins, "
        "VICReg, CLIP, SimCSE...): use --grad-cache-chunk there"
    )
    grad_cache_chunk: int = help_field(
        0, "gradient caching (Gao et al. 2021): the whole batch's exact gradient in bounded "
        "memory. The backbone runs N samples per process at a time, without then with gradient "
        "(one extra forward pass); heads, loss and EMA/queue updates run once on the whole "
        "batch. Exact except with batch norm in the backbone (per-chunk statistics). 0 = off; "
        "see contrastive.engine.grad_cache")
    clip_grad_norm: float = help_field(
        0.0, "clip the gradient norm to this (0 = off); that of each part apart where the "
        "method declares parts (Method.clip_parts: DINOv2's backbone and heads; DINO's and iBOT's "
        "each parameter)")
    on_nonfinite: str = help_field(
        "stop", "non-finite loss: 'stop' with an error naming the step (the last checkpoint "
        "stays good) or 'skip' the optimiser step", choices=("stop", "skip"),
    )

    # --- checkpoints and logs -------------------------------------------------------------
    save_every_steps: int = help_field(1000, "checkpoint every N optimiser steps (0 = off)")
    save_every_epochs: int = help_field(1, "checkpoint every N epochs (0 = only at the end)")
    keep_last: int = help_field(2, "complete checkpoints to keep")
    log_every: int = help_field(10, "write a metrics.jsonl line every N optimiser steps")
    progress: bool = help_field(True, "tqdm progress bar on the main process")
    report_to: str = help_field(
        "none", "experiment trackers (accelerate's), comma-separated: tensorboard, wandb, mlflow "
        "(tested; extras [tensorboard], [wandb], [mlflow], [trackers]), comet_ml, aim, clearml, "
        "dvclive, swanlab, trackio; all = every one installed; none. A resume continues the same "
        "tracker runs (ids in trackers.json)")
    allow_config_change: bool = help_field(
        False, "resume even when run-defining fields (lr, batch size, data...) differ from the "
        "checkpoint's config (the model must still match)"
    )
    stop_if_orphaned: str = help_field(
        "auto", "save a checkpoint and stop (exit 75) when the process that started this one "
        "(the launcher) exits, instead of training on as an orphan: on | off | auto = on under "
        "accelerate launch and torchrun (a plain 'python recipe.py' started from a shell may "
        "outlive that shell, e.g. with nohup)", choices=("auto", "on", "off"),
    )
    keep_best: str = help_field(
        "", "an evaluator's metric (e.g. knn_top1, zeroshot_top1): keep the run's artefacts at "
        "its best value in best/ (the best value is checkpointed, so a resume keeps it); "
        "empty = off")

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field for values that can never work."""
        for name in ("epochs", "batch_size", "grad_accum_steps", "log_every", "keep_last"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        for name in ("steps", "max_steps", "num_workers", "save_every_steps",
                     "save_every_epochs", "warmup_epochs", "warmup_steps", "grad_cache_chunk"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.lr < 0 or self.weight_decay < 0:
            raise ValueError(f"--lr and --weight-decay must be >= 0, got {self.lr}, "
                             f"{self.weight_decay}")
        if not self.steps and self.warmup_epochs > self.epochs:
            raise ValueError(f"--warmup-epochs {self.warmup_epochs} exceeds --epochs "
                             f"{self.epochs}")
        if self.steps and self.warmup_steps > self.steps:
            raise ValueError(f"--warmup-steps {self.warmup_steps} exceeds --steps {self.steps}")
        if self.resume not in ("", "auto") and not os.path.exists(self.resume):
            raise ValueError(f"--resume {self.resume!r}: no such checkpoint folder; use "
                             "--resume auto to continue from the newest checkpoint in "
                             "--output-dir")
        from contrastive.engine.trackers import parse_report_to

        parse_report_to(self.report_to)  # an unknown or missing tracker: one line, now
        if self.float64 and self.mixed_precision in ("bf16", "fp16"):
            raise ValueError(f"--float64 with --mixed-precision {self.mixed_precision}: pick one "
                             "(--float64 is for numerical checks, mixed precision for speed)")
        if not self.data:
            raise ValueError("--data is required (e.g. --data shapes, --data cifar10, "
                             "--data /path/to/imagenet)")


@dataclass
class TrainConfig(RunConfig):
    """A run on images: the fields every run has (:class:`RunConfig`) and the image ones.
    Image recipes subclass it and change defaults / add fields."""

    encoder: str = help_field("cifar_resnet18", "backbone name for create_encoder (timm:<m>, "
                              "torchvision:<m>, cifar_resnet18, cifar_resnet50, small_cnn)")
    encoder_kwargs: str = help_field(
        "", "create_encoder keyword arguments as a JSON object, e.g. a ViT at 32 px: "
        "'{\"img_size\": 32, \"patch_size\": 8}' (recorded in encoder.pt for evaluation)")
    image_size: int = help_field(224, "training crop size in pixels")
    batched_augment: str = help_field(
        "auto", "where the colour/blur/flip/normalise part of the augmentation runs: 'on' = "
        "batched on the training device (workers only decode + crop to uint8), 'off' = per "
        "image in the loader workers, 'auto' = on (faster on the CPU and the GPU alike)",
        choices=("auto", "on", "off"),
    )
    channels_last: bool | None = help_field(
        None, "channels_last memory format for convnets (faster on GPUs, and on AVX-512 CPUs with "
        "torch 2.14: +10 %% measured; not with split BN, which works in NCHW). Unset: on for "
        "CUDA devices unless the recipe uses split BN, off on the CPU; config.json records the "
        "resolved value")
    pass_indices: bool = help_field(
        False, "MoCo recipes: store each queued key's data-set index beside it (queue_labels; "
        "the method then needs batch['indices']): diagnostics, tests")
    decode: str = help_field(
        "worker", "where JPEGs are decoded: 'worker' = in the loader workers (libjpeg-turbo), "
        "'device' = on the training device in one batched call per step (nvJPEG on CUDA through "
        "torchvision; the workers only read the file bytes and draw the crop boxes); needs "
        "--batched-augment on/auto", choices=("worker", "device"))

    # --- online kNN monitor ---------------------------------------------------------------
    knn_every: int = help_field(0, "weighted-kNN top-1 on the held-out labelled split every N "
                                "epochs (0 = off; also off when the data has no labels)")
    knn_at_start: bool = help_field(True, "also measure kNN before training (random init)")
    knn_k: int = help_field(200, "kNN neighbours")
    knn_t: float = help_field(0.1, "kNN temperature: weights exp(sim / t)")
    knn_max_train: int = help_field(0, "memory-bank images for kNN (0 = whole train split)")
    knn_max_test: int = help_field(0, "held-out images for kNN (0 = whole split)")
    knn_feature: str = help_field("backbone", "kNN on 'backbone' features or the method's "
                                  "'head' output when it has one", choices=("backbone", "head"))
    online_probe: bool = help_field(
        False, "train a linear classifier on detached backbone features of the first view beside "
        "the method (its own SGD; the encoder is untouched) and log its top-1 on each batch "
        "before it learns from it (probe_top1); costs one extra forward pass per step")
    probe_lr: float = help_field(0.1, "online probe: SGD learning rate (momentum 0.9, no decay)")

    def encoder_options(self) -> dict[str, Any]:
        """Keyword arguments the recipe passes to ``create_encoder`` beyond the name: the
        ``--encoder-kwargs`` JSON (recipes may add their own fields); recorded in ``encoder.pt``
        so that evaluation rebuilds the same architecture."""
        return parse_json_object("encoder_kwargs", self.encoder_kwargs)

    def validate(self) -> None:
        """The checks of every run, and the image fields'."""
        super().validate()
        for name in ("image_size", "knn_k"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        for name in ("knn_every", "knn_max_train", "knn_max_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.decode == "device" and self.batched_augment == "off":
            raise ValueError("--decode device needs the batched augmentation: use --batched-augment "
                             "on (or auto) with it, or --decode worker with --batched-augment off")
        self.encoder_options()  # a bad --encoder-kwargs JSON fails here


@dataclass
class ImageTextConfig(RunConfig):
    """A run on image-text pairs (CLIP): the fields every run has and the image tower's name,
    options and crop size, and the zero-shot / retrieval evaluator's cadence. No augmentation,
    kNN or probe fields: the images are centre crops (captions name colour and position)."""

    data: str = override(
        "shapes-captions", "image-text data spec: shapes-captions[:n=..,size=..] | "
        "captions:ROOT (images + captions.tsv/.jsonl) | wds-captions:DIR (.jpg + .txt shards)")
    encoder: str = help_field("small_cnn", "image backbone name for create_encoder")
    encoder_kwargs: str = help_field("", "create_encoder keyword arguments as a JSON object")
    image_size: int = help_field(32, "centre-crop size in pixels (shorter side resized to it)")
    eval_every: int = help_field(
        0, "zero-shot top-1 and retrieval recall every N optimiser steps (0 = at the end only)")
    eval_at_start: bool = help_field(False, "also evaluate before training (random init)")
    eval_max: int = help_field(1000, "held-out pairs the evaluator uses (0 = no evaluator)")

    def encoder_options(self) -> dict[str, Any]:
        """The ``--encoder-kwargs`` JSON (recorded in ``encoder.pt`` and ``clip.pt``)."""
        return parse_json_object("encoder_kwargs", self.encoder_kwargs)

    def validate(self) -> None:
        """The checks of every run, a positive crop size and a valid ``--encoder-kwargs``."""
        super().validate()
        if self.image_size <= 0 or self.eval_every < 0 or self.eval_max < 0:
            raise ValueError("--image-size must be positive, --eval-every and --eval-max >= 0")
        self.encoder_options()


@dataclass
class BertSizes:
    """The sizes of a BERT built from a configuration (random weights: a recipe's model named
    ``bert``), one spelling in every recipe; :meth:`bert_sizes` hands them to
    :func:`contrastive.nn.text_encoders.text_encoder` (or ``bert_options``). Declared here once
    for the text and image-text configurations (the recipes :func:`override` the defaults)."""

    layers: int = help_field(12, "layers of a 'bert' model (random weights; an hf: folder has "
                             "its own sizes)")
    hidden: int = help_field(768, "bert: hidden size")
    heads: int = help_field(12, "bert: attention heads")
    intermediate_size: int = help_field(0, "bert: feed-forward width (0 = 4 x hidden)")
    dropout: float = help_field(0.1, "bert: dropout of the hidden states and the attention "
                                "(BERT 0.1)")

    def bert_sizes(self) -> dict[str, Any]:
        """The sizes as :func:`~contrastive.nn.text_encoders.bert_options` takes them."""
        return dict(layers=self.layers, hidden=self.hidden, heads=self.heads,
                    intermediate_size=self.intermediate_size, dropout=self.dropout)

    def check_bert_sizes(self) -> None:
        """Positive sizes (``--intermediate-size`` >= 0) and a dropout in [0, 1)."""
        for name in ("layers", "hidden", "heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        if self.intermediate_size < 0:
            raise ValueError(f"--intermediate-size must be >= 0 (0 = 4 x hidden), got "
                             f"{self.intermediate_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")


@dataclass
class DualEncoderConfig(BertSizes, ImageTextConfig):
    """An image tower and a text tower trained on image-caption pairs at CPU scale (the CLIP
    family: recipes/clip.py, recipes/siglip.py): the schedule both recipes share (so that the
    methods compare on the same budget) and the text tower's sizes (:class:`BertSizes`: the
    image tower has none of its own, it is sized by ``--encoder`` / ``--encoder-kwargs``). A
    recipe adds its loss's fields and builds its method from :func:`~contrastive.engine.adapters.dual_encoder_kwargs`."""

    steps: int = override(300, "optimiser steps (the budget the schedule follows); "
                          "--steps 0 --epochs N for an epoch budget")
    batch_size: int = 128
    optimizer: str = override("adamw", "AdamW with decoupled weight decay (CLIP)")
    lr: float = 2e-3
    lr_scaling: str = override("none", "lr is absolute")
    weight_decay: float = override(0.1, "CLIP uses 0.2 at scale; 0.1 at this size")
    betas: tuple[float, float] = override((0.9, 0.98), "CLIP's AdamW betas")
    warmup_steps: int = 50
    save_every_steps: int = 100
    num_workers: int = 0
    log_every: int = 50
    # model
    dim: int = help_field(64, "shared embedding width")
    layers: int = override(2, "the text tower")
    hidden: int = override(64, "the text tower")
    heads: int = override(2, "the text tower")

    def validate(self) -> None:
        """The image-text checks and the text tower's sizes."""
        super().validate()
        self.check_bert_sizes()


@dataclass
class TextRunConfig(RunConfig):
    """What every run on text has besides :class:`RunConfig`'s fields: the tokenizer folder, the
    sentence length, the seed of generated data and the evaluator's cadence. Its two
    subclasses add their data: :class:`TextConfig` (sentences, SimCSE) and
    :class:`LabelledTextConfig` (labelled sentences and pairs, GLUE)."""

    data_seed: int = help_field(0, "seed of generated data (--seed drives model and order)")
    tokenizer: str = help_field("", "folder with tokenizer.json or vocab.txt")
    max_length: int = help_field(128, "tokens per sentence (longer ones are truncated)")
    eval_every: int = help_field(0, "evaluation every N optimiser steps (0 = at the end only)")
    eval_at_start: bool = help_field(True, "also evaluate before training (random init)")

    def validate(self) -> None:
        """The checks of every run, a positive length and cadence >= 0."""
        super().validate()
        if self.max_length <= 0:
            raise ValueError(f"--max-length must be positive, got {self.max_length}")
        if self.eval_every < 0:
            raise ValueError(f"--eval-every must be >= 0, got {self.eval_every}")


@dataclass
class TextConfig(TextRunConfig):
    """A run on sentences (SimCSE): the text fields, the tokenizer (a saved one or a WordPiece
    vocabulary trained on the training sentences) and the STS evaluator's pairs and cadence. No
    image fields. Recipes add their data and model fields."""

    data: str = override("generated", "training text (the recipe says which forms it reads)")
    tokenizer: str = override(
        "", "folder with tokenizer.json or vocab.txt; empty = train a WordPiece vocabulary on "
        "the training sentences (deterministic)")
    vocab_size: int = help_field(1000, "trained WordPiece vocabulary size")
    eval: str = help_field(
        "generated", "STS pairs the evaluator scores (Spearman of cosine similarities): "
        "generated | a GLUE STS-B folder or TSV | none")
    eval_split: str = help_field("dev", "STS-B split (dev; test has no scores)")
    n_eval: int = help_field(2000, "generated STS pairs (the test stream, --data-seed)")
    eval_every: int = override(0, "STS evaluation every N optimiser steps (0 = at the end only)")

    def validate(self) -> None:
        """The checks of every text run, and positive sizes."""
        super().validate()
        for name in ("vocab_size", "n_eval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")


@dataclass
class LabelledTextConfig(BertSizes, TextRunConfig):
    """A run on labelled sentences or sentence pairs (fine-tuning an encoder with a prediction
    layer, distilling one): the task (GLUE, read from ``--glue-dir``, or a generated one), the
    sizes of a BERT built from a configuration, and BERT's fine-tuning optimiser (Devlin et al.
    2019, sec. A.3; the authors' google-research/bert ``run_classifier.py`` and
    ``optimization.py``): AdamW (betas 0.9 / 0.999; eps 1e-8, torch's and the Hugging Face
    Trainer's, where the authors' TensorFlow code has 1e-6), linear warm-up over
    ``--warmup-fraction`` (``warmup_proportion`` 0.1) of the steps then linear decay to 0,
    weight decay 0.01 except biases and LayerNorm, gradient norm clipped to 1.0. The evaluator
    is the task's official dev metric (``glue_*`` in metrics.jsonl). The recipes set the model
    flags' names and sizes."""

    data: str = override("task", "the training data are --task's (and --glue-dir's)",
                         only=("task",), why="--task and --glue-dir name the data")
    task: str = help_field("generated", "a GLUE task (sst2, mnli, stsb, ...; with --glue-dir) "
                           "or generated | generated-nli | generated-sts")
    glue_dir: str = help_field("", "folder of the GLUE TSV files (glue_data: SST-2/, MNLI/ ...)")
    n_train: int = help_field(4000, "generated task: training examples")
    n_dev: int = help_field(1000, "generated task: dev examples (the independent test stream)")
    train_rows: int = help_field(0, "GLUE: train on a stratified subset of this many training "
                                 "rows (0 = all; drawn with --data-seed)")
    held_out: int = help_field(0, "GLUE: hold this many training rows out (stratified, "
                               "--data-seed), never trained on")
    eval_on: str = help_field("dev", "what the GLUE evaluator scores: dev | held_out (the "
                              "held-out training rows: choose hyper-parameters there, report dev)",
                              choices=("dev", "held_out"))
    tokenizer: str = override(
        "", "folder with tokenizer.json or vocab.txt; empty = the model folder's, or the "
        "generated tasks' own WordPiece")
    keep_layers: str = help_field(
        "", "hf: model: keep only these 0-based layers, e.g. 1,3,5 (a student initialised from "
        "a deeper model's layers, as DistilBERT's)")
    dropout: float = override(0.1, "also the prediction layer's")
    eval_at_start: bool = override(False, "also evaluate before training")
    # BERT fine-tuning (Devlin et al. 2019; the Hugging Face Trainer's AdamW)
    steps: int = override(1000, "optimiser steps (the budget; 0 = --epochs decide: "
                          "--steps 0 --epochs N)")
    batch_size: int = override(32, "GLOBAL examples per optimiser step")
    optimizer: str = override("adamw", "AdamW (BERT's)")
    lr: float = override(2e-5, "peak AdamW learning rate, absolute")
    lr_scaling: str = override("none", "lr is absolute")
    lr_schedule: str = override("linear", "linear decay to 0 after the warm-up (BERT's)")
    warmup_fraction: float = help_field(
        0.1, "linear warm-up over this fraction of the budget (sets --warmup-steps, or "
        "--warmup-epochs with an --epochs budget, when those are 0)")
    weight_decay: float = override(0.01, "AdamW weight decay (none on biases and LayerNorm)")
    clip_grad_norm: float = override(1.0, "max gradient norm (0 = off)")
    num_workers: int = override(0, "loader workers (tokenising is cheap: 0 = in the main "
                                "process)")
    log_every: int = 50

    derived_fields: ClassVar[tuple[str, ...]] = ("warmup_steps", "warmup_epochs")

    def __post_init__(self) -> None:
        """``--warmup-fraction`` into the engine's warm-up in steps (or epochs)."""
        if self.warmup_fraction > 0 and not (self.warmup_steps or self.warmup_epochs):
            if self.steps:
                self.warmup_steps = int(self.warmup_fraction * self.steps)
            else:
                self.warmup_epochs = self.warmup_fraction * self.epochs

    def validate(self) -> None:
        """The checks of every text run, the sizes and the warm-up fraction."""
        super().validate()
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"--warmup-fraction must be in [0, 1), got {self.warmup_fraction}")
        self.check_bert_sizes()
        for name in ("n_train", "n_dev"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        if self.train_rows < 0 or self.held_out < 0:
            raise ValueError(f"--train-rows and --held-out must be >= 0, got {self.train_rows}, "
                             f"{self.held_out}")
        if self.keep_layers and not all(p.strip().isdigit() for p in self.keep_layers.split(",")):
            raise ValueError(f"--keep-layers must be 0-based layer numbers like 1,3,5, got "
                             f"{self.keep_layers!r}")
        if self.eval_on == "held_out" and not self.held_out:
            raise ValueError("--eval-on held_out needs --held-out N (training rows to hold out)")


@dataclass
class CifarConfig(TrainConfig):
    """The CIFAR-10 training setup that solo-learn's configurations share (vturrisi/solo-learn,
    ``scripts/pretrain/cifar/*.yaml``), the source of our CIFAR recipes where a paper gives none:
    CIFAR-stem ResNet-18 at 32 px, batch 256, 1000 epochs, 10 warmup epochs then cosine, LARS
    with trust coefficient 0.02 where a recipe picks LARS, SyncBN across GPU processes, a kNN
    monitor every 10 epochs. Recipes subclass it with their optimiser, lr, decay and heads."""

    data: str = "cifar10"
    encoder: str = "cifar_resnet18"
    image_size: int = 32
    epochs: int = 1000
    batch_size: int = 256
    warmup_epochs: float = 10
    lars_trust_coeff: float = override(0.02, "solo-learn: eta 0.02")
    sync_bn: bool = override(True, "global BN across GPU processes")
    knn_every: int = 10
    crop_min: float = help_field(
        0.08, "RandomResizedCrop minimum scale of the two views (solo-learn's CIFAR "
        "configurations: 0.08, SimSiam and VICReg 0.2); 1.0 keeps the whole image (learning "
        "checks on shapes). The multi-crop pipelines (--local-crops) keep their own scales")

    #: the scales a recipe's multi-crop pipeline keeps (``--local-crops`` > 0), where it does
    #: not read ``--crop-min``: a --crop-min given then is refused, not silently ignored
    multicrop_scales: ClassVar[str | None] = None

    def validate(self) -> None:
        """The base checks, ``--crop-min`` in (0, 1], and no --crop-min a multi-crop pipeline
        would ignore."""
        super().validate()
        if not 0.0 < self.crop_min <= 1.0:
            raise ValueError(f"--crop-min must be in (0, 1] (a fraction of the image area), "
                             f"got {self.crop_min}")
        default = next(f.default for f in dataclasses.fields(self) if f.name == "crop_min")
        if (self.multicrop_scales and getattr(self, "local_crops", 0) > 0
                and self.crop_min != default):
            raise ValueError(f"--crop-min {self.crop_min} is not used with --local-crops: the "
                             f"multi-crop views keep their scales ({self.multicrop_scales}); "
                             "drop --crop-min, or --local-crops 0 for two views")


@dataclass
class DIMConfig(TrainConfig):
    """What Deep InfoMax's recipes share (Hjelm et al., ICLR 2019; the authors' rdevon/DIM):
    Adam at a constant lr 1e-4 with cortex's betas (0.5, 0.999) and no weight decay (AdamW with
    weight decay 0 is Adam exactly), batch 64, and the method's fields (MI units, estimator,
    local stage). ``recipes/dim_cifar.py`` and ``recipes/dim_stl.py`` add their data and views."""

    batch_size: int = override(64, "the code's batch_size=64")
    optimizer: str = override("adamw", "Adam: AdamW with --weight-decay 0 is Adam exactly")
    lr: float = override(1e-4, "absolute (--lr-scaling none): the code's learning_rate")
    lr_scaling: str = override("none", "lr is absolute")
    lr_schedule: str = override("constant", "the code keeps the lr constant")
    weight_decay: float = override(0.0, "none in the code")
    betas: tuple[float, float] = override((0.5, 0.999), "cortex's Adam betas")

    mi_units: int = help_field(2048, "units of the MI networks (models/dim.py LocalDIM)")
    estimator: str = help_field("infonce", "MI estimator: infonce (the paper's best DIM(L)) or "
                                "jsd (the code's default)", choices=("infonce", "jsd"))
    local_stage: str = help_field(
        "auto", "stage of the local feature map: 'auto' = the encoder's own (dcgan32: 1, "
        "dcgan64 and alexnet64: 2; other encoders: -2) or an index into its stages")

    def local_stage_index(self) -> int | None:
        """``--local-stage``: 'auto' -> None (the encoder's own), else the int stage index."""
        if self.local_stage == "auto":
            return None
        try:
            return int(self.local_stage)
        except ValueError:
            raise ValueError(f"--local-stage must be 'auto' or an int stage index, got "
                             f"{self.local_stage!r}") from None

    def validate(self) -> None:
        """The base checks, a valid ``--local-stage``, ``--mi-units`` >= 1, batch >= 2."""
        super().validate()
        self.local_stage_index()
        if self.mi_units < 1:
            raise ValueError(f"--mi-units must be positive, got {self.mi_units}")
        if self.batch_size < 2:
            raise ValueError("--batch-size must be >= 2: DIM's negatives are the other images")


def parse_json_object(name: str, text: str) -> dict[str, Any]:
    """``text`` (the value of field ``name``) as a JSON object; empty = {}."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"--{_flag(name)} must be a JSON object, got {text!r} ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"--{_flag(name)} must be a JSON object such as '{{\"img_size\": 32}}', "
                         f"got {text!r}")
    return value


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _new_flags(args: list[str], defaults: dict[str, Any]) -> list[str]:
    """``args`` with each old field name's flag (:data:`~contrastive.engine.compat.
    RENAMED_FIELDS`, ``--old``, ``--old=V``, ``--no-old``) written as its field's, with the
    one-time notice; ``defaults``: field -> default (an old name two fields shared goes to the
    one its value fits). Old names that are fields themselves stay."""
    out = list(args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        name, prefix = flag[2:].replace("-", "_"), "--"
        if name.startswith("no_") and name[3:] in RENAMED_FIELDS:
            name, prefix = name[3:], "--no-"
        if not flag.startswith("--") or name not in RENAMED_FIELDS or name in defaults:
            continue
        new = renamed_to(name, value if eq else (args[i + 1] if i + 1 < len(args) else ""),
                         defaults)
        if new is not None:
            _warn_renamed(f"--{_flag(name)}", f"--{_flag(new)}", stacklevel=4)
            out[i] = f"{prefix}{_flag(new)}{eq}{value}"
    return out


def _warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """A deprecation warning, shown once per old name and process (the ``warnings`` default),
    pointing at the caller of the function (``stacklevel`` frames up) that read the old name."""
    warnings.warn(f"{old} is renamed {new}; the old name still works for now", FutureWarning,
                  stacklevel=stacklevel)


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on", "y"):
        return True
    if low in ("0", "false", "no", "off", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _unwrap_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _add_field(parser: argparse.ArgumentParser, f: dataclasses.Field, tp: Any,
               default: Any, options: dict[str, Any]) -> None:
    """``--foo-bar`` / ``--foo_bar`` for field ``foo_bar`` with its ``options``
    (:func:`field_options`)."""
    name = f.name
    flags = [f"--{_flag(name)}"]
    if "_" in name:
        flags.append(f"--{name}")
    help_text = options.get("help", "")
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
    tp = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    shown = default if not isinstance(default, tuple) else " ".join(map(str, default))
    if tp is bool:
        parser.add_argument(*flags, nargs="?", const=True, type=_parse_bool, metavar="BOOL",
                            help=f"{help_text} (default: {str(default).lower()})", **kwargs)
        parser.add_argument(f"--no-{_flag(name)}", dest=f.name, action="store_false",
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return
    if origin is tuple:
        args = typing.get_args(tp)
        elem = args[0] if args else str
        nargs: Any = "*" if (len(args) == 2 and args[1] is Ellipsis) else len(args)
        kwargs.update(type=elem, nargs=nargs)
    elif origin is Literal:
        choices = typing.get_args(tp)
        kwargs.update(type=type(choices[0]), choices=choices)
    elif tp in (int, float, str):
        kwargs["type"] = tp
    else:
        raise TypeError(f"config field {f.name}: unsupported type {tp!r}")
    if "choices" in options:
        kwargs["choices"] = options["choices"]
    parser.add_argument(*flags, help=f"{help_text} (default: {shown!r})"
                        if isinstance(shown, str) else f"{help_text} (default: {shown})",
                        **kwargs)


class _Parser(argparse.ArgumentParser):
    """argparse with an unknown-flag message that names the closest field."""

    def __init__(self, *args: Any, known: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._known = list(known)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: Any = None) -> argparse.Namespace:
        ns, unknown = self.parse_known_args(args, namespace)
        if unknown:
            bad = [u for u in unknown if u.startswith("-")] or unknown
            word = bad[0].split("=", 1)[0]
            close = difflib.get_close_matches(word, self._known, n=3, cutoff=0.5)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            self.error(f"unknown option {word!r} for this recipe{hint} (every field is listed "
                       "by --help)")
        return ns


def parse_config(cls: type[C], argv: Sequence[str] | None = None, *, prog: str | None = None,
                 description: str | None = None) -> C:
    """Build ``cls`` from the command line: defaults from the dataclass, then ``--config FILE``
    (a JSON object such as a run's ``config.json``), then the flags given.

    Unknown flags exit with status 2 and a message naming the closest known flag; values that
    can never work raise ``ValueError`` from :meth:`RunConfig.validate` (reported the same way).
    """
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    known = []
    for f in fields:
        known.append(f"--{_flag(f.name)}")
    parser = _Parser(prog=prog, description=description or (cls.__doc__ or "").strip(),
                     allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter, known=known)
    parser.add_argument("--config", dest="__config", default=None, metavar="FILE.json",
                        help="read field values from a JSON file first (flags still win)")
    defaults = cls()
    options = {f.name: field_options(cls, f.name) for f in fields}
    for f in fields:
        _add_field(parser, f, hints[f.name], getattr(defaults, f.name), options[f.name])
    args = list(sys.argv[1:] if argv is None else argv)
    # old flags still work (resume a run's command line), with a notice
    args = _new_flags(args, {f.name: getattr(defaults, f.name) for f in fields})
    ns = parser.parse_args(args)
    values = vars(ns)
    config_file = values.pop("__config", None)
    base: dict[str, Any] = {}
    if config_file:
        with open(config_file) as fh:
            base = json.load(fh)
    try:
        base = _underived(cls, base)
        cfg = config_from_dict(cls, {**base, **values}, ignore_unknown=bool(config_file))
        cfg.validate()
        _check_budget(cfg, _budget_given(cls, values, base), config_file)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    return cfg


def _budget_given(cls: type[C], flags: dict[str, Any], base: dict[str, Any]) -> set[str]:
    """Which of ``epochs`` / ``steps`` the user chose: those on the command line; when it names
    neither, those a ``--config`` file sets to other than ``cls``'s default (a run's
    config.json records every field, its defaults too, so an unchanged one is no choice)."""
    names = {"epochs", "steps"}
    given = names & set(flags)
    if given:  # a flag overrides the file's budget: its other budget field is no longer chosen
        return given
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.name in names}
    return {n for n in names if n in base and base[n] != defaults[n]}


def _check_budget(cfg: RunConfig, given: set[str], config_file: str | None) -> None:
    """Refuse an ``--epochs`` the engine would ignore: the budget is ``--steps`` when positive
    (a recipe's default, such as the text and image-text recipes', or given too), so
    ``--epochs 5`` there trained the default steps without a word."""
    if "epochs" not in given or not cfg.steps:
        return
    e, s = cfg.epochs, cfg.steps
    source = ("given too" if "steps" in given
              else f"from --config {config_file}" if config_file and cfg.steps !=
              next(f.default for f in dataclasses.fields(cfg) if f.name == "steps")
              else "this recipe's default")
    k = type(cfg).epoch_steps
    hint = f" (--steps {e * k}: {e} of this recipe's epochs of {k} steps)" if k else ""
    raise ValueError(f"--epochs {e} is ignored: the budget is --steps {s} ({source}); pass "
                     f"--steps 0 --epochs {e} for {e} passes over the data, or --steps N "
                     f"alone{hint}")


def _underived(cls: type[C], base: dict[str, Any]) -> dict[str, Any]:
    """A ``--config`` file's values less those of ``cls.derived_fields`` that its own other
    values derive (a run's ``config.json`` records them): the flags may change what they follow,
    so they are derived again. A value the file sets otherwise is kept."""
    names = [f.name for f in dataclasses.fields(cls)
             if f.name in cls.derived_fields and f.name in base
             and f.default is not dataclasses.MISSING]
    if not names:
        return base
    unset = {f.name: f.default for f in dataclasses.fields(cls) if f.name in names}
    again = config_from_dict(cls, {**base, **unset}, ignore_unknown=True)
    return {k: v for k, v in base.items() if k not in names or getattr(again, k) != v}


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """Plain JSON-able dict of the fields (tuples become lists)."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def config_from_dict(cls: type[C], values: dict[str, Any], *, ignore_unknown: bool = False) -> C:
    """Inverse of :func:`config_to_dict`; unknown keys raise ``KeyError`` unless ignored. A
    field's old name (:data:`~contrastive.engine.compat.RENAMED_FIELDS`, such as an older run's
    ``config.json`` holds) is read as the new one, with a one-time ``FutureWarning``."""
    hints = typing.get_type_hints(cls)
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.init}
    names = set(defaults)
    values = dict(values)
    for old in [k for k in values if k in RENAMED_FIELDS and k not in names]:
        new = renamed_to(old, values[old], defaults)
        if new is not None:
            _warn_renamed(repr(old), repr(new))
            values.setdefault(new, values.pop(old))
    unknown = sorted(set(values) - names)
    if unknown and not ignore_unknown:
        close = difflib.get_close_matches(unknown[0], sorted(names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown config field(s) {unknown}{hint}; known: {sorted(names)}")
    kwargs = {}
    for name in names & set(values):
        value = values[name]
        tp = _unwrap_optional(hints[name])
        if typing.get_origin(tp) is tuple and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)
