"""Setting a run up: the accelerator, the data, the monitors, the method and its optimiser.

Each function checks its inputs before it builds anything expensive, so bad input fails in
seconds with a message that names the fix.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contrastive.engine.checkpoint import model_signature, read_meta, resolve_resume
from contrastive.engine.config import RunConfig
from contrastive.engine.grad_cache import GradCache, check_grad_cache
from contrastive.engine.handoff import DataInfo, data_info
from contrastive.engine.kits.base import BATCH_KEYS, DataAdapter
from contrastive.engine.loader import GlobalBatchSampler, build_train_loader
from contrastive.engine.optim import build_optimizer
from contrastive.engine.run_state import RUN_STATE_FILE, read_run_state
from contrastive.engine.schedules import scaled_lr
from contrastive.hardware import resolve_precision, warn_if_emulated_bf16
from contrastive.methods.base import encoder_of

__all__ = ["reset_accelerate_state", "resolve_run_precision", "compile_encoders",
           "eager_evaluation", "make_accelerator", "check_fresh_output_dir", "TrainData",
           "build_data", "Model", "build_model", "method_inputs"]

logger = logging.getLogger(__name__)


def resolve_run_precision(cfg: RunConfig, out: Path) -> tuple[str, str]:
    """``(precision, reason)`` for this run: ``--mixed-precision`` resolved once
    (:func:`contrastive.hardware.resolve_precision`); a resume with ``auto`` keeps the precision
    its checkpoint recorded unless accelerate's configuration sets one."""
    recorded = None
    if cfg.mixed_precision == "auto" and cfg.resume:
        path = resolve_resume(cfg.resume, out)
        if path is not None:
            recorded = read_meta(path).get("config", {}).get("mixed_precision")
    on_cpu = cfg.cpu or not torch.cuda.is_available()
    if cfg.float64 and cfg.mixed_precision == "auto":
        return "no", "auto: --float64 trains in float64"
    return resolve_precision(cfg.mixed_precision, on_cpu=on_cpu, recorded=recorded)


def reset_accelerate_state() -> None:
    """Forget accelerate's process-wide state (``AcceleratorState``, ``GradientState``,
    ``PartialState``), so that the next run in this process starts as a new program would: a
    notebook or a sweep whose second run asks for another precision otherwise stops on
    accelerate's "AcceleratorState has already been initialized" error. Call it between runs,
    never during one; it closes no process group (several processes keep theirs).
    """
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


def make_accelerator(cfg: RunConfig, project_dir: str | Path) -> Any:
    """An ``Accelerator`` for ``cfg`` in the precision ``--mixed-precision`` resolves to
    (:func:`resolve_run_precision`; resolve it first to keep a resumed run's precision).

    Raises ``ValueError`` for fp16 on the CPU: accelerate would silently train in fp32.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    from contrastive.engine.trackers import parse_report_to
    from contrastive.records import TENSORBOARD_DIR

    precision = cfg.mixed_precision
    if precision == "auto":
        precision, _ = resolve_run_precision(cfg, Path(project_dir))
    ddp = DistributedDataParallelKwargs(find_unused_parameters=cfg.ddp_find_unused_parameters)
    # Several processes without GPUs (`accelerate launch --multi_gpu`, `torchrun`): accelerate
    # only sets up gloo data parallelism (MULTI_CPU) when asked for the CPU; otherwise every
    # process would train alone as "rank 0".
    multi_process = int(os.environ.get("WORLD_SIZE", "1")) > 1
    acc = Accelerator(
        cpu=cfg.cpu or (multi_process and not torch.cuda.is_available()),
        mixed_precision=precision,
        gradient_accumulation_steps=cfg.grad_accum_steps,
        log_with=list(parse_report_to(cfg.report_to)) or None,  # see engine/trackers.py
        project_config=ProjectConfiguration(project_dir=str(project_dir), logging_dir=str(
            Path(project_dir) / TENSORBOARD_DIR)),  # TensorBoard: <run>/tensorboard/<recipe>
        kwargs_handlers=[ddp],
    )
    if acc.mixed_precision == "fp16" and acc.device.type == "cpu":
        raise ValueError("fp16 on the CPU silently runs fp32: pass --mixed-precision auto, bf16 "
                         "or no")
    if acc.mixed_precision == "bf16" and acc.device.type == "cpu" and acc.is_main_process:
        warn_if_emulated_bf16()
    return acc


def check_fresh_output_dir(out: Path, resume: str) -> None:
    """A new run (no ``--resume``) refuses a non-empty output folder, save one that holds only
    the ``run_state.json`` of a run that failed while setting up (no checkpoint, no log: bad
    input such as an ``--encoder-kwargs`` the encoder does not take), which it replaces: the
    run that follows the fix needs no new ``--output-dir``."""
    if resume or not out.exists():
        return
    entries = [p.name for p in out.iterdir()]
    if entries == [RUN_STATE_FILE] and _failed_in_setup(read_run_state(out)):
        logger.info("%s holds only the record of a run that failed before training; this run "
                    "replaces it", out)
        return
    if entries:
        raise FileExistsError(
            f"output folder {out} is not empty ({', '.join(sorted(entries)[:4])}...): pass "
            "--resume auto to continue that run, or choose a new --output-dir")


def _failed_in_setup(state: dict[str, Any] | None) -> bool:
    return (state is not None and state.get("state") == "failed"
            and state.get("checkpoint") is None and state.get("step") is None)


@dataclass
class TrainData:
    """The training data of a run, the step counts it implies and the hand-off to the method."""

    train_set: Any
    sampler: GlobalBatchSampler
    loader: Any
    info: DataInfo  # what build_method(cfg, data) is given
    micro_per_epoch: int
    epochs: int  # epochs the budget spans (the last one may be partial with --steps)
    last_step: int  # total_steps, or --max-steps when smaller

    @property
    def steps_per_epoch(self) -> int:
        return self.info.steps_per_epoch

    @property
    def total_steps(self) -> int:
        """The budget: ``--steps``, or ``--epochs`` x steps_per_epoch."""
        return self.info.total_steps


def build_data(cfg: RunConfig, adapter: Any, accelerator: Any) -> TrainData:
    """The kit's training set (:mod:`contrastive.engine.kits`), a deterministic
    sampler and the loader; the budget in steps (``--steps``, else ``--epochs``); the hand-off
    to the method (:class:`~contrastive.engine.handoff.DataInfo`)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    accum = cfg.grad_accum_steps
    train_set: Any = adapter.train_set(cfg, accelerator)
    info = data_info(cfg, len(train_set), world, adapter.handoff())
    steps_per_epoch, total_steps = info.steps_per_epoch, info.total_steps
    micro_per_epoch = steps_per_epoch * accum
    sampler = GlobalBatchSampler(len(train_set), cfg.batch_size // accum, rank=rank,
                                 world_size=world, seed=cfg.seed,
                                 num_batches=micro_per_epoch)  # whole optimiser steps only
    loader = build_train_loader(train_set, sampler, seed=cfg.seed, num_workers=cfg.num_workers,
                                pin_memory=accelerator.device.type == "cuda",
                                collate_fn=getattr(adapter, "collate", None))  # text: tokenise
    epochs = -(-total_steps // steps_per_epoch)
    last_step = min(total_steps, cfg.max_steps) if cfg.max_steps else total_steps
    return TrainData(train_set, sampler, loader, info, micro_per_epoch, epochs, last_step)


def method_inputs(method: nn.Module, extra: tuple[str, ...] = ()
                  ) -> tuple[tuple[str, ...], dict[str, Callable]]:
    """The method's ``needs`` and ``schedules()``; a need the loader cannot provide (nor the
    data set's ``extra`` fields, see :mod:`contrastive.engine.extras`, nor a schedule) is an
    error before anything trains."""
    declared = getattr(method, "schedules", None)
    schedules = dict(declared()) if callable(declared) else {}
    needs = tuple(getattr(method, "needs", ("views",)))
    unknown = sorted(set(needs) - set(BATCH_KEYS) - set(schedules) - set(extra))
    if unknown:
        raise ValueError(f"{type(method).__name__} needs batch key(s) {unknown} that the image "
                         f"training loop does not provide; it provides {sorted(BATCH_KEYS)}, "
                         f"the data set's fields {sorted(extra)} and the method's schedules "
                         f"{sorted(schedules)} (image-text methods need an image-text data set)")
    clash = sorted(set(schedules) & set(BATCH_KEYS))
    if clash:
        raise ValueError(f"{type(method).__name__}: schedule name(s) {clash} clash with the "
                         "loader's batch keys; rename them")
    return needs, schedules


@dataclass
class Model:
    """The prepared method and optimiser, and what the loop needs to know about the method."""

    model: nn.Module  # prepared (DDP-wrapped under several processes, sharded with --fsdp)
    module: nn.Module  # the method itself
    optimizer: Any
    needs: tuple[str, ...]
    schedules: dict[str, Callable]
    signature: dict[str, Any]  # see checkpoint.model_signature
    peak_lr: float
    after_step: Callable[[], None] | None  # the method's after_optimizer_step, if it has one
    cache: GradCache | None = None  # --grad-cache-chunk / cached --grad-accum-steps, else None


class MethodOptionError(ValueError):
    """A method refused the options or the encoder it was built with (a plain ``ValueError``
    of its constructor, which names the problem and the fix): the run stops in one line."""


def build_model(cfg: RunConfig, build_method: Callable[[Any, DataInfo], nn.Module],
                accelerator: Any, data: DataInfo, extra: tuple[str, ...] = (), *,
                kit: DataAdapter[Any] | None = None) -> Model:
    """``build_method(cfg, data)`` (seeded with ``cfg.seed``; inside the ``kit``'s
    ``method_building(cfg)``: the image kit's ``--init``), converted for the run's options and
    by the kit (its ``prepare_method``), its optimiser at the scaled peak lr (with the groups
    the kit declares, its ``param_groups``), both ``prepare``d.
    ``extra``: the data set's per-sample fields beyond image and label
    (:func:`contrastive.engine.extras.extra_keys`)."""
    from accelerate.utils import set_seed

    world, device = accelerator.num_processes, accelerator.device
    set_seed(cfg.seed)
    with kit.method_building(cfg) if kit is not None else contextlib.nullcontext():
        try:
            method = build_method(cfg, data)
        except ValueError as e:  # the method's own check of its options: one line for the user
            if type(e) is not ValueError:
                raise
            raise MethodOptionError(str(e)) from e
    needs, schedules = method_inputs(method, extra)
    signature = model_signature(method)  # as built: what a checkpoint must match
    # accumulation where the loss couples samples, caching without a backbone: refused here
    cached = check_grad_cache(method, cfg.grad_cache_chunk, cfg.grad_accum_steps) == "cache"
    if cfg.sync_bn and world > 1:
        if device.type == "cuda":
            from contrastive.nn.norm import convert_to_sync_bn

            method = convert_to_sync_bn(method)
        else:
            logger.warning("--sync-bn ignored: SyncBatchNorm needs GPU processes")
    if cfg.float64:
        method = method.double()  # inputs follow in the step and the kNN monitor
    if kit is not None:
        method = kit.prepare_method(cfg, method, device)
    if cfg.grad_checkpointing:
        from contrastive.nn.checkpointing import enable_grad_checkpointing

        enable_grad_checkpointing(method)
    fused = cfg.fused_optimizer
    if cfg.fsdp:  # before the optimiser: it must hold the sharded parameters
        from contrastive.engine.sharding import check_fsdp, shard_method, sharded_fused

        check_fsdp(world, cached=cached, compile=cfg.compile)
        fused = sharded_fused(cfg.optimizer, fused)
        shard_method(method, device, world)
    if cfg.compile:
        logger.info("compiled (mode %s): %s", cfg.compile_mode,
                    ", ".join(compile_encoders(method, mode=cfg.compile_mode)))
    peak_lr = scaled_lr(cfg.lr, cfg.batch_size, cfg.lr_scaling)
    declared = kit.param_groups(cfg, method) if kit is not None else []
    optimizer = build_optimizer(method, cfg.optimizer, lr=peak_lr, weight_decay=cfg.weight_decay,
                                momentum=cfg.sgd_momentum, nesterov=cfg.nesterov,
                                betas=(cfg.betas[0], cfg.betas[1]), trust_coeff=cfg.lars_trust_coeff,
                                exclude_from_wd=cfg.exclude_from_wd,
                                fused=fused, device_type=accelerator.device.type,
                                extra_groups=declared)
    if cfg.fsdp:  # FSDP reduces the gradients itself: no DDP wrapper (evaluation_mode's point)
        model = accelerator.prepare_model(method, evaluation_mode=True)
        optimizer = accelerator.prepare_optimizer(optimizer)
    else:
        model, optimizer = accelerator.prepare(method, optimizer)
    module = accelerator.unwrap_model(model)
    after_step = getattr(module, "after_optimizer_step", None)
    cache = None
    if cached:  # accumulation alone: chunks of one micro-batch
        micro = cfg.batch_size // (world * cfg.grad_accum_steps)
        cache = GradCache(module, cfg.grad_cache_chunk or micro)
        logger.info("gradient caching: %s run %d samples at a time per process, the heads and "
                    "the loss on the whole batch of %d", ", ".join(cache.names), cache.chunk,
                    cfg.batch_size // world)
    return Model(model, module, optimizer, needs, schedules, signature, peak_lr,
                 after_step if callable(after_step) else None, cache)


def compile_encoders(method: nn.Module, mode: str = "default") -> list[str]:
    """``torch.compile`` in place (``nn.Module.compile``, ``mode`` as ``--compile-mode``) the
    method's backbone and every momentum (EMA) copy it keeps (MoCo's key network, BYOL's target,
    DINO's teacher ...): the query and the key paths are the step's two big forward passes.
    Returns the names of the compiled submodules. Heads stay eager (small matrix products).

    Each distinct graph compiles once: the backbone with gradients, the copy without (its own
    graph, which Dynamo files as a recompilation when the copy shares the backbone's ``forward``,
    ``GLOBAL_STATE changed: grad_mode``); the EMA update changes parameter values in place, not
    the graph. The evaluators run these modules eagerly (:func:`eager_evaluation`): their eval
    mode and ragged last batch would otherwise add graphs, and the batch size that changes would
    make Dynamo recompile the training graph with a symbolic batch size (slow to compile, the
    first step stalled for minutes)."""
    from contrastive.nn.momentum import MomentumEncoder

    encoder_of(method).compile(mode=mode)
    names = ["encoder"]
    for name, module in method.named_modules():
        if isinstance(module, MomentumEncoder):
            module.module.compile(mode=mode)
            names.append(f"{name}.module")
    return names


@contextlib.contextmanager
def eager_evaluation() -> Iterator[None]:
    """The context an evaluator runs in: modules compiled by :func:`compile_encoders` run their
    eager code (``torch.compiler.set_stance("force_eager")``), compile nothing and leave the
    training graphs' caches as they were."""
    with torch.compiler.set_stance("force_eager"):
        yield
