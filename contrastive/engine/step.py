"""One training step: forward, backward, optimiser step, the method's post-step hook.

The method's ``batch`` comes from the data adapter (its kit: :mod:`contrastive.engine.kits`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contrastive.engine.config import RunConfig
from contrastive.engine.grad_cache import (
    GradCache,
    GradCacheError,
    all_reduce_grads,
    concat_batches,
)
from contrastive.engine.optim import hold_frozen_groups
from contrastive.engine.run_log import ScalarWindow

__all__ = ["NonFiniteLossError", "NonFiniteGuard", "ClipPartsError", "Updater", "clip_groups",
           "clip_parts_", "optimisation_step", "all_true", "any_true"]

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite (``--on-nonfinite stop``)."""


class ClipPartsError(ValueError):
    """A method's clipping parts (:meth:`~contrastive.methods.Method.clip_parts`) that cannot
    be used: a parameter in two parts, or a run whose clipping is accelerate's own (FSDP,
    DeepSpeed, XLA)."""


class NonFiniteGuard:
    """``--on-nonfinite stop``: keeps each step's "loss is finite" flag on the device (no host
    sync and no device work per step) and, at the next log line, checkpoint or stop, raises
    naming the first step whose loss was NaN/inf."""

    CHUNK = 256  # flags stacked into one tensor every CHUNK steps (bounded list length)

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flags: list[torch.Tensor] = []  # 0-d bools of the steps in self._steps
        self._chunks: list[torch.Tensor] = []  # stacked flags of earlier steps
        self._steps: list[int] = []  # the steps of _chunks' and then _flags' entries

    def note(self, finite: torch.Tensor, step: int) -> None:
        self._flags.append(finite)
        self._steps.append(step)
        if len(self._flags) == self.CHUNK:
            self._chunks.append(torch.stack(self._flags))
            self._flags = []

    def first_bad_step(self) -> int:
        """The first noted step whose loss was not finite on this process, or -1; forgets the
        noted flags (one host sync)."""
        parts = self._chunks + ([torch.stack(self._flags)] if self._flags else [])
        steps = self._steps
        self._flags, self._chunks, self._steps = [], [], []
        if not parts:
            return -1
        bad = (~torch.cat(parts)).nonzero()
        return steps[int(bad[0, 0])] if len(bad) else -1

    def check(self, accelerator: Any, last_saved: int | None, checkpoints: Path) -> None:
        """Raise :class:`NonFiniteLossError` (on every process) if a loss was not finite."""
        step = self.first_bad_step()
        if accelerator.num_processes > 1:  # the first bad step of any process
            bad = torch.tensor([step if step >= 0 else 1 << 62], device=self.device)
            step = int(accelerator.reduce(bad, "min").item())
            step = -1 if step == 1 << 62 else step
        if step >= 0:
            raise NonFiniteLossError(
                f"non-finite loss (NaN or inf) at step {step}. The last good checkpoint is "
                f"{'step ' + str(last_saved) if last_saved is not None else 'none'} in "
                f"{checkpoints}; resume with --resume auto and a lower --lr, or pass "
                "--on-nonfinite skip to skip such steps")


class Updater:
    """The backward, clip, optimiser-step and zero-grad calls of a step, resolved once per run.

    accelerate's wrappers (``accelerator.backward`` / ``clip_grad_norm_``, the prepared
    optimiser's ``step`` / ``zero_grad``) do work with fp16 loss scaling, DeepSpeed, FSDP,
    Megatron or XLA. In one process or under DDP without a gradient scaler they reduce to the
    torch calls below, at ~0.8 ms of Python per step (a package look-up twice per optimiser
    step, a signature inspection, a parameter walk, version checks: 2 % of a 35 ms SimCSE step
    on the CPU), so there (``direct``) the torch calls are made directly:

    - backward: ``(loss / accum).backward()``, ``loss.backward()`` with no accumulation (as
      ``x / 1 == x`` exactly, in value and gradient);
    - clip: ``torch.nn.utils.clip_grad_norm_`` over the model's parameters, listed once (over
      each part apart when the method declares :meth:`~contrastive.methods.Method.clip_parts`:
      :func:`clip_parts_`, the same gradients in a few fused calls);
    - step / zero_grad: the wrapped optimiser's, on the last micro-batch of a step only (the
      prepared optimiser skips them on the others, keeping the accumulated gradients).

    DDP's gradient synchronisation (``no_sync`` on the other micro-batches) and the
    ``sync_gradients`` flag stay ``accelerator.accumulate``'s.

    Clipping parts (``method``'s :meth:`~contrastive.methods.Method.clip_parts`, the model
    itself or the module DDP wraps when not given; none read when ``clips`` is False, a run
    without clipping): each part's gradient norm is measured and
    clipped to ``max_norm`` apart (:func:`clip_groups`), as DINOv2's ``do_train``
    (``dinov2/train/train.py``: ``for v in model.student.values(): v.clip_grad_norm_(...)``).
    The clip runs on the last micro-batch only, after DDP's all-reduce (every process sees the
    same averaged gradients, so the same norms) and, with an fp16 scaler, after one
    ``accelerator.unscale_gradients()`` (the scaler refuses a second unscale before its update,
    so ``accelerator.clip_grad_norm_`` is not called per part). FSDP, DeepSpeed and XLA clip
    through accelerate over the whole model: parts there are refused (:class:`ClipPartsError`).
    No gradient norm is logged, with parts or without (the clip's returned norms are dropped).
    """

    def __init__(self, model: nn.Module, optimizer: Any, accelerator: Any, *,
                 method: nn.Module | None = None, clips: bool = True) -> None:
        self.acc = accelerator
        self.optimizer = optimizer  # the prepared one: checkpoints and the skip path use it
        self.params = list(model.parameters())
        self.accum = int(accelerator.gradient_accumulation_steps)
        self.direct = direct_calls_equivalent(accelerator, optimizer, self.params)
        self._inner = optimizer.optimizer if self.direct else optimizer
        declare = getattr(method if method is not None else getattr(model, "module", model),
                          "clip_parts", None)
        # no clipping (--clip-grad-norm 0): no parts, so nothing to refuse under FSDP & co.
        parts = dict(declare()) if callable(declare) and clips else {}
        #: the parameter lists clipped apart; None: all of self.params together (the default)
        self.clip_lists = clip_groups(self.params, parts) if parts else None
        if self.clip_lists is not None and not self.direct and \
                not separate_clip_allowed(accelerator):
            names = sorted(parts)
            shown = f"{names[:4]}"[:-1] + (f", ... ({len(names)} in all)]" if len(names) > 4
                                           else "]")
            raise ClipPartsError(
                f"the method clips its parts {shown} apart, which runs in one process or "
                "under DDP (fp16 included), not under FSDP, DeepSpeed or XLA; turn the method's "
                "per-part clipping off (DINO, IBOT: clip_mode=\"all\") or clip nothing "
                "(--clip-grad-norm 0)")

    def backward(self, loss: torch.Tensor) -> None:
        if not self.direct:
            self.acc.backward(loss)
        elif self.accum > 1:
            (loss / self.accum).backward()
        else:
            loss.backward()

    def clip(self, max_norm: float) -> None:
        if self.clip_lists is not None:
            if not self.direct:
                self.acc.unscale_gradients()  # fp16: once for all parts; a no-op otherwise
            clip_parts_(self.clip_lists, max_norm)
        elif self.direct:
            torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        else:
            self.acc.clip_grad_norm_(self.params, max_norm)

    def step(self) -> None:
        if not self.direct:
            self.optimizer.step()
        elif self.acc.sync_gradients:
            self._inner.step()

    def zero_grad(self) -> None:
        if not self.direct:
            self.optimizer.zero_grad(set_to_none=True)
        elif self.acc.sync_gradients:
            self._inner.zero_grad(set_to_none=True)


def clip_parts_(parts: Sequence[Sequence[nn.Parameter]], max_norm: float) -> None:
    """Each part's gradients clipped to ``max_norm`` apart: what ``clip_grad_norm_(part,
    max_norm)`` per part gives, bit for bit, in a few fused calls rather than one call per part
    (DINO's per-parameter clip of a ViT-S: 157 calls, ~10 us each on the CPU).

    As torch: each gradient's norm (one ``torch._foreach_norm`` over all of them), a part's
    norm the 2-norm of its gradients' norms (that of a one-tensor part is its one norm: equal to
    torch's ``vector_norm`` of it, tested), coefficient ``min(1, max_norm / (norm + 1e-6))``
    (for all parts at once: elementwise, the same values), multiplied in (``_foreach_mul_``),
    no host sync. Gradients of several devices or dtypes, or not plain tensors (torch groups
    them otherwise): ``clip_grad_norm_`` per part."""
    grads = [[p.grad for p in part if p.grad is not None] for part in parts]
    grads = [gs for gs in grads if gs]
    flat = [g for gs in grads for g in gs]
    if not flat:
        return
    first = flat[0]
    if any(type(g) is not torch.Tensor or g.is_sparse or g.device != first.device
           or g.dtype != first.dtype for g in flat):
        for part in parts:
            torch.nn.utils.clip_grad_norm_(part, max_norm)
        return
    norms = torch._foreach_norm(flat, 2.0)
    if len(norms) == len(grads):  # every part one tensor
        coefs = list(torch.clamp(max_norm / (torch.stack(norms) + 1e-6), max=1.0).unbind())
    else:
        totals, start = [], 0
        for gs in grads:
            stop = start + len(gs)
            totals.append(norms[start] if len(gs) == 1 else
                          torch.linalg.vector_norm(torch.stack(norms[start:stop]), 2.0))
            start = stop
        per_part = torch.clamp(max_norm / (torch.stack(totals) + 1e-6), max=1.0).unbind()
        coefs = [c for c, gs in zip(per_part, grads) for _ in gs]
    torch._foreach_mul_(flat, coefs)


def clip_groups(params: list[nn.Parameter],
                parts: Mapping[str, Sequence[nn.Parameter]]) -> list[list[nn.Parameter]]:
    """The parameter lists clipped apart: each declared part's (in the model, trainable), then
    the model's other trainable parameters as one more list (if any). A parameter in two parts
    is a :class:`ClipPartsError`; one outside the model is left out."""
    in_model = {id(p) for p in params}
    owner: dict[int, str] = {}
    lists = []
    for name, part in parts.items():
        mine = []
        for p in part:
            if id(p) in owner:
                raise ClipPartsError(f"a parameter is in two clipping parts: {owner[id(p)]!r} "
                                     f"and {name!r}; give each parameter to one part")
            owner[id(p)] = name
            if p.requires_grad and id(p) in in_model:
                mine.append(p)
        lists.append(mine)
    rest = [p for p in params if p.requires_grad and id(p) not in owner]
    return [part for part in [*lists, rest] if part]


def separate_clip_allowed(accelerator: Any) -> bool:
    """Whether gradients can be clipped part by part with torch's ``clip_grad_norm_`` after
    ``accelerator.unscale_gradients()``: one process or DDP, not FSDP / DeepSpeed / XLA."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (
        DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU) and \
        os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"


def direct_calls_equivalent(accelerator: Any, optimizer: Any, params: list[nn.Parameter]) -> bool:
    """Whether accelerate's backward / clip / step / zero_grad equal the plain torch calls of
    :class:`Updater` here: one process or DDP (CPU or GPU), no gradient scaler (fp16), no
    FSDP / DeepSpeed / XLA, a prepared torch optimiser, no DTensor parameters."""
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils import DistributedType

    if accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU,
                                            DistributedType.MULTI_GPU):
        return False
    if getattr(accelerator, "scaler", None) is not None or \
            os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return False
    if not isinstance(optimizer, AcceleratedOptimizer) or optimizer.scaler is not None or \
            not isinstance(optimizer.optimizer, torch.optim.Optimizer):
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor has no DTensor parameters
        return True
    return not any(isinstance(p, DTensor) for p in params)


def optimisation_step(model: nn.Module, batch: dict[str, Any], optimizer: Any, accelerator: Any,
                      cfg: RunConfig, step: int, guard: NonFiniteGuard, window: ScalarWindow,
                      after_step: Callable[[], None] | None = None, *,
                      updater: Updater | None = None, cache: GradCache | None = None) -> None:
    """Forward, backward and (on the last micro-batch of a step) the optimiser step: frozen
    groups held (:func:`~contrastive.engine.optim.hold_frozen_groups`), gradients clipped (per
    part where the method declares parts: :class:`Updater`); a non-finite loss is skipped or
    noted.
    ``after_step`` (the method's ``after_optimizer_step``) runs after each real optimiser step.
    ``updater``: the run's :class:`Updater` (built here when not given). ``cache``: train
    through the gradient cache (:mod:`~contrastive.engine.grad_cache`): the micro-batches of a
    step are collected and trained as one batch, the backbone chunk by chunk."""
    up = updater if updater is not None else Updater(model, optimizer, accelerator,
                                                     clips=cfg.clip_grad_norm > 0)
    if cache is not None:
        _cached_step(model, batch, optimizer, accelerator, cfg, step, guard, window, after_step,
                     up, cache)
        return
    with accelerator.accumulate(model):
        out = model(batch)
        loss = out["loss"]
        finite = torch.isfinite(loss.detach())
        if cfg.on_nonfinite == "skip" and not all_true(finite, accelerator):
            logger.warning("non-finite loss at step %d: skipping the optimiser step", step)
            optimizer.zero_grad(set_to_none=True)
            return
        guard.note(finite, step)
        up.backward(loss)
        sync = accelerator.sync_gradients
        if sync:
            hold_frozen_groups(optimizer, step)
            if cfg.clip_grad_norm > 0:
                up.clip(cfg.clip_grad_norm)
        up.step()
        if after_step is not None and sync:  # not a micro-batch
            after_step()  # e.g. CLIP clamps its logit scale, as open_clip does
        up.zero_grad()
        window.add(out)  # every scalar the method returns is logged (mean over the log window)


def _cached_step(model: nn.Module, batch: dict[str, Any], optimizer: Any, accelerator: Any,
                 cfg: RunConfig, step: int, guard: NonFiniteGuard, window: ScalarWindow,
                 after_step: Callable[[], None] | None, up: Updater, cache: GradCache) -> None:
    """:func:`optimisation_step` through the gradient cache. The micro-batches of an
    accumulated step wait until the last one; then the method runs once on their union with
    the backbone cached (passes 1 and 2), ``loss.backward()``, the backbone's second pass, and
    with several processes the gradients' average (DDP's hooks are off: ``no_sync``)."""
    if not up.direct:
        raise GradCacheError("gradient caching (--grad-cache-chunk, --grad-accum-steps) runs "
                             "in one process or under DDP without fp16 loss scaling, FSDP or "
                             "DeepSpeed; use bf16 or fp32 there")
    with accelerator.accumulate(model):  # keeps accelerate's count of micro-batches
        cache.pending.append(batch)
        if not accelerator.sync_gradients:
            return
        whole = concat_batches(cache.pending)
        cache.pending = []
        world = accelerator.num_processes
        no_sync = getattr(model, "no_sync", None)
        with no_sync() if callable(no_sync) and world > 1 else contextlib.nullcontext():
            with cache.recording():
                out = model(whole)
            loss = out["loss"]
            finite = torch.isfinite(loss.detach())
            if cfg.on_nonfinite == "skip" and not all_true(finite, accelerator):
                logger.warning("non-finite loss at step %d: skipping the optimiser step", step)
                cache.clear()
                optimizer.zero_grad(set_to_none=True)
                return
            guard.note(finite, step)
            loss.backward()  # the whole batch's loss: no division by the micro-batches
            cache.backward()
        if world > 1:
            all_reduce_grads(up.params, world)
        hold_frozen_groups(optimizer, step)
        if cfg.clip_grad_norm > 0:
            up.clip(cfg.clip_grad_norm)
        up.step()
        if after_step is not None:
            after_step()
        up.zero_grad()
        window.add(out)


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
