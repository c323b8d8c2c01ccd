"""The training loop, told top to bottom: set-up, resume, the step, the run log, the end.

``train(cfg, build_method, build_pipeline)``:

1. checks the inputs (precision vs device, output folder vs ``--resume``, batch divisibility)
   before anything is built, so bad input fails in seconds;
2. sets up (:mod:`~contrastive.engine.setup`): the data (deterministic global order, per-sample
   seeded augmentation, optional batched augmentation on the device), the kNN monitor, the
   method and its optimiser (``prepare``d), the online probe, the checkpoint manager;
3. resumes (signature + config checked before loading, fingerprints verified after);
4. loops (:mod:`~contrastive.engine.step`): ``lr = lr_at(step)``, the method's schedules once
   per optimiser step, ``out = model(batch)`` with ``batch`` = the method's ``needs``
   (``views``, ``labels``, ``indices``) plus the schedule values (see
   :mod:`contrastive.methods`), backward, drop the gradients of groups still frozen, clip,
   step; the online probe (``--online-probe``) learns from detached features;
5. keeps the run log (:mod:`~contrastive.engine.run_log`): ``metrics.jsonl`` every
   ``log_every`` steps (every 0-d tensor the method returns, as a window mean), checkpoints
   every ``save_every_steps`` steps and at epoch ends, the kNN monitor every ``knn_every``
   epochs; stops cleanly on SIGTERM/SIGINT, its launcher's exit (:mod:`~contrastive.engine
   .stop`), ``max_steps`` or the last epoch (a resume with nothing left to train changes
   nothing);
6. ends: ``encoder.pt`` (:class:`contrastive.records.EncoderRecord`) and ``run_state.json``
   (running / stopped / completed / failed, see :mod:`contrastive.engine.run_state`).

Everything random is a function of ``cfg.seed`` and the position in the run, so a resumed run
continues exactly as the uninterrupted one (see :mod:`contrastive.engine.loader`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contrastive.engine.checkpoint import (
    CheckpointManager,
    TrainState,
    check_compatible,
    read_meta,
    resolve_resume,
)
from contrastive.engine.config import TrainConfig, config_to_dict
from contrastive.engine.extras import extra_keys
from contrastive.engine.loader import start_workers
from contrastive.engine.monitor import KNNMonitor, encoder_of, feature_fn
from contrastive.engine.optim import set_lr, set_weight_decay
from contrastive.engine.probe import OnlineProbe
from contrastive.engine.run_folder import check_output_dir
from contrastive.engine.run_log import MetricsLog, ScalarWindow, log_record, record_failure, rel
from contrastive.engine.run_state import EXIT_STOPPED, read_run_state, write_run_state
from contrastive.engine.schedules import lr_at
from contrastive.engine.setup import (
    Model,
    TrainData,
    build_data,
    build_knn_monitor,
    build_model,
    build_probe,
    check_fresh_output_dir,
    make_accelerator,
    resolve_run_precision,
)
from contrastive.engine.step import (
    NonFiniteGuard,
    NonFiniteLossError,
    any_true,
    make_batch,
    optimisation_step,
    prepare_views,
)
from contrastive.engine.stop import StopRequests, watch_parent
from contrastive.records import CHECKPOINTS, CONFIG_FILE, ENCODER_FILE, EncoderRecord, RecordError

__all__ = ["train", "TrainResult", "NonFiniteLossError", "make_accelerator", "write_encoder"]

logger = logging.getLogger(__name__)


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
    check_fresh_output_dir(out, cfg.resume)  # before any process writes anything
    precision, why = resolve_run_precision(cfg, out)  # once; a resume keeps its recorded one
    cfg = copy.copy(cfg)
    cfg.mixed_precision = precision  # config.json and the checkpoints record the resolved value
    accelerator = make_accelerator(cfg, out)
    is_main = accelerator.is_main_process
    if not is_main:  # nothing printed from other ranks
        logging.getLogger().setLevel(logging.ERROR)
    else:
        logger.info("precision: %s (%s)", "fp32" if precision == "no" else precision, why)
    world, accum = accelerator.num_processes, cfg.grad_accum_steps
    if cfg.batch_size % (world * accum):
        raise ValueError(f"--batch-size {cfg.batch_size} must be divisible by processes x "
                         f"--grad-accum-steps = {world} x {accum}")
    accelerator.wait_for_everyone()
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
    try:  # from here on the folder is this run's: its run_state.json says how the run ended
        with StopRequests(watch_parent(cfg.stop_if_orphaned)) as stop:
            return _train(cfg, build_method, build_pipeline, recipe, out, accelerator, stop,
                          precision_reason=why)
    except BaseException as exc:
        if is_main:
            record_failure(out, exc)
        raise


def _train(cfg: TrainConfig, build_method: Callable[[TrainConfig], nn.Module],
           build_pipeline: Callable[[TrainConfig], Any], recipe: str, out: Path,
           accelerator: Any, stop: StopRequests, *, precision_reason: str = "") -> TrainResult:
    """The body of :func:`train` once the output folder and the accelerator exist."""
    # ---- set-up ---------------------------------------------------------------------------
    pipeline = build_pipeline(cfg)
    data = build_data(cfg, pipeline, accelerator)
    knn = build_knn_monitor(cfg, pipeline, accelerator.num_processes)
    m = build_model(cfg, build_method, accelerator, extra_keys(data.train_set))
    probe = build_probe(cfg, m.module, data.train_set, accelerator.device)
    config = {"recipe": recipe, **config_to_dict(cfg)}
    state = TrainState()
    ckpt = CheckpointManager(accelerator, m.model, m.optimizer, state, out / CHECKPOINTS,
                             keep_last=cfg.keep_last,
                             meta={"config": config, "signature": m.signature, "recipe": recipe},
                             extras={"probe": probe} if probe is not None else None)
    ckpt.cleanup_partial()

    # ---- resume ---------------------------------------------------------------------------
    resume_path = _resume(cfg, out, ckpt, m, config, accelerator.num_processes)
    if resume_path is not None and (state.step >= data.last_step or state.epoch >= cfg.epochs):
        return _nothing_to_do(cfg, state, data, out, resume_path, accelerator, m.module,
                              pipeline, recipe)
    if resume_path is None:  # a fresh run: give each process its own random stream from here on
        from accelerate.utils import set_seed

        set_seed(cfg.seed, device_specific=True)

    # ---- the run: log its start, train, end it ---------------------------------------------
    run = _Run(cfg, recipe, out, accelerator, pipeline, data, m, state, ckpt, stop, knn, probe,
               resume_path)
    run.log_start(config, precision_reason)
    if knn is not None and cfg.knn_at_start and resume_path is None:
        run.measure_knn("start")
    return run.finish(run.train_epochs())


def _resume(cfg: TrainConfig, out: Path, ckpt: CheckpointManager, m: Model,
            config: dict[str, Any], world: int) -> Path | None:
    """Load the checkpoint ``--resume`` names (after checking that it fits this run); None for
    a new run."""
    resume_path = resolve_resume(cfg.resume, out)
    if cfg.resume == "auto" and resume_path is None:
        logger.info("--resume auto: no checkpoint in %s, starting a new run", out / CHECKPOINTS)
    if resume_path is None:
        return None
    changes = check_compatible(read_meta(resume_path), m.signature, config, world_size=world,
                               allow_config_change=cfg.allow_config_change, path=resume_path)
    for c in changes:
        logger.warning("resuming with a changed setting: %s", c)
    ckpt.load(resume_path)
    logger.info("resumed from %s at step %d (epoch %d, micro-batch %d)", resume_path,
                ckpt.state.step, ckpt.state.epoch, ckpt.state.micro_in_epoch)
    return resume_path


class _Run:
    """One call's training: its pieces, and the named parts of the loop in reading order."""

    def __init__(self, cfg: TrainConfig, recipe: str, out: Path, accelerator: Any, pipeline: Any,
                 data: TrainData, m: Model, state: TrainState, ckpt: CheckpointManager,
                 stop: StopRequests, knn: KNNMonitor | None, probe: OnlineProbe | None,
                 resume_path: Path | None) -> None:
        self.cfg, self.recipe, self.out, self.acc = cfg, recipe, out, accelerator
        self.pipeline, self.data, self.m, self.state, self.ckpt = pipeline, data, m, state, ckpt
        self.stop, self.knn, self.probe, self.resume_path = stop, knn, probe, resume_path
        self.is_main = accelerator.is_main_process
        self.start_step = state.step
        self.result = TrainResult(output_dir=out, status="completed", step=state.step,
                                  epoch=state.epoch, checkpoint=resume_path)
        self.metrics = MetricsLog(out / "metrics.jsonl", self.is_main,
                                  state.step if resume_path is not None else None)
        self.window = ScalarWindow()
        self.guard = NonFiniteGuard(accelerator.device)

    # ---- the run log --------------------------------------------------------------------------

    def log_start(self, config: dict[str, Any], precision_reason: str = "") -> None:
        """config.json (with the values resolved at run time), trackers, run_state = running."""
        cfg, acc, data = self.cfg, self.acc, self.data
        world = acc.num_processes
        resolved = {
            "peak_lr": self.m.peak_lr, "steps_per_epoch": data.steps_per_epoch,
            "total_steps": data.total_steps, "world_size": world,
            "per_process_micro_batch": cfg.batch_size // (world * cfg.grad_accum_steps),
            "mixed_precision": acc.mixed_precision, "precision_reason": precision_reason,
            "device": str(acc.device),
            "batched_augment": data.device_fn is not None, "train_images": len(data.train_set),
            "torch": torch.__version__, "command": " ".join(sys.argv),
            "encoder_kwargs": cfg.encoder_options(),  # evaluation rebuilds the encoder with these
        }
        if self.is_main:
            (self.out / CONFIG_FILE).write_text(json.dumps({**config, "resolved": resolved},
                                                           indent=1))
            logger.info("training %s: %d images, %d steps/epoch x %d epochs, global batch %d on "
                        "%d process(es), lr %.4g, precision %s, augmentation %s", self.recipe,
                        len(data.train_set), data.steps_per_epoch, cfg.epochs, cfg.batch_size,
                        world, self.m.peak_lr, acc.mixed_precision,
                        "batched on device" if data.device_fn is not None else "per image")
        if cfg.report_to != "none":
            acc.init_trackers(self.recipe, config={k: v for k, v in config.items()
                                                   if isinstance(v, (int, float, str, bool))})
        if self.is_main:
            write_run_state(self.out, "running", step=self.state.step,
                            last_step=data.last_step, checkpoint=rel(self.resume_path, self.out))

    def log_step(self, lr: float, sched: dict[str, float], seconds: float, images: int,
                 wait: float) -> dict[str, Any]:
        """One metrics.jsonl record for the window that ends at this step."""
        record = log_record(self.state.step, self.data.steps_per_epoch, lr, sched,
                            self.window.means(self.acc), self.window.last, seconds, images, wait)
        if self.probe is not None:
            top1 = self.probe.pop_top1(self.acc)
            record["probe_top1"] = None if top1 is None else round(top1, 4)
        self.metrics.write(record)
        self.result.last_metrics = record
        if self.cfg.report_to != "none":
            self.acc.log(record, step=self.state.step)
        return record

    def measure_knn(self, tag: str) -> None:
        """The kNN monitor's top-1, in metrics.jsonl as a record of its own."""
        assert self.knn is not None
        model, state = self.m.model, self.state
        model.eval()
        try:
            top1 = self.knn(feature_fn(self.m.module, self.cfg.knn_feature), self.acc,
                            channels_last=self.cfg.channels_last)
        finally:
            model.train()
        self.result.knn_top1 = top1
        self.result.knn_history.append((state.step, top1))
        self.metrics.write({"step": state.step,
                            "epoch": round(state.step / self.data.steps_per_epoch, 4),
                            "knn_top1": top1, "knn_when": tag})
        logger.info("kNN top-1 (%s, step %d): %.2f %%", tag, state.step, top1)
        if self.cfg.report_to != "none":
            self.acc.log({"knn_top1": top1}, step=state.step)

    def save(self) -> Path:
        path = self.ckpt.save()
        self.result.checkpoint = path
        return path

    def check_finite(self) -> None:
        self.guard.check(self.acc, self.ckpt.last_saved_step, self.out / CHECKPOINTS)

    # ---- the loop -----------------------------------------------------------------------------

    def train_epochs(self) -> str:
        """Train until the last epoch, ``--max-steps`` or a stop request; returns the status
        ("completed", "max_steps" or "interrupted")."""
        cfg, acc, data, state, m = self.cfg, self.acc, self.data, self.state, self.m
        device, rank, world = acc.device, acc.process_index, acc.num_processes
        accum = cfg.grad_accum_steps
        m.model.train()
        progress = None
        if self.is_main and cfg.progress:
            from tqdm.auto import tqdm

            progress = tqdm(total=data.last_step, initial=state.step, desc=self.recipe,
                            unit="step", dynamic_ncols=True, mininterval=1.0)
        sched_step, sched, lr = -1, {}, 0.0
        t_last, images_last, wait_time = time.perf_counter(), state.images_seen, 0.0
        status = "completed"
        if any_true(self.stop.check() is not None, acc):  # a signal during the set-up
            status = "interrupted"
        with progress or contextlib.nullcontext():
            while state.epoch < cfg.epochs and status == "completed":
                epoch = state.epoch
                data.sampler.set_epoch(epoch)
                skip = state.micro_in_epoch
                batches = acc.skip_first_batches(data.loader, skip) if skip else data.loader
                t_wait = time.perf_counter()
                # workers start with SIGTERM/SIGINT held back, then ignore them (see loader.py)
                for micro, sample in enumerate(start_workers(batches), start=skip):
                    wait_time += time.perf_counter() - t_wait
                    # ---- the step: lr and schedules, the batch, forward/backward/update
                    lr = lr_at(state.step, steps_per_epoch=data.steps_per_epoch,
                               epochs=cfg.epochs, peak=m.peak_lr, schedule=cfg.lr_schedule,
                               warmup_epochs=cfg.warmup_epochs, min_lr=cfg.min_lr,
                               milestones=cfg.lr_milestones, gamma=cfg.lr_gamma,
                               per=cfg.schedule_per)
                    set_lr(m.optimizer, lr)
                    if sched_step != state.step:  # once per optimiser step (all micro-batches)
                        sched_step = state.step
                        sched = {k: float(fn(state.step, data.total_steps))
                                 for k, fn in m.schedules.items()}
                        if "weight_decay" in sched:  # a declared weight-decay schedule (DINO)
                            set_weight_decay(m.optimizer, sched["weight_decay"])
                    views = prepare_views(sample[0], cfg, device, data.device_fn,
                                          step=state.step, micro=micro % accum, rank=rank)
                    batch = make_batch(views, sample, m.needs, sched, device)
                    optimisation_step(m.model, batch, m.optimizer, acc, cfg, state.step,
                                      self.guard, self.window, m.after_step)
                    if self.probe is not None:
                        with acc.autocast():
                            feats = self.probe.features(encoder_of(m.module), views[0])
                        self.probe.step(feats, sample[1].to(device, non_blocking=True), acc)
                    state.micro_in_epoch = micro + 1
                    if not acc.sync_gradients:
                        t_wait = time.perf_counter()
                        continue

                    # ---- one optimiser step done: count, log, save, stop?
                    state.step += 1
                    state.images_seen += cfg.batch_size
                    if state.micro_in_epoch >= data.micro_per_epoch:
                        state.epoch, state.micro_in_epoch = epoch + 1, 0
                    if progress is not None:
                        progress.update(1)
                    log_now = state.step % cfg.log_every == 0 or state.step == data.last_step
                    save_now = bool(cfg.save_every_steps) and \
                        state.step % cfg.save_every_steps == 0
                    if log_now or save_now or state.step == data.last_step:
                        self.check_finite()
                    if log_now:
                        now = time.perf_counter()
                        record = self.log_step(lr, sched, now - t_last,
                                               state.images_seen - images_last, wait_time)
                        if progress is not None:
                            progress.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}",
                                                 img_s=f"{record['images_per_s']:.1f}")
                        t_last, images_last, wait_time = now, state.images_seen, 0.0
                    if save_now:
                        self.save()
                    # one process: the flag itself; several: agree every 10 steps (a collective)
                    if world == 1 or log_now or state.step % 10 == 0:
                        if any_true(self.stop.check() is not None, acc):
                            self.check_finite()
                            status = "interrupted"
                            break
                    if cfg.max_steps and state.step >= cfg.max_steps:
                        status = "max_steps"
                        break
                    t_wait = time.perf_counter()

                # ---- the epoch's end: kNN, checkpoint
                if state.epoch != epoch + 1:
                    if status != "completed":
                        break  # stopped mid-epoch
                    raise RuntimeError(f"the loader ended after {state.micro_in_epoch} of "
                                       f"{data.micro_per_epoch} micro-batches in epoch {epoch}")
                if status == "interrupted":
                    break
                self.check_finite()
                if self.knn is not None and (epoch + 1) % cfg.knn_every == 0:
                    self.measure_knn(f"epoch {epoch + 1}")
                if (cfg.save_every_epochs and (epoch + 1) % cfg.save_every_epochs == 0
                        and self.ckpt.last_saved_step != state.step):
                    self.save()
        history = self.result.knn_history
        if self.knn is not None and status != "interrupted" and \
                (not history or history[-1][0] != state.step):
            self.measure_knn("end")
        if status == "interrupted":
            self.result.stop_reason = self.stop.reason or "a signal on another process"
        return status

    # ---- the end ------------------------------------------------------------------------------

    def finish(self, status: str) -> TrainResult:
        """The last checkpoint, encoder.pt and run_state.json."""
        state, result, out = self.state, self.result, self.out
        saved = self.ckpt.last_saved_step if self.ckpt.last_saved_step is not None else (
            self.start_step if self.resume_path is not None else None)
        if saved != state.step:
            self.save()
        result.status, result.step, result.epoch = status, state.step, state.epoch
        result.steps_trained = state.step - self.start_step
        if self.is_main:
            result.encoder_path = write_encoder(out, self.cfg, self.m.module, self.pipeline,
                                                self.recipe, state.step)
            logger.info("%s at step %d: encoder weights in %s", status, state.step,
                        result.encoder_path)
            if status == "interrupted":
                write_run_state(out, "stopped", step=state.step, last_step=self.data.last_step,
                                reason=result.stop_reason, resumable=True,
                                checkpoint=rel(result.checkpoint, out), exit_code=EXIT_STOPPED)
            else:
                write_run_state(out, "completed", step=state.step, last_step=self.data.last_step,
                                reason="max_steps" if status == "max_steps" else "epochs",
                                encoder=rel(result.encoder_path, out), exit_code=0)
        self.acc.wait_for_everyone()
        if self.cfg.report_to != "none":
            self.acc.end_training()
        return result


def write_encoder(out: Path, cfg: TrainConfig, module: nn.Module, pipeline: Any, recipe: str,
                  step: int) -> Path:
    """``<out>/encoder.pt``: the method's backbone as a :class:`~contrastive.records.EncoderRecord`
    with the ``create_encoder`` kwargs, the crop size and the pipeline's normalisation (which
    evaluation uses by default)."""
    record = EncoderRecord.from_module(
        encoder_of(module), cfg.encoder, encoder_kwargs=cfg.encoder_options(),
        mean=getattr(pipeline, "mean", None), std=getattr(pipeline, "std", None),
        image_size=cfg.image_size, step=step, recipe=recipe, method=type(module).__name__)
    return record.save(out / ENCODER_FILE)


def _nothing_to_do(cfg: TrainConfig, state: TrainState, data: TrainData, out: Path,
                   resume_path: Path, accelerator: Any, module: nn.Module, pipeline: Any,
                   recipe: str) -> TrainResult:
    """A resume of a run that already reached ``--max-steps`` or its last epoch (a requeued job).

    Trains nothing and rewrites nothing (checkpoints, metrics.jsonl, config.json, encoder.pt);
    only a missing ``encoder.pt`` or ``run_state.json`` that does not say "completed" at this
    step (a run killed between its last checkpoint and its end) is written.
    """
    done_all = state.step >= data.total_steps or state.epoch >= cfg.epochs
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
    if accelerator.is_main_process:
        if _encoder_step(encoder_path) != state.step:
            write_encoder(out, cfg, module, pipeline, recipe, state.step)
            logger.info("wrote the missing %s (step %d)", encoder_path, state.step)
        previous = read_run_state(out) or {}
        if previous.get("state") != "completed" or previous.get("step") != state.step:
            write_run_state(out, "completed", step=state.step, last_step=data.last_step,
                            reason="epochs" if done_all else "max_steps",
                            encoder=rel(encoder_path, out), exit_code=0)
    result.encoder_path = encoder_path
    accelerator.wait_for_everyone()
    return result


def _encoder_step(path: Path) -> int | None:
    """The ``step`` recorded in an ``encoder.pt`` (None if absent or unreadable)."""
    try:
        return EncoderRecord.load(path, mmap=True).step
    except (RecordError, OSError):  # absent or unreadable: rewritten
        return None
