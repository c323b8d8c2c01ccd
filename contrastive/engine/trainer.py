"""The training loop, told top to bottom: set-up, resume, the step, the run log, the end.

``train(cfg, build_method, build_pipeline)`` (images) or ``train(cfg, build_method,
adapter=...)`` (any data: :mod:`~contrastive.engine.kits`):

1. checks the inputs (precision vs device, output folder vs ``--resume``, batch divisibility)
   before anything is built, so bad input fails in seconds;
2. sets up (:mod:`~contrastive.engine.setup`): the data adapter's training set under the
   engine's deterministic global order (per-sample seeded randomness), the adapter's evaluators
   (:mod:`~contrastive.engine.evaluators`: kNN for images, zero-shot and retrieval for
   image-text), the method and its optimiser (``prepare``d), the adapter's step hook (images:
   the online probe and the images counter), the checkpoint manager;
3. resumes (signature + config checked before loading, fingerprints verified after);
4. loops (:mod:`~contrastive.engine.step`): ``lr = lr_at(step)``, the method's schedules once
   per optimiser step, ``out = model(batch)`` with ``batch`` = the adapter's mapping of the
   method's ``needs`` (``views``, ``labels``, ``indices``, per-sample fields such as
   ``input_ids``) plus the schedule values (see :mod:`contrastive.methods`), backward, drop the
   gradients of groups still frozen, clip, step, the method's post-step hook; then the
   adapter's step hook (:class:`~contrastive.engine.kits.base.StepHook`: the online probe
   learns from detached features);
5. keeps the run log (:mod:`~contrastive.engine.run_log`): ``metrics.jsonl`` every
   ``log_every`` steps (every 0-d tensor the method returns, as a window mean, and the
   adapter's throughput; each record also to the ``--report-to`` trackers,
   :mod:`~contrastive.engine.trackers`), checkpoints every ``save_every_steps`` steps and at
   epoch ends, each evaluator every N epochs or steps (``--keep-best``: the artefacts at the
   best value); stops cleanly on SIGTERM/SIGINT, its launcher's exit (:mod:`~contrastive.engine.stop`),
   ``max_steps`` or the end of the budget (``--epochs`` or ``--steps``; a resume with nothing
   left to train changes nothing);
6. ends: the kit's artefacts (:class:`~contrastive.engine.kits.base.Artefacts`, formats in
   :mod:`contrastive.records`: ``encoder.pt``; image-text runs also ``clip.pt``) and
   ``run_state.json`` (running / stopped / completed / failed, see
   :mod:`contrastive.engine.run_state`); the trackers get the curves and embedding pictures
   and are closed.

Everything random is a function of ``cfg.seed`` and the position in the run, so a resumed run
continues exactly as the uninterrupted one (see :mod:`contrastive.engine.loader`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
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
from contrastive.engine.config import RunConfig, config_to_dict
from contrastive.engine.evaluators import BestKeeper, Evaluator
from contrastive.engine.extras import extra_keys
from contrastive.engine.handoff import DataInfo
from contrastive.engine.kits.base import DataAdapter, StepHook
from contrastive.engine.kits.image import ImageAdapter, write_encoder
from contrastive.engine.loader import start_workers
from contrastive.engine.optim import optimizer_kernel, set_lr, set_weight_decay
from contrastive.engine.run_folder import check_output_dir
from contrastive.engine.run_log import (
    MetricsLog,
    ScalarWindow,
    Throughput,
    log_record,
    record_failure,
    rel,
)
from contrastive.engine.run_state import EXIT_STOPPED, read_run_state, write_run_state
from contrastive.engine.safe_state import kept_rng
from contrastive.engine.schedules import lr_at, warmup_warning
from contrastive.engine.setup import (
    Model,
    TrainData,
    build_data,
    build_model,
    check_fresh_output_dir,
    eager_evaluation,
    make_accelerator,
    resolve_run_precision,
)
from contrastive.engine.sharding import full_params
from contrastive.engine.step import (
    NonFiniteGuard,
    NonFiniteLossError,
    Updater,
    any_true,
    optimisation_step,
)
from contrastive.engine.stop import StopRequests, watch_parent
from contrastive.engine.trackers import Trackers, parse_report_to
from contrastive.records import BEST_DIR, CHECKPOINTS, CONFIG_FILE

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
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # all evaluators
    last_metrics: dict[str, Any] = field(default_factory=dict)
    steps_trained: int = 0  # optimiser steps this call took (0: a resume with nothing to do)
    stop_reason: str | None = None  # "SIGTERM", "SIGINT", "launcher exited (...)"

    @property
    def exit_code(self) -> int:
        """The process exit status for this result: 75 (stopped, resumable) or 0."""
        return EXIT_STOPPED if self.status == "interrupted" else 0

    def history(self, metric: str) -> list[tuple[int, float]]:
        """``(step, value)`` of every evaluation this call made that measured ``metric``
        (``knn_top1``, ``sts_spearman`` ...), in order."""
        return [(step, metrics[metric]) for step, metrics in self.evaluations if metric in metrics]

    def latest(self, metric: str) -> float | None:
        """The last value of ``metric`` this call measured, or None."""
        measured = self.history(metric)
        return measured[-1][1] if measured else None


def train(cfg: RunConfig, build_method: Callable[[Any, DataInfo], nn.Module],
          build_pipeline: Callable[[Any], Any] | None = None, *,
          adapter: DataAdapter[Any] | None = None, recipe: str = "custom") -> TrainResult:
    """Train ``build_method(cfg, data)`` on the run's data: images augmented by
    ``build_pipeline(cfg)``, or whatever the data ``adapter`` serves.

    ``build_method`` returns a method (:class:`contrastive.methods.Method`: ``forward(batch) ->
    dict`` with ``loss`` and metrics, ``needs``, ``schedules()``, ``param_groups()``, attribute
    ``encoder``); it is called after the adapter built the training set, with ``data`` the
    hand-off (:class:`~contrastive.engine.handoff.DataInfo`: step counts, batch geometry and the
    kit's tokenizer, task, teacher, classes, pipeline).
    ``build_pipeline`` returns a :class:`contrastive.augment.Pipeline` (per-image ``__call__``
    and ``split()`` for the batched path): the :class:`~contrastive.engine.kits.image.ImageAdapter`
    (give it or ``adapter``). See the module docstring for the steps.

    The kit reads and checks its input (``adapter.prepare(cfg)``: the image kit's ``--init``,
    the labelled-text kit's task and teacher) before the run folder exists.
    """
    if (build_pipeline is None) == (adapter is None):
        raise TypeError("train: give build_pipeline (images) or adapter, not both")
    cfg.validate()
    kit = kit_of(build_pipeline, adapter, cfg)
    kit.prepare(cfg)
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
            return _train(cfg, build_method, kit, recipe, out, accelerator, stop,
                          precision_reason=why)
    except BaseException as exc:
        if is_main:
            record_failure(out, exc)
        raise


def kit_of(build_pipeline: Callable[[Any], Any] | None, adapter: DataAdapter[Any] | None,
           cfg: RunConfig) -> DataAdapter[Any]:
    """The run's kit: ``adapter``, or the image kit's over ``build_pipeline(cfg)``."""
    if adapter is not None:
        return adapter
    assert build_pipeline is not None
    images: DataAdapter[Any] = ImageAdapter(build_pipeline(cfg))
    return images


def _train(cfg: RunConfig, build_method: Callable[[Any, DataInfo], nn.Module],
           adapter: DataAdapter[Any], recipe: str, out: Path, accelerator: Any,
           stop: StopRequests, *, precision_reason: str = "") -> TrainResult:
    """The body of :func:`train` once the output folder and the accelerator exist."""
    # ---- set-up ---------------------------------------------------------------------------
    data = build_data(cfg, adapter, accelerator)
    m = build_model(cfg, build_method, accelerator, data.info, extra_keys(data.train_set),
                    kit=adapter)  # image: --init, the memory format
    hook = adapter.step_hook(cfg, m.module, data.train_set, accelerator.device)  # image: probe
    evaluators = adapter.evaluators(cfg, accelerator.num_processes)
    best = BestKeeper(cfg.keep_best) if cfg.keep_best else None
    config = {"recipe": recipe, **config_to_dict(cfg)}
    state = TrainState()
    extras: dict[str, Any] = dict(hook.checkpointed) if hook is not None else {}
    if best is not None:
        extras["best"] = best
    ckpt = CheckpointManager(accelerator, m.model, m.optimizer, state, out / CHECKPOINTS,
                             keep_last=cfg.keep_last,
                             meta={"config": config, "signature": m.signature, "recipe": recipe},
                             extras=extras or None)
    ckpt.cleanup_partial()

    # ---- resume ---------------------------------------------------------------------------
    resume_path = _resume(cfg, out, ckpt, m, config, accelerator.num_processes)
    if resume_path is not None and (state.step >= data.last_step or state.epoch >= data.epochs):
        return _nothing_to_do(cfg, state, data, out, resume_path, accelerator, m.module,
                              adapter, recipe)
    if resume_path is None:  # a fresh run: give each process its own random stream from here on
        from accelerate.utils import set_seed

        set_seed(cfg.seed, device_specific=True)

    # ---- the run: log its start, train, end it ---------------------------------------------
    run = _Run(cfg, recipe, out, accelerator, adapter, data, m, state, ckpt, stop, evaluators,
               hook, best, resume_path)
    try:
        run.log_start(config, precision_reason)
        if resume_path is None:
            for ev in evaluators:
                if ev.at_start:
                    run.measure(ev, "start")
        return run.finish(run.train_epochs())
    except BaseException:
        run.trackers.finish(step=state.step, status="failed")  # marked failed, not left open
        raise


def _resume(cfg: RunConfig, out: Path, ckpt: CheckpointManager, m: Model,
            config: dict[str, Any], world: int) -> Path | None:
    """Load the checkpoint ``--resume`` names (after checking that it fits this run); None for
    a new run."""
    resume_path = resolve_resume(cfg.resume, out)
    if cfg.resume == "auto" and resume_path is None:
        logger.info("--resume auto: no checkpoint in %s, starting a new run", out / CHECKPOINTS)
    if resume_path is None:
        return None
    defaults = {"recipe": config["recipe"], **config_to_dict(type(cfg)())}
    changes = check_compatible(read_meta(resume_path), m.signature, config, world_size=world,
                               allow_config_change=cfg.allow_config_change, path=resume_path,
                               defaults=defaults)
    for c in changes:
        logger.warning("resuming with a changed setting: %s", c)
    ckpt.load(resume_path)
    logger.info("resumed from %s at step %d (epoch %d, micro-batch %d)", resume_path,
                ckpt.state.step, ckpt.state.epoch, ckpt.state.micro_in_epoch)
    return resume_path


class _Run:
    """One call's training: its pieces, and the named parts of the loop in reading order."""

    def __init__(self, cfg: Any, recipe: str, out: Path, accelerator: Any, adapter: DataAdapter[Any],
                 data: TrainData, m: Model, state: TrainState, ckpt: CheckpointManager,
                 stop: StopRequests, evaluators: list[Evaluator], hook: StepHook | None,
                 best: BestKeeper | None, resume_path: Path | None) -> None:
        self.cfg, self.recipe, self.out, self.acc = cfg, recipe, out, accelerator
        self.adapter, self.data, self.m, self.state, self.ckpt = adapter, data, m, state, ckpt
        self.stop, self.evaluators, self.hook = stop, evaluators, hook
        self.best, self.resume_path = best, resume_path
        self.best_unsaved = False  # a new best after this step's checkpoint was written
        self.last_eval: dict[str, int] = {}  # evaluator name -> step of its last measurement
        self.is_main = accelerator.is_main_process
        self.start_step = state.step
        self.result = TrainResult(output_dir=out, status="completed", step=state.step,
                                  epoch=state.epoch, checkpoint=resume_path)
        self.metrics = MetricsLog(out / "metrics.jsonl", self.is_main,
                                  state.step if resume_path is not None else None)
        self.window = ScalarWindow()
        self.trackers = Trackers(accelerator, out, parse_report_to(cfg.report_to))
        self.guard = NonFiniteGuard(accelerator.device)
        self.updater = Updater(m.model, m.optimizer, accelerator,  # resolved once
                               method=m.module, clips=cfg.clip_grad_norm > 0)
        self.lr_at = functools.partial(  # the lr schedule, a function of the step alone
            lr_at, steps_per_epoch=data.steps_per_epoch, epochs=cfg.epochs, peak=m.peak_lr,
            schedule=cfg.lr_schedule, warmup_epochs=cfg.warmup_epochs, min_lr=cfg.min_lr,
            milestones=cfg.lr_milestones, gamma=cfg.lr_gamma, per=cfg.schedule_per,
            warmup_steps=cfg.warmup_steps, total_steps=cfg.steps)
        self.lr, self.values_step = 0.0, -1  # this step's lr, and the step it was computed at
        self.sched: dict[str, float] = {}  # the method's schedule values at that step
        self.speed = Throughput(cfg.batch_size)
        self.progress: Any = None  # the progress bar (--progress, main process)

    # ---- the run log --------------------------------------------------------------------------

    def log_start(self, config: dict[str, Any], precision_reason: str = "") -> None:
        """config.json (with the values resolved at run time), the trackers (continued on a
        resume, :mod:`~contrastive.engine.trackers`), run_state = running."""
        cfg, acc, data = self.cfg, self.acc, self.data
        world = acc.num_processes
        resolved = {
            "peak_lr": self.m.peak_lr, "steps_per_epoch": data.steps_per_epoch,
            "total_steps": data.total_steps, "world_size": world,
            "per_process_micro_batch": cfg.batch_size // (world * cfg.grad_accum_steps),
            "grad_cache_chunk": self.m.cache.chunk if self.m.cache is not None else 0,
            "mixed_precision": acc.mixed_precision, "precision_reason": precision_reason,
            "optimizer_kernel": optimizer_kernel(self.m.optimizer),
            "device": str(acc.device),
            # the submodule encoder.pt holds (Method.evaluated): what the eval tools read from a
            # checkpoint folder of this run
            "evaluated": str(getattr(self.m.module, "evaluated", "encoder")),
            "torch": torch.__version__, "command": " ".join(sys.argv),
            **self.adapter.resolved(),  # e.g. encoder_kwargs: evaluation rebuilds the encoder
        }
        if self.is_main:
            (self.out / CONFIG_FILE).write_text(json.dumps({**config, "resolved": resolved},
                                                           indent=1))
            logger.info("training %s: %d %s, %d steps/epoch, %d steps, global batch %d on %d "
                        "process(es), lr %.4g, precision %s, %s", self.recipe,
                        len(data.train_set), "examples" if self.adapter.unit == "tokens"
                        else self.adapter.unit, data.steps_per_epoch,
                        data.total_steps, cfg.batch_size, world, self.m.peak_lr,
                        acc.mixed_precision, self.adapter.describe())
            odd_warmup = warmup_warning(steps=cfg.steps, steps_per_epoch=data.steps_per_epoch,
                                        warmup_epochs=cfg.warmup_epochs,
                                        warmup_steps=cfg.warmup_steps)
            if odd_warmup is not None:  # e.g. a recipe's 10 warm-up epochs kept by --steps 100
                logger.log(*odd_warmup)
            spans = getattr(self.m.module, "step_spans", None)  # a Method's; none otherwise
            for name, span in (spans() if callable(spans) else {}).items():
                if span >= data.total_steps:
                    logger.warning("the method's %s %d >= the run's %d steps: it covers the "
                                   "whole run (a recipe's epochs x %d steps/epoch?); lower the "
                                   "recipe's flag for it", name, span, data.total_steps,
                                   data.steps_per_epoch)
        self.trackers.start(self.recipe, config,
                            self.state.step if self.resume_path is not None else None)
        if self.is_main:
            write_run_state(self.out, "running", step=self.state.step,
                            last_step=data.last_step, checkpoint=rel(self.resume_path, self.out))

    def record(self, record: dict[str, Any]) -> None:
        """One record of the run log: into metrics.jsonl and, the same keys at the same step,
        to the trackers."""
        self.metrics.write(record)
        self.trackers.log(record)

    def log_step(self) -> None:
        """One metrics.jsonl record for the window that ends at this step."""
        seconds, units, waited = self.speed.close(self.acc)
        record = log_record(self.state.step, self.data.steps_per_epoch, self.lr, self.sched,
                            self.window.means(self.acc), self.window.last, seconds, units,
                            waited, unit=self.adapter.unit)
        if self.hook is not None:
            record.update(self.hook.log_fields(self.acc))
        self.record(record)
        self.result.last_metrics = record
        if self.progress is not None:
            unit = self.adapter.unit
            self.progress.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}",
                                      **{f"{unit[:3]}_s": f"{record[f'{unit}_per_s']:.1f}"})

    def measure(self, ev: Evaluator, tag: str) -> None:
        """An evaluator's metrics, in metrics.jsonl as a record of their own; the artefacts
        into best/ when ``--keep-best``'s metric improved."""
        model, state = self.m.model, self.state
        model.eval()
        try:
            # --compile: the compiled encoders run eagerly here (see compile_encoders)
            with eager_evaluation() if self.cfg.compile else contextlib.nullcontext():
                metrics = ev(self.m.module, self.acc)
        finally:
            model.train()
        self.last_eval[ev.name] = state.step
        self.result.evaluations.append((state.step, metrics))
        self.record({"step": state.step, "epoch": round(state.step / self.data.steps_per_epoch, 4),
                     **metrics, f"{ev.name}_when": tag})
        logger.info("%s (%s, step %d): %s", ev.name, tag, state.step,
                    ", ".join(f"{k} {v:.2f}" for k, v in metrics.items()))
        if self.best is not None and self.best.update(metrics, state.step):
            # a checkpoint already written at this step lacks the new best: write it again
            self.best_unsaved = self.ckpt.last_saved_step == state.step
            with full_params(self.m.module):  # --fsdp: every process takes part
                if self.is_main:
                    self.adapter.artefacts.write(self.out / BEST_DIR, self.cfg, self.m.module,
                                                 self.recipe, state.step)
                logger.info("best %s so far (%.4g): artefacts in %s", self.best.metric,
                            self.best.value, self.out / BEST_DIR)

    def due(self, per: str, epoch: int | None = None) -> list[Evaluator]:
        """The evaluators due after this optimiser step (``per="step"``) or at the end of
        ``epoch`` (0-based, ``per="epoch"``)."""
        count = self.state.step if per == "step" else (epoch or 0) + 1
        return [ev for ev in self.evaluators
                if ev.per == per and ev.every and count % ev.every == 0]

    def save(self) -> Path:
        path = self.ckpt.save()
        self.best_unsaved = False
        self.result.checkpoint = path
        return path

    def check_finite(self) -> None:
        self.guard.check(self.acc, self.ckpt.last_saved_step, self.out / CHECKPOINTS)

    def stop_requested(self) -> bool:
        """Whether a stop was asked for on any process (a collective under several)."""
        return any_true(self.stop.check() is not None, self.acc)

    # ---- the loop -----------------------------------------------------------------------------

    def train_epochs(self) -> str:
        """Train until the last epoch, ``--max-steps`` or a stop request; returns the status
        ("completed", "max_steps" or "interrupted")."""
        state, data = self.state, self.data
        self.m.model.train()
        self.speed = Throughput(self.cfg.batch_size)  # the first window opens now
        status = "interrupted" if self.stop_requested() else "completed"  # during the set-up
        with self.progress_bar():
            while state.epoch < data.epochs and status == "completed":
                epoch = state.epoch
                status = self.train_epoch(epoch)
                if state.epoch != epoch + 1:
                    if status != "completed":
                        break  # stopped mid-epoch
                    raise RuntimeError(f"the loader ended after {state.micro_in_epoch} of "
                                       f"{data.micro_per_epoch} micro-batches in epoch {epoch}")
                if status == "interrupted":
                    break
                self.end_epoch(epoch)
        if status == "interrupted":
            self.result.stop_reason = self.stop.reason or "a signal on another process"
        else:
            self.evaluate_at_end()
        return status

    def train_epoch(self, epoch: int) -> str:
        """The epoch's micro-batches from where the run stands (a resume skips those done);
        returns the status once the epoch ends or the run stops."""
        acc, data, state = self.acc, self.data, self.state
        data.sampler.set_epoch(epoch)
        skip = state.micro_in_epoch
        batches = acc.skip_first_batches(data.loader, skip) if skip else data.loader
        # workers start with SIGTERM/SIGINT held back, then ignore them (see loader.py)
        samples = self.speed.timed(lambda: start_workers(batches))
        for micro, sample in enumerate(samples, start=skip):
            self.train_micro_batch(sample, micro)
            state.micro_in_epoch = micro + 1
            if acc.sync_gradients:  # an optimiser step is done
                status = self.after_optimizer_step(epoch)
                if status is not None:
                    return status
        return "completed"

    def train_micro_batch(self, sample: tuple[Any, ...], micro: int) -> None:
        """Forward and backward of one micro-batch, and the update at a step's last, at the
        step's lr and schedule values; then the adapter's hook."""
        acc, m, state = self.acc, self.m, self.state
        sched = self.step_values()
        batch = self.adapter.batch(sample, m.needs, sched, device=acc.device, step=state.step,
                                   micro=micro % self.cfg.grad_accum_steps,
                                   rank=acc.process_index, world=acc.num_processes)
        self.speed.count(self.adapter.count(batch))
        optimisation_step(m.model, batch, m.optimizer, acc, self.cfg, state.step, self.guard,
                          self.window, m.after_step, updater=self.updater, cache=m.cache)
        if self.hook is not None:
            self.hook.after_micro_batch(batch, sample, m.module, acc)

    def step_values(self) -> dict[str, float]:
        """The method's schedule values at this optimiser step, and its lr (and weight decay,
        when the method schedules it: DINO) set on the optimiser: once per step, at its first
        micro-batch."""
        step, m = self.state.step, self.m
        if self.values_step != step:
            self.values_step = step
            self.lr = self.lr_at(step)
            set_lr(m.optimizer, self.lr)
            self.sched = {k: float(fn(step, self.data.total_steps))
                          for k, fn in m.schedules.items()}
            if "weight_decay" in self.sched:
                set_weight_decay(m.optimizer, self.sched["weight_decay"])
        return self.sched

    def after_optimizer_step(self, epoch: int) -> str | None:
        """Count the step; log, evaluate and save when due; the status when the run stops
        here (a stop request, ``--max-steps``, a ``--steps`` budget), else None."""
        cfg, data, state = self.cfg, self.data, self.state
        state.step += 1
        self.speed.steps += 1
        if self.hook is not None:
            self.hook.after_optimizer_step(state)
        if state.micro_in_epoch >= data.micro_per_epoch or \
                state.step == data.total_steps:  # --steps may end an epoch early
            state.epoch, state.micro_in_epoch = epoch + 1, 0
        if self.progress is not None:
            self.progress.update(1)
        log_now = state.step % cfg.log_every == 0 or state.step == data.last_step
        save_now = bool(cfg.save_every_steps) and state.step % cfg.save_every_steps == 0
        if log_now or save_now or state.step == data.last_step:
            self.check_finite()
        if log_now:
            self.log_step()
        for ev in self.due("step"):
            self.measure(ev, f"step {state.step}")
        if save_now:
            self.save()
        # one process: the flag itself; several: agree every 10 steps (a collective)
        if (self.acc.num_processes == 1 or log_now or state.step % 10 == 0) and \
                self.stop_requested():
            self.check_finite()
            return "interrupted"
        if cfg.max_steps and state.step >= cfg.max_steps:
            return "max_steps"
        if cfg.steps and state.step >= data.total_steps:
            return "completed"  # a budget in steps (--steps) may end inside an epoch
        return None

    def end_epoch(self, epoch: int) -> None:
        """The evaluators due at the end of ``epoch``, and its checkpoint when due."""
        cfg = self.cfg
        self.check_finite()
        for ev in self.due("epoch", epoch):
            self.measure(ev, f"epoch {epoch + 1}")
        if self.best_unsaved or (cfg.save_every_epochs and (epoch + 1) % cfg.save_every_epochs == 0
                                 and self.ckpt.last_saved_step != self.state.step):
            self.save()

    def evaluate_at_end(self) -> None:
        """Every evaluator not yet run at this step, on the final model; the random generators
        are put back after. A run stopped here by ``--max-steps`` writes its last checkpoint
        next, and its resume must go on as the run that did not stop (nor evaluate) here did:
        nothing the evaluation draws (SimCSE's ``best/`` export draws) may reach that checkpoint."""
        with kept_rng(self.out):
            for ev in self.evaluators:
                if self.last_eval.get(ev.name) != self.state.step:
                    self.measure(ev, "end")

    @contextlib.contextmanager
    def progress_bar(self) -> Iterator[None]:
        """``--progress``: a bar over the run's steps on the main process."""
        if not (self.is_main and self.cfg.progress):
            yield
            return
        from tqdm.auto import tqdm

        with tqdm(total=self.data.last_step, initial=self.state.step, desc=self.recipe,
                  unit="step", dynamic_ncols=True, mininterval=1.0) as self.progress:
            yield
        self.progress = None

    # ---- the end ------------------------------------------------------------------------------

    def finish(self, status: str) -> TrainResult:
        """The last checkpoint, encoder.pt and run_state.json; the trackers get the pictures
        (a finished run) and are closed."""
        state, result, out = self.state, self.result, self.out
        saved = self.ckpt.last_saved_step if self.ckpt.last_saved_step is not None else (
            self.start_step if self.resume_path is not None else None)
        if saved != state.step or self.best_unsaved:
            self.save()
        result.status, result.step, result.epoch = status, state.step, state.epoch
        result.steps_trained = state.step - self.start_step
        with full_params(self.m.module):  # --fsdp: every process takes part
            if self.is_main:
                result.encoder_path = self.adapter.artefacts.write(out, self.cfg, self.m.module,
                                                                   self.recipe, state.step)
        if self.is_main:
            logger.info("%s at step %d: %s in %s", status, state.step,
                        getattr(self.adapter.artefacts, "what", "artefacts"), result.encoder_path)
            if status == "interrupted":
                write_run_state(out, "stopped", step=state.step, last_step=self.data.last_step,
                                reason=result.stop_reason, resumable=True,
                                checkpoint=rel(result.checkpoint, out), exit_code=EXIT_STOPPED)
            else:
                write_run_state(out, "completed", step=state.step, last_step=self.data.last_step,
                                reason="max_steps" if status == "max_steps" else "epochs",
                                encoder=rel(result.encoder_path, out), exit_code=0)
        self.trackers.finish(step=state.step, status=status, device=self.acc.device,
                             data=self.adapter.embedding_map_data())
        self.acc.wait_for_everyone()
        return result


def _nothing_to_do(cfg: RunConfig, state: TrainState, data: TrainData, out: Path,
                   resume_path: Path, accelerator: Any, module: nn.Module,
                   adapter: DataAdapter[Any], recipe: str) -> TrainResult:
    """A resume of a run that already reached ``--max-steps`` or its last epoch (a requeued job).

    Trains nothing and rewrites nothing (checkpoints, metrics.jsonl, config.json, encoder.pt);
    only a missing ``encoder.pt`` or ``run_state.json`` that does not say "completed" at this
    step (a run killed between its last checkpoint and its end) is written.
    """
    done_all = state.step >= data.total_steps or state.epoch >= data.epochs
    if done_all:
        logger.info("nothing to train: the run in %s reached its last epoch (step %d); nothing "
                    "was changed", out, state.step)
    else:
        logger.info("nothing to train: the run in %s is at step %d and --max-steps is %d; "
                    "nothing was changed. Pass a larger --max-steps to continue it", out,
                    state.step, cfg.max_steps)
    result = TrainResult(output_dir=out, status="completed" if done_all else "max_steps",
                         step=state.step, epoch=state.epoch, checkpoint=resume_path)
    artefacts = adapter.artefacts
    encoder_path = artefacts.main_file(out)
    with full_params(module):  # --fsdp: every process takes part
        if accelerator.is_main_process and artefacts.step_of(out) != state.step:
            artefacts.write(out, cfg, module, recipe, state.step)
            logger.info("wrote the missing %s (step %d)", encoder_path, state.step)
    if accelerator.is_main_process:
        previous = read_run_state(out) or {}
        if previous.get("state") != "completed" or previous.get("step") != state.step:
            write_run_state(out, "completed", step=state.step, last_step=data.last_step,
                            reason="epochs" if done_all else "max_steps",
                            encoder=rel(encoder_path, out), exit_code=0)
    result.encoder_path = encoder_path
    accelerator.wait_for_everyone()
    return result
