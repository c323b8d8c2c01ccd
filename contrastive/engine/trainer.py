"""The training loop: one readable function on ``accelerate.Accelerator``.

``train(cfg, build_method, build_pipeline)`` does, in order:

1. checks the inputs (precision vs device, output folder vs ``--resume``, batch divisibility,
   the data set) before anything is built, so bad input fails in seconds;
2. builds the data (deterministic global order, per-sample seeded augmentation, optional batched
   augmentation on the device), the method and the optimiser, and ``prepare``s them;
3. resumes (signature + config checked before loading, fingerprints verified after);
4. loops: ``lr = lr_at(step)``, the method's schedules once per optimiser step, ``out =
   model(batch)`` with ``batch`` = the method's ``needs`` (``views``, ``labels``, ``indices``)
   plus the schedule values (see :mod:`contrastive.methods`), backward, drop the gradients of
   groups still frozen, clip, step; logs ``metrics.jsonl`` every
   ``log_every`` steps (every 0-d tensor the method returns, as a window mean), checkpoints every
   ``save_every_steps`` steps and at epoch ends, runs the kNN monitor every ``knn_every``
   epochs, and stops cleanly on SIGTERM/SIGINT, its launcher's exit, ``max_steps`` or the
   last epoch (a resume with nothing left to train changes nothing);
5. writes ``encoder.pt`` (query backbone, ``{"encoder": name, "state_dict": ...}``) and
   ``run_state.json`` (running / stopped / completed / failed, see
   :mod:`contrastive.engine.run_state`).

Everything random is a function of ``cfg.seed`` and the position in the run, so a resumed run
continues exactly as the uninterrupted one (see :mod:`contrastive.engine.loader`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.checkpoint import (
    CheckpointManager,
    TrainState,
    check_compatible,
    find_latest,
    model_signature,
    read_meta,
    resolve_resume,
)
from contrastive.engine.config import TrainConfig, config_to_dict
from contrastive.engine.loader import (
    GlobalBatchSampler,
    build_train_loader,
    start_workers,
    step_generator,
)
from contrastive.engine.monitor import KNNMonitor, feature_fn
from contrastive.engine.optim import (
    build_optimizer,
    drop_frozen_grads,
    set_lr,
    set_weight_decay,
)
from contrastive.engine.run_folder import check_output_dir, truncate_metrics
from contrastive.engine.run_state import EXIT_STOPPED, read_run_state, write_run_state
from contrastive.engine.schedules import lr_at, scaled_lr
from contrastive.records import ENCODER_FILE, EncoderRecord, RecordError

__all__ = ["train", "TrainResult", "NonFiniteLossError", "make_accelerator", "write_encoder"]

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite (``--on-nonfinite stop``)."""


@dataclass
class TrainResult:
    """What a run left behind."""

    output_dir: Path
    status: str  # "completed", "max_steps" or "interrupted" (by a signal or the launcher's exit)
    step: int
    epoch: int
    encoder_path: Path | None = None
    checkpoint: Path | None = None
    knn_top1: float | None = None
    knn_history: list[tuple[int, float]] = field(default_factory=list)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    steps_trained: int = 0  # optimiser steps this call took (0: a resume with nothing to do)
    stop_reason: str | None = None  # "SIGTERM", "SIGINT", "launcher exited (...)"

    @property
    def exit_code(self) -> int:
        """The process exit status for this result: 75 (stopped, resumable) or 0."""
        return EXIT_STOPPED if self.status == "interrupted" else 0


# ----------------------------------------------------------------------------------------------
# set-up helpers


def make_accelerator(cfg: TrainConfig, project_dir: str | Path) -> Any:
    """An ``Accelerator`` for ``cfg``; ``--mixed-precision`` wins over accelerate's config.

    Raises ``ValueError`` for fp16 on the CPU: accelerate would silently train in fp32.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    cpu_only = cfg.cpu or not torch.cuda.is_available()
    mp = cfg.mixed_precision or None
    if mp == "fp16" and cpu_only:
        raise ValueError("--mixed-precision fp16 on the CPU: accelerate would silently run fp32. "
                         "Use --mixed-precision bf16 (autocast, ~2x faster on AVX-512-bf16 CPUs) "
                         "or no")
    ddp = DistributedDataParallelKwargs(find_unused_parameters=cfg.ddp_find_unused_parameters)
    # Several processes without GPUs (`accelerate launch --multi_gpu`, `torchrun`): accelerate
    # only sets up gloo data parallelism (MULTI_CPU) when asked for the CPU; otherwise every
    # process would train alone as "rank 0".
    multi_process = int(os.environ.get("WORLD_SIZE", "1")) > 1
    acc = Accelerator(
        cpu=cfg.cpu or (multi_process and not torch.cuda.is_available()),
        mixed_precision=mp,
        gradient_accumulation_steps=cfg.grad_accum_steps,
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_dir=str(project_dir),
        kwargs_handlers=[ddp],
    )
    if acc.mixed_precision == "fp16" and acc.device.type == "cpu":
        raise ValueError("accelerate's configuration asks for fp16 on the CPU, which silently "
                         "runs fp32: pass --mixed-precision bf16 or no")
    return acc


def _check_output_dir(out: Path, resume: str) -> None:
    if resume or not out.exists():
        return
    entries = [p.name for p in out.iterdir()]
    if entries:
        raise FileExistsError(
            f"output folder {out} is not empty ({', '.join(sorted(entries)[:4])}...): pass "
            "--resume auto to continue that run, or choose a new --output-dir")


def write_encoder(out: Path, cfg: TrainConfig, module: nn.Module, pipeline: Any, recipe: str,
                  step: int) -> Path:
    """``<out>/encoder.pt``: the method's backbone as a :class:`~contrastive.records.EncoderRecord`
    with the ``create_encoder`` kwargs, the crop size and the pipeline's normalisation (which
    evaluation uses by default)."""
    record = EncoderRecord.from_module(
        module.encoder, cfg.encoder, encoder_kwargs=cfg.encoder_options(),
        mean=getattr(pipeline, "mean", None), std=getattr(pipeline, "std", None),
        image_size=cfg.image_size, step=step, recipe=recipe, method=type(module).__name__)
    return record.save(out / ENCODER_FILE)


class _Metrics:
    """``metrics.jsonl`` writer (main process) with a truncate-on-resume rule."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None) -> None:
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        if resume_step is None:
            self.path.write_text("")
        else:  # drop lines written after the checkpoint we resume from (and a torn last line)
            truncate_metrics(self.path, resume_step)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")


class _StopRequests:
    """Why the run should stop early: a signal or the launcher's exit (``reason``, else None).

    SIGTERM / SIGINT only set the reason; the loop saves a checkpoint after the current step and
    the run exits with status 75. Repeated SIGTERMs are ignored (Slurm signals every process of
    a job step and torchrun forwards the same signal again; a scheduler's SIGKILL follows
    anyway), also after the loop, until the process exits with 75; a second SIGINT (Ctrl-C
    twice) stops at once, without saving. A signal the process
    was started ignoring (``nohup``, background jobs) stays ignored.

    ``watch_parent``: :meth:`check` also reports the exit of the process that started this one
    (its parent pid changes when it is re-parented). One ``os.getppid()`` call per check: no
    host sync, no I/O.
    """

    def __init__(self, watch_parent: bool) -> None:
        self.reason: str | None = None
        self._parent = os.getppid() if watch_parent else None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopRequests:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.reason is None:
            self.reason = name
            logger.warning("received %s: saving a checkpoint after this step, then exiting "
                           "(%s)", name, "press Ctrl-C again to stop immediately, without "
                           "saving" if signum == signal.SIGINT else "further SIGTERMs are "
                           "ignored; SIGKILL stops immediately")
        if signum == signal.SIGINT:  # the next one stops immediately
            signal.signal(signum, self._old.get(signum, signal.default_int_handler))

    def check(self) -> str | None:
        """The reason to stop, if any (also polls the parent process when watched)."""
        if self.reason is None and self._parent is not None and os.getppid() != self._parent:
            self.reason = f"launcher exited (parent pid {self._parent})"
            logger.warning("%s: saving a checkpoint after this step, then exiting",
                           self.reason)
        return self.reason

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            if sig == signal.SIGTERM and self.reason is not None and old is signal.SIG_DFL:
                # the run is stopping: a late copy of the SIGTERM (Slurm signals every process,
                # a launcher forwards another) must not kill it before it exits with 75. A
                # Python handler, not SIG_IGN, so that processes started later do not inherit it
                signal.signal(sig, _ignore_late_sigterm)
                _ignore_sigterm_at_exit.register()
                continue
            signal.signal(sig, old)


def _ignore_late_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM after a stop was requested: the run has saved and is exiting; ignore it."""


class _IgnoreSigtermAtExit:
    """At interpreter exit CPython puts every signal with a Python handler back to the default
    action, which would let a late SIGTERM kill a stopped run during its last milliseconds
    (exit -15 instead of 75). SIG_IGN survives that reset: switch to it at exit, when the
    late-SIGTERM handler is still the one in place (so an embedding process that restored its
    own handler is left alone)."""

    registered = False

    def register(self) -> None:
        if not self.registered:
            import atexit

            atexit.register(self)
            self.registered = True

    def __call__(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) is _ignore_late_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread, or no signals here
            pass


_ignore_sigterm_at_exit = _IgnoreSigtermAtExit()


def _watch_parent(setting: str) -> bool:
    """``--stop-if-orphaned``: auto = on when accelerate launch or torchrun started us."""
    if setting == "auto":
        return any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "ACCELERATE_USE_CPU"))
    return setting == "on"


def _rel(path: Path | None, out: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).relative_to(out))
    except ValueError:
        return str(path)


def _record_failure(out: Path, exc: BaseException) -> None:
    """``run_state.json`` = failed, with the error and the newest complete checkpoint."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    error = text[0][:500] if text else type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):
        error = "KeyboardInterrupt: stopped without saving (a second SIGINT)"
    try:
        latest = find_latest(out / "checkpoints")
        step = read_meta(latest).get("step") if latest is not None else None
        write_run_state(out, "failed", step=step, error=error, resumable=latest is not None,
                        checkpoint=_rel(latest, out))
    except Exception as e:  # noqa: BLE001 - the failure itself may be a full or read-only disk
        logger.warning("could not record the failure in %s: %s", out / "run_state.json", e)


def _resolve_batched(cfg: TrainConfig, device: torch.device) -> bool:
    # "auto" = on: benchmarks/results/augment.md measured the batched path faster than the
    # per-image one on this CPU too (1.4x at 32 px, 1.6x at 224 px) and on the GPU
    return cfg.batched_augment != "off"


# ----------------------------------------------------------------------------------------------
# the loop


def train(cfg: TrainConfig, build_method: Callable[[TrainConfig], nn.Module],
          build_pipeline: Callable[[TrainConfig], Any], *, recipe: str = "custom") -> TrainResult:
    """Train ``build_method(cfg)`` on ``cfg.data`` augmented by ``build_pipeline(cfg)``.

    ``build_method`` returns a method (:class:`contrastive.methods.Method`: ``forward(batch) ->
    dict`` with ``loss`` and metrics, ``needs``, ``schedules()``, ``param_groups()``, attribute
    ``encoder``).
    ``build_pipeline`` returns a :class:`contrastive.augment.Pipeline` (per-image ``__call__``
    and ``split()`` for the batched path). See the module docstring for the steps.
    """
    cfg.validate()
    out = Path(cfg.output_dir or os.path.join("runs", recipe))
    check_output_dir(out)  # a file, read-only: one line, before anything is built
    _check_output_dir(out, cfg.resume)  # before any process writes anything
    accelerator = make_accelerator(cfg, out)
    is_main = accelerator.is_main_process
    if not is_main:  # nothing printed from other ranks
        logging.getLogger().setLevel(logging.ERROR)
    world, accum = accelerator.num_processes, cfg.grad_accum_steps
    if cfg.batch_size % (world * accum):
        raise ValueError(f"--batch-size {cfg.batch_size} must be divisible by processes x "
                         f"--grad-accum-steps = {world} x {accum}")
    accelerator.wait_for_everyone()
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
    try:  # from here on the folder is this run's: its run_state.json says how the run ended
        with _StopRequests(_watch_parent(cfg.stop_if_orphaned)) as stop:
            return _train(cfg, build_method, build_pipeline, recipe, out, accelerator, stop)
    except BaseException as exc:
        if is_main:
            _record_failure(out, exc)
        raise


def _train(cfg: TrainConfig, build_method: Callable[[TrainConfig], nn.Module],
           build_pipeline: Callable[[TrainConfig], Any], recipe: str, out: Path,
           accelerator: Any, stop: _StopRequests) -> TrainResult:
    """The body of :func:`train` once the output folder and the accelerator exist."""
    from contrastive.data import get_dataset, has_split, num_classes

    is_main = accelerator.is_main_process
    world, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    accum = cfg.grad_accum_steps

    # ---- data ----------------------------------------------------------------------------
    batched = _resolve_batched(cfg, device)
    pipeline = build_pipeline(cfg)
    device_fn = None
    if batched:
        worker_fn, device_fn = pipeline.split()
        transform = worker_fn
    else:
        transform = pipeline
    train_set = get_dataset(cfg.data, "train", transform=transform, strict=cfg.strict_data)
    steps_per_epoch = len(train_set) // cfg.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"--data {cfg.data} has {len(train_set)} training images, fewer than "
                         f"one --batch-size {cfg.batch_size}: lower the batch size")
    micro_per_epoch = steps_per_epoch * accum
    sampler = GlobalBatchSampler(len(train_set), cfg.batch_size // accum, rank=rank,
                                 world_size=world, seed=cfg.seed,
                                 num_batches=micro_per_epoch)  # whole optimiser steps only
    loader = build_train_loader(train_set, sampler, seed=cfg.seed, num_workers=cfg.num_workers,
                                pin_memory=device.type == "cuda")
    total_steps = steps_per_epoch * cfg.epochs
    last_step = min(total_steps, cfg.max_steps) if cfg.max_steps else total_steps

    monitor = None
    if cfg.knn_every:
        if not has_split(cfg.data, "test"):
            logger.info("kNN monitor off: --data %s has no held-out labelled split", cfg.data)
        else:
            from contrastive.augment import get_pipeline

            norm = {k: getattr(pipeline, k) for k in ("mean", "std") if hasattr(pipeline, k)}
            eval_tf = get_pipeline("eval", image_size=cfg.image_size, **norm)
            bank = get_dataset(cfg.data, "train", transform=eval_tf, strict=cfg.strict_data)
            query = get_dataset(cfg.data, "test", transform=eval_tf, strict=cfg.strict_data)
            n_cls = num_classes(bank)
            if n_cls is None:
                logger.info("kNN monitor off: --data %s has no labels", cfg.data)
            else:
                monitor = KNNMonitor(bank, query, k=cfg.knn_k, t=cfg.knn_t,
                                     max_bank=cfg.knn_max_train, max_query=cfg.knn_max_test,
                                     batch_size=max(cfg.batch_size // world, 64),
                                     num_workers=min(cfg.num_workers, 4), num_classes=n_cls)

    # ---- model and optimiser ------------------------------------------------------------------
    from accelerate.utils import set_seed

    set_seed(cfg.seed)
    method = build_method(cfg)
    needs, schedules = _method_inputs(method)
    signature = model_signature(method)
    if getattr(method, "uses_in_batch_negatives", False) and accum > 1:
        logger.warning("--grad-accum-steps %d with in-batch negatives: each micro-batch of %d "
                       "images only contrasts against itself; this is NOT a bigger contrastive "
                       "batch", accum, cfg.batch_size // accum)
    if cfg.sync_bn and world > 1:
        if device.type == "cuda":
            method = nn.SyncBatchNorm.convert_sync_batchnorm(method)
        else:
            logger.warning("--sync-bn ignored: SyncBatchNorm needs GPU processes")
    if cfg.float64:
        method = method.double()  # inputs follow in the step and the kNN monitor
    if cfg.channels_last:
        method = method.to(memory_format=torch.channels_last)
        from contrastive.nn.norm import SplitBatchNorm2d

        if any(isinstance(m, SplitBatchNorm2d) for m in method.modules()):
            logger.warning("--channels-last with split BN is slower, not faster: split BN "
                           "computes in NCHW, so every BN layer converts the layout twice "
                           "(measured 0.7-0.95x on the CPU); use one or the other")
    if cfg.compile:
        method.encoder.compile()
    peak_lr = scaled_lr(cfg.lr, cfg.batch_size, cfg.lr_scaling)
    optimizer = build_optimizer(method, cfg.optimizer, lr=peak_lr, weight_decay=cfg.weight_decay,
                                momentum=cfg.sgd_momentum, nesterov=cfg.nesterov,
                                betas=tuple(cfg.betas), trust_coeff=cfg.lars_trust_coeff,
                                exclude_from_wd=cfg.exclude_from_wd)
    model, optimizer = accelerator.prepare(method, optimizer)
    module = accelerator.unwrap_model(model)

    config_dict = {"recipe": recipe, **config_to_dict(cfg)}
    state = TrainState()
    ckpt = CheckpointManager(accelerator, model, optimizer, state, out / "checkpoints",
                             keep_last=cfg.keep_last,
                             meta={"config": config_dict, "signature": signature,
                                   "recipe": recipe})
    ckpt.cleanup_partial()

    # ---- resume --------------------------------------------------------------------------------
    resume_path = resolve_resume(cfg.resume, out)
    if cfg.resume == "auto" and resume_path is None:
        logger.info("--resume auto: no checkpoint in %s, starting a new run", out / "checkpoints")
    if resume_path is not None:
        changes = check_compatible(read_meta(resume_path), signature, config_dict,
                                   world_size=world, allow_config_change=cfg.allow_config_change,
                                   path=resume_path)
        for c in changes:
            logger.warning("resuming with a changed setting: %s", c)
        ckpt.load(resume_path)
        logger.info("resumed from %s at step %d (epoch %d, micro-batch %d)", resume_path,
                    state.step, state.epoch, state.micro_in_epoch)
        if state.step >= last_step or state.epoch >= cfg.epochs:
            return _nothing_to_do(cfg, state, last_step, total_steps, out, resume_path,
                                  accelerator, module, pipeline, recipe)
    else:  # a fresh run: give each process its own random stream from here on
        set_seed(cfg.seed, device_specific=True)

    resolved = {
        "peak_lr": peak_lr, "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
        "world_size": world, "per_process_micro_batch": cfg.batch_size // (world * accum),
        "mixed_precision": accelerator.mixed_precision, "device": str(device),
        "batched_augment": batched, "train_images": len(train_set),
        "torch": torch.__version__, "command": " ".join(sys.argv),
        "encoder_kwargs": cfg.encoder_options(),  # evaluation rebuilds the encoder with these
    }
    if is_main:
        (out / "config.json").write_text(json.dumps({**config_dict, "resolved": resolved},
                                                    indent=1))
        logger.info("training %s: %d images, %d steps/epoch x %d epochs, global batch %d on %d "
                    "process(es), lr %.4g, precision %s, augmentation %s", recipe, len(train_set),
                    steps_per_epoch, cfg.epochs, cfg.batch_size, world, peak_lr,
                    accelerator.mixed_precision, "batched on device" if batched else "per image")
    metrics = _Metrics(out / "metrics.jsonl", is_main,
                       state.step if resume_path is not None else None)
    if cfg.report_to != "none":
        accelerator.init_trackers(recipe, config={k: v for k, v in config_dict.items()
                                                  if isinstance(v, (int, float, str, bool))})

    result = TrainResult(output_dir=out, status="completed", step=state.step, epoch=state.epoch,
                         checkpoint=resume_path)
    start_step = state.step
    if is_main:
        write_run_state(out, "running", step=state.step, last_step=last_step,
                        checkpoint=_rel(resume_path, out))

    def run_knn(tag: str) -> None:
        model.eval()
        try:
            top1 = monitor(feature_fn(module, cfg.knn_feature), accelerator,
                           channels_last=cfg.channels_last)
        finally:
            model.train()
        result.knn_top1 = top1
        result.knn_history.append((state.step, top1))
        record = {"step": state.step, "epoch": round(state.step / steps_per_epoch, 4),
                  "knn_top1": top1, "knn_when": tag}
        metrics.write(record)
        logger.info("kNN top-1 (%s, step %d): %.2f %%", tag, state.step, top1)
        if cfg.report_to != "none":
            accelerator.log({"knn_top1": top1}, step=state.step)

    def save() -> Path:
        path = ckpt.save()
        result.checkpoint = path
        return path

    def finish(status: str) -> TrainResult:
        saved = ckpt.last_saved_step if ckpt.last_saved_step is not None else (
            start_step if resume_path is not None else None)
        if saved != state.step:
            save()
        result.status, result.step, result.epoch = status, state.step, state.epoch
        result.steps_trained = state.step - start_step
        if is_main:
            result.encoder_path = write_encoder(out, cfg, module, pipeline, recipe, state.step)
            logger.info("%s at step %d: encoder weights in %s", status, state.step,
                        result.encoder_path)
            if status == "interrupted":
                write_run_state(out, "stopped", step=state.step, last_step=last_step,
                                reason=result.stop_reason, resumable=True,
                                checkpoint=_rel(result.checkpoint, out), exit_code=EXIT_STOPPED)
            else:
                write_run_state(out, "completed", step=state.step, last_step=last_step,
                                reason="max_steps" if status == "max_steps" else "epochs",
                                encoder=_rel(result.encoder_path, out), exit_code=0)
        accelerator.wait_for_everyone()
        if cfg.report_to != "none":
            accelerator.end_training()
        return result

    if monitor is not None and cfg.knn_at_start and resume_path is None:
        run_knn("start")

    # ---- loop ----------------------------------------------------------------------------------
    model.train()
    progress = None
    if is_main and cfg.progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=last_step, initial=state.step, desc=recipe, unit="step",
                        dynamic_ncols=True, mininterval=1.0)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    sched_step, sched = -1, {}
    t_last, images_last, wait_time = time.perf_counter(), state.images_seen, 0.0
    last_out: dict[str, torch.Tensor] = {}
    status = "completed"
    first_bad = torch.full((), -1, dtype=torch.long, device=device)

    def check_finite(first: torch.Tensor) -> None:
        """Raise (on every process) if a loss since the start was NaN/inf ("stop" mode)."""
        bad = first.reshape(1).clone()
        if world > 1:
            bad = accelerator.reduce(torch.where(bad < 0, torch.full_like(bad, 1 << 62), bad),
                                     "min")
            bad = torch.where(bad == 1 << 62, torch.full_like(bad, -1), bad)
        step = int(bad.item())
        if step >= 0:
            last = ckpt.last_saved_step
            raise NonFiniteLossError(
                f"non-finite loss (NaN or inf) at step {step}. The last good checkpoint is "
                f"{'step ' + str(last) if last is not None else 'none'} in "
                f"{out / 'checkpoints'}; resume with --resume auto and a lower --lr, or pass "
                "--on-nonfinite skip to skip such steps")

    if _any_true(stop.check() is not None, accelerator):  # a signal during the set-up
        status = "interrupted"
    with progress or contextlib.nullcontext():
        while state.epoch < cfg.epochs and status == "completed":
            epoch = state.epoch
            sampler.set_epoch(epoch)
            skip = state.micro_in_epoch
            batches = accelerator.skip_first_batches(loader, skip) if skip else loader
            t_wait = time.perf_counter()
            # workers start with SIGTERM/SIGINT held back, then ignore them (see loader.py)
            for micro, (views, labels, indices) in enumerate(start_workers(batches),
                                                             start=skip):
                wait_time += time.perf_counter() - t_wait
                views = [v.to(device, non_blocking=True) for v in views]
                if device_fn is not None:
                    views = device_fn(views, generator=step_generator(
                        device, cfg.seed, state.step, micro % accum, rank))
                if cfg.channels_last:
                    views = [v.contiguous(memory_format=torch.channels_last) for v in views]
                if cfg.float64:
                    views = [v.double() for v in views]
                lr = lr_at(state.step, steps_per_epoch=steps_per_epoch, epochs=cfg.epochs,
                           peak=peak_lr, schedule=cfg.lr_schedule,
                           warmup_epochs=cfg.warmup_epochs, min_lr=cfg.min_lr,
                           milestones=cfg.lr_milestones, gamma=cfg.lr_gamma,
                           per=cfg.schedule_per)
                set_lr(optimizer, lr)
                if sched_step != state.step:  # once per optimiser step (all its micro-batches)
                    sched_step = state.step
                    sched = {k: float(fn(state.step, total_steps)) for k, fn in schedules.items()}
                    if "weight_decay" in sched:  # a declared weight-decay schedule (DINO)
                        set_weight_decay(optimizer, sched["weight_decay"])
                batch: dict[str, Any] = {"views": views, **sched}
                if "labels" in needs:
                    batch["labels"] = labels.to(device, non_blocking=True)
                if "indices" in needs:
                    batch["indices"] = indices.to(device, non_blocking=True)
                with accelerator.accumulate(model):
                    out_ = model(batch)
                    loss = out_["loss"]
                    finite = torch.isfinite(loss.detach())
                    if cfg.on_nonfinite == "skip" and not _all_true(finite, accelerator):
                        logger.warning("non-finite loss at step %d (epoch %d, micro-batch %d): "
                                       "skipping the optimiser step", state.step, epoch, micro)
                        optimizer.zero_grad(set_to_none=True)
                    else:
                        # "stop": remember the first bad step on the device (no host sync
                        # here); it is checked before every log line and checkpoint
                        first_bad = torch.where(finite | (first_bad >= 0), first_bad,
                                                torch.full_like(first_bad, state.step))
                        accelerator.backward(loss)
                        if accelerator.sync_gradients:
                            drop_frozen_grads(optimizer, state.step)
                        if accelerator.sync_gradients and cfg.clip_grad_norm > 0:
                            accelerator.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                        # every scalar the method returns is logged (mean over the log window)
                        for k, v in out_.items():
                            if isinstance(v, torch.Tensor) and v.ndim == 0:
                                v = v.detach().float()
                                sums[k] = sums[k] + v if k in sums else v
                                counts[k] = counts.get(k, 0) + 1
                        last_out = out_
                state.micro_in_epoch = micro + 1
                if not accelerator.sync_gradients:
                    t_wait = time.perf_counter()
                    continue

                # ---- one optimiser step done ----
                state.step += 1
                state.images_seen += cfg.batch_size
                if state.micro_in_epoch >= micro_per_epoch:
                    state.epoch, state.micro_in_epoch = epoch + 1, 0
                if progress is not None:
                    progress.update(1)
                log_now = state.step % cfg.log_every == 0 or state.step == last_step
                save_now = bool(cfg.save_every_steps) and state.step % cfg.save_every_steps == 0
                if log_now or save_now or state.step == last_step:
                    check_finite(first_bad)
                if log_now:
                    now = time.perf_counter()
                    record = _log_record(state, steps_per_epoch, lr, sched, sums, counts,
                                         last_out, accelerator, now - t_last,
                                         state.images_seen - images_last, wait_time)
                    metrics.write(record)
                    result.last_metrics = record
                    if cfg.report_to != "none":
                        accelerator.log(record, step=state.step)
                    if progress is not None:
                        progress.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}",
                                             img_s=f"{record['images_per_s']:.1f}")
                    sums, counts = {}, {}
                    t_last, images_last, wait_time = now, state.images_seen, 0.0
                if save_now:
                    save()
                # one process: the flag itself; several: agree every 10 steps (a collective)
                if world == 1 or log_now or state.step % 10 == 0:
                    if _any_true(stop.check() is not None, accelerator):
                        check_finite(first_bad)
                        status = "interrupted"
                        break
                if cfg.max_steps and state.step >= cfg.max_steps:
                    status = "max_steps"
                    break
                t_wait = time.perf_counter()

            if state.epoch != epoch + 1:
                if status != "completed":
                    break  # stopped mid-epoch
                raise RuntimeError(f"the loader ended after {state.micro_in_epoch} of "
                                   f"{micro_per_epoch} micro-batches in epoch {epoch}")
            if status == "interrupted":
                break
            check_finite(first_bad)
            if monitor is not None and (epoch + 1) % cfg.knn_every == 0:
                run_knn(f"epoch {epoch + 1}")
            if (cfg.save_every_epochs and (epoch + 1) % cfg.save_every_epochs == 0
                    and ckpt.last_saved_step != state.step):
                save()
    if monitor is not None and status != "interrupted" and \
            (not result.knn_history or result.knn_history[-1][0] != state.step):
        run_knn("end")
    if status == "interrupted":
        result.stop_reason = stop.reason or "a signal on another process"
    return finish(status)


def _nothing_to_do(cfg: TrainConfig, state: TrainState, last_step: int, total_steps: int,
                   out: Path, resume_path: Path, accelerator: Any, module: nn.Module,
                   pipeline: Any, recipe: str) -> TrainResult:
    """A resume of a run that already reached ``--max-steps`` or its last epoch (a requeued job).

    Trains nothing and rewrites nothing (checkpoints, metrics.jsonl, config.json, encoder.pt);
    only a missing ``encoder.pt`` or ``run_state.json`` that does not say "completed" at this
    step (a run killed between its last checkpoint and its end) is written.
    """
    is_main = accelerator.is_main_process
    done_all = state.step >= total_steps or state.epoch >= cfg.epochs
    reason = "epochs" if done_all else "max_steps"
    if done_all:
        logger.info("nothing to train: the run in %s reached its last epoch (step %d); nothing "
                    "was changed", out, state.step)
    else:
        logger.info("nothing to train: the run in %s is at step %d and --max-steps is %d; "
                    "nothing was changed. Pass a larger --max-steps to continue it", out,
                    state.step, cfg.max_steps)
    result = TrainResult(output_dir=out, status="completed" if done_all else "max_steps",
                         step=state.step, epoch=state.epoch, checkpoint=resume_path)
    encoder_path = out / ENCODER_FILE
    if is_main:
        if _encoder_step(encoder_path) != state.step:
            write_encoder(out, cfg, module, pipeline, recipe, state.step)
            logger.info("wrote the missing %s (step %d)", encoder_path, state.step)
        previous = read_run_state(out) or {}
        if previous.get("state") != "completed" or previous.get("step") != state.step:
            write_run_state(out, "completed", step=state.step, last_step=last_step,
                            reason=reason, encoder=_rel(encoder_path, out), exit_code=0)
    result.encoder_path = encoder_path
    accelerator.wait_for_everyone()
    return result


def _encoder_step(path: Path) -> int | None:
    """The ``step`` recorded in an ``encoder.pt`` (None if absent or unreadable)."""
    try:
        return EncoderRecord.load(path, mmap=True).step
    except (RecordError, OSError):  # absent or unreadable: rewritten
        return None


def _all_true(flag: torch.Tensor, accelerator: Any) -> bool:
    """``flag`` (a 0-d bool tensor) on every process (one host sync, a collective if several)."""
    v = flag.float().reshape(1)
    if accelerator.num_processes > 1:
        v = accelerator.reduce(v, "min")
    return bool(v.item())


def _method_inputs(method: nn.Module) -> tuple[tuple[str, ...], dict[str, Callable]]:
    """The method's ``needs`` and ``schedules()``; a need the loader cannot provide (and no
    schedule gives) is an error before anything trains."""
    from contrastive.methods.base import BATCH_KEYS

    schedules = dict(method.schedules()) if hasattr(method, "schedules") else {}
    needs = tuple(getattr(method, "needs", ("views",)))
    unknown = sorted(set(needs) - set(BATCH_KEYS) - set(schedules))
    if unknown:
        raise ValueError(f"{type(method).__name__} needs batch key(s) {unknown} that the image "
                         f"training loop does not provide; it provides {sorted(BATCH_KEYS)} and "
                         f"the method's schedules {sorted(schedules)}")
    clash = sorted(set(schedules) & set(BATCH_KEYS))
    if clash:
        raise ValueError(f"{type(method).__name__}: schedule name(s) {clash} clash with the "
                         "loader's batch keys; rename them")
    return needs, schedules


def _any_true(flag: bool, accelerator: Any) -> bool:
    """A Python flag set on any process (a collective when there are several)."""
    if accelerator.num_processes == 1:
        return flag
    v = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(v, "max").item())


def _log_record(state: TrainState, steps_per_epoch: int, lr: float, sched: dict[str, float],
                sums: dict[str, torch.Tensor], counts: dict[str, int],
                last_out: dict[str, torch.Tensor], accelerator: Any, seconds: float,
                images: int, wait: float) -> dict[str, Any]:
    """One metrics.jsonl record: means since the last record, averaged over processes."""
    keys = sorted(sums)
    means = {}
    if keys:
        vec = torch.stack([sums[k] / counts[k] for k in keys])
        if accelerator.num_processes > 1:
            vec = accelerator.reduce(vec, "mean")
        means = dict(zip(keys, vec.tolist()))
    emb_std = None
    emb = last_out.get("embeddings")
    if emb is not None and emb.shape[0] > 1:
        emb_std = F.normalize(emb.float(), dim=1).std(dim=0).mean().item()
    record = {
        "step": state.step,
        "epoch": round(state.step / steps_per_epoch, 4),
        **{k: round(v, 6) for k, v in means.items()},
        "lr": lr,
        **sched,  # the method's schedules at the last step of the window
        "embedding_std": None if emb_std is None else round(emb_std, 6),
        "images_per_s": round(images / max(seconds, 1e-9), 2),
        "data_wait_frac": round(wait / max(seconds, 1e-9), 4),
        "time": round(time.time(), 3),
    }
    if "loss" in record and not math.isfinite(record["loss"]):
        record["loss"] = None
    return record
