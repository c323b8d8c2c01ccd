"""One training step: forward, backward, optimiser step, the method's post-step hook.

The method's ``batch`` comes from the data adapter (:mod:`contrastive.engine.adapters`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contrastive.engine.config import RunConfig
from contrastive.engine.optim import drop_frozen_grads
from contrastive.engine.run_log import ScalarWindow

__all__ = ["NonFiniteLossError", "NonFiniteGuard", "optimisation_step", "all_true", "any_true"]

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite (``--on-nonfinite stop``)."""


class NonFiniteGuard:
    """``--on-nonfinite stop``: remembers the first step whose loss was NaN/inf on the device
    (no host sync per step) and raises at the next log line, checkpoint or stop."""

    def __init__(self, device: torch.device) -> None:
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)

    def note(self, finite: torch.Tensor, step: int) -> None:
        self.first_bad = torch.where(finite | (self.first_bad >= 0), self.first_bad,
                                     torch.full_like(self.first_bad, step))

    def check(self, accelerator: Any, last_saved: int | None, checkpoints: Path) -> None:
        """Raise :class:`NonFiniteLossError` (on every process) if a loss was not finite."""
        bad = self.first_bad.reshape(1).clone()
        if accelerator.num_processes > 1:
            bad = accelerator.reduce(torch.where(bad < 0, torch.full_like(bad, 1 << 62), bad),
                                     "min")
            bad = torch.where(bad == 1 << 62, torch.full_like(bad, -1), bad)
        step = int(bad.item())
        if step >= 0:
            raise NonFiniteLossError(
                f"non-finite loss (NaN or inf) at step {step}. The last good checkpoint is "
                f"{'step ' + str(last_saved) if last_saved is not None else 'none'} in "
                f"{checkpoints}; resume with --resume auto and a lower --lr, or pass "
                "--on-nonfinite skip to skip such steps")


def optimisation_step(model: nn.Module, batch: dict[str, Any], optimizer: Any, accelerator: Any,
                      cfg: RunConfig, step: int, guard: NonFiniteGuard, window: ScalarWindow,
                      after_step: Callable[[], None] | None = None) -> None:
    """Forward, backward and (on the last micro-batch of a step) the optimiser step: frozen
    groups' gradients dropped, gradients clipped; a non-finite loss is skipped or noted.
    ``after_step`` (the method's ``after_optimizer_step``) runs after each real optimiser step."""
    with accelerator.accumulate(model):
        out = model(batch)
        loss = out["loss"]
        finite = torch.isfinite(loss.detach())
        if cfg.on_nonfinite == "skip" and not all_true(finite, accelerator):
            logger.warning("non-finite loss at step %d: skipping the optimiser step", step)
            optimizer.zero_grad(set_to_none=True)
            return
        guard.note(finite, step)
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            drop_frozen_grads(optimizer, step)
            if cfg.clip_grad_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
        optimizer.step()
        if after_step is not None and accelerator.sync_gradients:  # not a micro-batch
            after_step()  # e.g. CLIP clamps its logit scale, as open_clip does
        optimizer.zero_grad(set_to_none=True)
        window.add(out)  # every scalar the method returns is logged (mean over the log window)


def all_true(flag: torch.Tensor, accelerator: Any) -> bool:
    """``flag`` (a 0-d bool tensor) on every process (one host sync, a collective if several)."""
    v = flag.float().reshape(1)
    if accelerator.num_processes > 1:
        v = accelerator.reduce(v, "min")
    return bool(v.item())


def any_true(flag: bool, accelerator: Any) -> bool:
    """A Python flag set on any process (a collective when there are several)."""
    if accelerator.num_processes == 1:
        return flag
    v = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(v, "max").item())
