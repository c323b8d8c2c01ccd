"""Training configuration: one dataclass, every field a command-line flag.

:class:`RunConfig` holds what every run has. A recipe subclasses its kit's configuration
(:mod:`contrastive.engine.kits`: ``ImageConfig`` on images, ``DualEncoderConfig`` on image-text
pairs, ``TextConfig`` on sentences, ``LabelledTextConfig`` on labelled text), sets the paper's
values as defaults (:func:`~contrastive.engine.fields.override`: a declared field's choices and
help are kept, so each choice list has one home) and adds the method's own fields
(:func:`~contrastive.engine.fields.help_field`); :func:`parse_config` turns the dataclass into
an ``argparse`` parser where every field ``foo_bar`` is ``--foo-bar`` (``--foo_bar`` works
too), ``--help`` lists each field with its default, and an unknown flag is an error that names
the closest field.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from contrastive.engine.compat import RENAMED_FIELDS, new_flags, renamed_to, warn_renamed
from contrastive.engine.fields import as_flag, field_options, help_field
from contrastive.hardware import PRECISIONS

__all__ = ["RunConfig", "SCHEDULES", "COMPILE_MODES", "parse_config", "config_to_dict",
           "config_from_dict", "parse_json_object"]

C = TypeVar("C", bound="RunConfig")

#: the learning-rate schedules (:func:`contrastive.engine.schedules.lr_at`)
SCHEDULES = ("cosine", "linear", "step", "constant")
#: ``torch.compile``'s modes (``--compile-mode``)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class RunConfig:
    """Fields every run has, whatever it trains on (images, text, image-text pairs).

    Each kit (:mod:`contrastive.engine.kits`) subclasses it with its modality's fields, its
    data among them (the image kit's ``ImageConfig``: ``--data``, encoder, crop size,
    augmentation path, kNN monitor, online probe), so text and image-text runs carry no image
    fields and labelled text, whose data ``--task`` names, no ``--data``.

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
    compile: bool = help_field(False, "torch.compile the backbone and its momentum copy "
                               "(nn.Module.compile, in place); the evaluators run them eagerly")
    compile_mode: str = help_field(
        "default", "torch.compile mode with --compile: reduce-overhead adds CUDA graphs on a GPU, "
        "the max-autotune modes search kernel configurations (longer compiles)",
        choices=COMPILE_MODES)
    grad_checkpointing: bool = help_field(
        False, "activation checkpointing: keep only each block's input in the forward pass and "
        "recompute the block in the backward pass (ViT blocks, ResNet stages, Hugging Face text "
        "models; contrastive.nn.checkpointing): less activation memory for about one more "
        "forward pass; the same gradients (dropout and drop path replayed) and BatchNorm statistics")
    fsdp: bool = help_field(
        False, "shard the parameters, gradients and optimiser state across the processes with "
        "torch's FSDP2 (fully_shard, applied by the engine: each ViT block, each ViT, the method; "
        "contrastive.engine.sharding), GPU or gloo CPU processes: the memory of the model state "
        "divided by the process count, the same training as without it (tested in float64); "
        "ViT methods only, several processes, no gradient caching")
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
                raise ValueError(f"--{as_flag(name)} must be positive, got {getattr(self, name)}")
        for name in ("steps", "max_steps", "num_workers", "save_every_steps",
                     "save_every_epochs", "warmup_epochs", "warmup_steps", "grad_cache_chunk"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{as_flag(name)} must be >= 0, got {getattr(self, name)}")
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


def parse_json_object(name: str, text: str) -> dict[str, Any]:
    """``text`` (the value of field ``name``) as a JSON object; empty = {}."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"--{as_flag(name)} must be a JSON object, got {text!r} ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"--{as_flag(name)} must be a JSON object such as '{{\"img_size\": 32}}', "
                         f"got {text!r}")
    return value


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
    flags = [f"--{as_flag(name)}"]
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
        parser.add_argument(f"--no-{as_flag(name)}", dest=f.name, action="store_false",
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
        known.append(f"--{as_flag(f.name)}")
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
    args = new_flags(args, {f.name: getattr(defaults, f.name) for f in fields})
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
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in dataclasses.asdict(cfg).items()}


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
            warn_renamed(repr(old), repr(new))
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
