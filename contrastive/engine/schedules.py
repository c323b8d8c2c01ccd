"""Learning-rate schedules as plain functions of the global optimiser step.

No scheduler object steps itself: ``lr = lr_at(step, ...)`` is computed every step and written
into the optimiser's param groups, so a resumed run, several processes and gradient accumulation
all agree on the value by construction (a ``torch`` scheduler passed through
``accelerator.prepare`` steps once per process, and timm's schedulers expect the step or epoch as
an argument anyway). The formulas equal timm's ``CosineLRScheduler`` / ``MultiStepLRScheduler``
(tested against them) and the official MoCo code:

- cosine with linear warmup (MoCo v3, ``main_moco.py``; SimCLR):
  ``t < W: lr * t / W``; else ``min + (lr - min) * 0.5 * (1 + cos(pi * (t - W) / (T - W)))``,
  ``t`` in epochs (fractional for per-step schedules);
- linear decay with linear warmup (BERT; ``transformers.get_linear_schedule_with_warmup``):
  ``t < W: lr * t / W``; else ``min + (lr - min) * (T - t) / (T - W)``;
- step (MoCo v1): ``lr * gamma ** (number of milestones <= epoch)``;
- constant.

A run's budget and warmup are in epochs (``--epochs``, ``--warmup-epochs``) or in optimiser steps
(``--steps``, ``--warmup-steps``); with either in steps, ``t``, ``W`` and ``T`` are counted in
steps.

The EMA-momentum schedules (constant, cosine from m0 to 1) live in :mod:`contrastive.nn`; a method
declares them (``method.schedules()``, see :mod:`contrastive.methods`) and the loop evaluates them
once per optimiser step, like the lr here.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Sequence

__all__ = ["scaled_lr", "cosine_lr", "linear_lr", "step_lr", "lr_at", "schedule_time",
           "warmup_warning"]


def scaled_lr(lr: float, batch_size: int, rule: str = "linear") -> float:
    """Learning rate actually used for a global batch.

    ``linear``: ``lr * batch_size / 256`` (Goyal et al. 2017; MoCo v3, SimCLR);
    ``sqrt``: ``lr * sqrt(batch_size)``, the batch size itself, not divided by 256: SimCLR
    (Chen et al., ICML 2020, appendix B.1: "LearningRate = 0.075 x sqrt(BatchSize)", better than
    the linear rule at small batches and long training) and the authors' code
    (google-research/simclr ``model_util.learning_rate_schedule``: ``base_learning_rate *
    math.sqrt(FLAGS.train_batch_size)``; its README trains with ``--learning_rate=0.075
    --learning_rate_scaling=sqrt``). At batch 4096 both rules give 4.8 (0.075 x 64 = 0.3 x 16);
    ``none``: ``lr``.
    """
    if rule == "linear":
        return lr * batch_size / 256
    if rule == "sqrt":
        return lr * math.sqrt(batch_size)
    if rule == "none":
        return lr
    raise ValueError(f"lr_scaling must be 'linear', 'sqrt' or 'none', got {rule!r}")


def cosine_lr(t: float, total: float, peak: float, warmup: float = 0.0,
              floor: float = 0.0) -> float:
    """Half-cycle cosine from ``peak`` to ``floor`` after a linear warmup from 0.

    ``t``, ``total`` and ``warmup`` share one unit (epochs or steps).
    """
    if warmup > 0 and t < warmup:
        return peak * t / warmup
    span = max(total - warmup, 1e-12)
    progress = min(max((t - warmup) / span, 0.0), 1.0)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def linear_lr(t: float, total: float, peak: float, warmup: float = 0.0,
              floor: float = 0.0) -> float:
    """Linear decay from ``peak`` to ``floor`` at ``total`` after a linear warmup from 0 (BERT's
    schedule). ``t``, ``total`` and ``warmup`` share one unit (epochs or steps)."""
    if warmup > 0 and t < warmup:
        return peak * t / warmup
    span = max(total - warmup, 1e-12)
    progress = min(max((t - warmup) / span, 0.0), 1.0)
    return floor + (peak - floor) * (1.0 - progress)


def step_lr(epoch: float, peak: float, milestones: Sequence[int], gamma: float = 0.1,
            warmup: float = 0.0) -> float:
    """``peak * gamma ** k`` where k counts the milestones (epochs) already reached."""
    if warmup > 0 and epoch < warmup:
        return peak * epoch / warmup
    return peak * gamma ** bisect.bisect_right(sorted(milestones), epoch)


def schedule_time(step: int, steps_per_epoch: int, per: str = "step") -> float:
    """Epochs elapsed at optimiser step ``step``: fractional (``per="step"``) or whole
    (``per="epoch"``, the official MoCo v1/v2 code adjusts the lr once per epoch)."""
    if per == "step":
        return step / steps_per_epoch
    if per == "epoch":
        return float(step // steps_per_epoch)
    raise ValueError(f"schedule_per must be 'step' or 'epoch', got {per!r}")


def lr_at(step: int, *, steps_per_epoch: int, epochs: int, peak: float, schedule: str = "cosine",
          warmup_epochs: float = 0.0, min_lr: float = 0.0, milestones: Sequence[int] = (),
          gamma: float = 0.1, per: str = "step", warmup_steps: int = 0,
          total_steps: int = 0) -> float:
    """Learning rate of optimiser step ``step`` (0-based) for a run of ``epochs`` epochs, or of
    ``total_steps`` optimiser steps when that is set.

    ``min_lr`` is a fraction of ``peak``. Warmup is always per step (a whole-epoch warmup would
    start at lr 0 for an epoch); ``warmup_steps`` adds to ``warmup_epochs``.
    """
    if schedule not in ("cosine", "linear", "step", "constant"):
        raise ValueError(f"lr_schedule must be 'cosine', 'linear', 'step' or 'constant', got "
                         f"{schedule!r}")
    if warmup_steps or total_steps:  # a budget or warmup in steps: time counted in steps
        total = float(total_steps or epochs * steps_per_epoch)
        warmup = warmup_steps + warmup_epochs * steps_per_epoch
        t = schedule_time(step, steps_per_epoch, per) * steps_per_epoch
        if warmup > 0 and step < warmup:
            return peak * step / warmup
        if schedule == "cosine":
            return cosine_lr(t, total, peak, warmup, peak * min_lr)
        if schedule == "linear":
            return linear_lr(t, total, peak, warmup, peak * min_lr)
        if schedule == "step":
            return step_lr(t / steps_per_epoch, peak, milestones, gamma)
        return peak
    t = schedule_time(step, steps_per_epoch, per)
    if warmup_epochs > 0 and step / steps_per_epoch < warmup_epochs:
        return peak * (step / steps_per_epoch) / warmup_epochs
    if schedule == "cosine":
        return cosine_lr(t, epochs, peak, warmup_epochs, peak * min_lr)
    if schedule == "linear":
        return linear_lr(t, epochs, peak, warmup_epochs, peak * min_lr)
    if schedule == "step":
        return step_lr(t, peak, milestones, gamma)
    return peak


def warmup_warning(*, steps: int, steps_per_epoch: int, warmup_epochs: float,
                   warmup_steps: int = 0) -> tuple[int, str] | None:
    """``(logging level, message)`` on the lr warm-up of a run whose budget is ``--steps``, or
    None: a WARNING when the warm-up fills the run, INFO when a warm-up in epochs fits.

    A recipe's warm-up is often in epochs (``--warmup-epochs 10``); a ``--steps`` budget keeps
    it, as :func:`lr_at` counts it (``warmup_steps + warmup_epochs x steps_per_epoch`` steps),
    so a short ``--steps`` run can be warm-up from start to end (dino_vit_small ``--steps
    100``: 10 epochs of 1251 steps). The trainer logs this once at the start; the schedule is
    not changed.
    """
    if not steps:
        return None
    warmup = warmup_steps + warmup_epochs * steps_per_epoch
    if warmup_epochs <= 0 and warmup < steps:
        return None
    parts = []
    if warmup_steps:
        parts.append(f"--warmup-steps {warmup_steps}")
    if warmup_epochs > 0:
        parts.append(f"--warmup-epochs {warmup_epochs:g} x {steps_per_epoch} steps/epoch")
    counted = f"lr warm-up of {warmup:g} steps ({' + '.join(parts)})"
    fix = "--warmup-epochs 0 --warmup-steps N" if warmup_epochs > 0 else "--warmup-steps N"
    if warmup >= steps:
        return logging.WARNING, (f"{counted} >= --steps {steps}: the whole run is warm-up, the "
                                 f"lr never reaches its peak; pass {fix} with N < {steps}")
    return logging.INFO, (f"{counted} with --steps {steps}: the warm-up is in epochs, "
                          f"{100 * warmup / steps:.3g}% of the run; to set it in steps pass {fix}")
