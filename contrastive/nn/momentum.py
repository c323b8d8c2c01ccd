"""Momentum (EMA) key encoders and momentum schedules.

MoCo (He et al. CVPR 2020, eq. 2): ``theta_k <- m * theta_k + (1 - m) * theta_q``.

The update covers PARAMETERS only, as in the official MoCo v1/v2/v3 code: the key encoder's
BatchNorm running statistics are its own, updated by its forward passes in train mode (the
methods run the key encoder in the same mode as the method). Use
:func:`copy_buffers` if you want them copied from the query encoder instead.

The update is a single ``torch._foreach_lerp_`` over all parameters (grouped per device and
dtype by PyTorch), not a Python loop over tensors: on a ResNet-50 this is several times faster
than the per-parameter loop of the reference code (see ``benchmarks/bench_momentum_queue.py``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

__all__ = [
    "momentum_update",
    "copy_buffers",
    "MomentumEncoder",
    "constant_momentum",
    "cosine_momentum",
    "linear_momentum",
]


def _check_m(m: float) -> None:
    if not 0.0 <= float(m) <= 1.0:
        raise ValueError(f"momentum m must be in [0, 1], got {m}")


def _params(x: nn.Module | Iterable[Tensor]) -> list[Tensor]:
    return list(x.parameters()) if isinstance(x, nn.Module) else list(x)


@torch.no_grad()
def momentum_update(
    target: nn.Module | Iterable[Tensor], source: nn.Module | Iterable[Tensor], m: float
) -> None:
    """In place: ``target_p = m * target_p + (1 - m) * source_p`` for every parameter pair.

    Args:
        target: the key (momentum) encoder, or its parameter tensors.
        source: the query encoder with the same architecture, or its parameter tensors.
        m: momentum in [0, 1]; 1 keeps ``target``, 0 copies ``source``.
    """
    _check_m(m)
    tgt, src = _params(target), _params(source)
    if len(tgt) != len(src):
        raise ValueError(
            f"momentum_update: target has {len(tgt)} parameters, source has {len(src)}; "
            "both must be the same architecture"
        )
    if tgt:
        # lerp: t + w * (s - t) == m * t + (1 - m) * s with w = 1 - m
        torch._foreach_lerp_(tgt, src, 1.0 - float(m))


@torch.no_grad()
def copy_buffers(target: nn.Module, source: nn.Module) -> None:
    """Copy all buffers (e.g. BN running statistics) of ``source`` into ``target``."""
    tgt, src = list(target.buffers()), list(source.buffers())
    if tgt:
        torch._foreach_copy_(tgt, src)


class MomentumEncoder(nn.Module):
    """A frozen copy of a module that follows it by EMA.

    ``key = MomentumEncoder(query_module)`` deep-copies the module (same initial weights, as
    MoCo), sets ``requires_grad=False`` on every copied parameter so that it never receives a
    gradient nor enters an optimizer that filters on ``requires_grad``, and
    ``key.update(query_module, m)`` applies :func:`momentum_update`. ``key(x)`` runs the copy.

    The source is passed to ``update`` rather than stored, so it is not registered twice in
    the parent module's parameters and state dict.
    """

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self.module = copy.deepcopy(source)
        for p in self.module.parameters():
            p.requires_grad_(False)
        self._params: list[Tensor] | None = None  # cached: listing costs ~0.1 ms per call

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def update(self, source: nn.Module | Iterable[Tensor], m: float) -> None:
        """EMA step towards ``source`` (a module or its parameters in the same order as the
        copy's; see :func:`momentum_update`)."""
        if self._params is None:
            self._params = list(self.module.parameters())
        momentum_update(self._params, source, m)

    # the cache is dropped whenever parameters may be replaced (.to(), load_state_dict(assign=True))
    def _apply(self, fn, *args, **kwargs):
        self._params = None
        return super()._apply(fn, *args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs):
        self._params = None
        super()._load_from_state_dict(*args, **kwargs)


def constant_momentum(step: int, total_steps: int, m0: float) -> float:
    """The constant schedule of MoCo v1/v2: ``m0`` at every step."""
    _check_m(m0)
    return float(m0)


def cosine_momentum(step: int, total_steps: int, m0: float) -> float:
    """Cosine schedule from ``m0`` at step 0 to 1 at ``total_steps`` (BYOL, MoCo v3).

    ``m(t) = 1 - (1 - m0) * (cos(pi * t / T) + 1) / 2``, with t clipped to [0, T].
    """
    _check_m(m0)
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    t = min(max(step, 0), total_steps)
    return 1.0 - (1.0 - m0) * (math.cos(math.pi * t / total_steps) + 1.0) / 2.0


def linear_momentum(step: int, total_steps: int, m0: float) -> float:
    """Linear schedule from ``m0`` to 1 over the run, applied before step ``step``: the EMA
    update after step ``step - 1`` (I-JEPA's ``momentum_scheduler``, facebookresearch/ijepa
    ``src/train.py`` lines 228-229 and 333-336: ``m0 + i (1 - m0) / T`` after step i).

    ``m(t) = m0 + (1 - m0) * (t - 1) / T`` with ``t - 1`` clipped to [0, T]: at step 0 the
    target still equals its source, so the update it is given there moves nothing.
    """
    _check_m(m0)
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    t = min(max(step - 1, 0), total_steps)
    return m0 + (1.0 - m0) * t / total_steps
