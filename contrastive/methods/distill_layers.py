"""Where a distiller reads its features: stage discovery for common backbones, forward-hook taps
that pool (and optionally perturb) a stage's output, the teacher's input re-normalisation, and
small context helpers.

Used by :class:`contrastive.methods.distill.Distiller`; the public helpers are re-exported there.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Renormalise", "default_layers", "default_stem", "uniform_layer_map"]


def uniform_layer_map(num_student: int, num_teacher: int) -> list[int]:
    """LRC-BERT's uniform mapping, 0-based: student i -> teacher ceil((i + 1) N / M) - 1.

    M = 4 student and N = 12 teacher layers give [2, 5, 8, 11] (layers 3, 6, 9, 12 of the paper).
    """
    if num_student < 1 or num_teacher < 1:
        raise ValueError(f"uniform_layer_map: need >= 1 layers, got {num_student}, {num_teacher}")
    return [math.ceil((i + 1) * num_teacher / num_student) - 1 for i in range(num_student)]


def default_layers(model: nn.Module) -> list[str]:
    """Names of the stage modules whose outputs are distilled, shallow to deep.

    ResNets (ours, torchvision, timm): ``layer1..layer4``; ``blocks.i`` (``small_cnn``, timm ViT,
    EfficientNet), ``stages.i`` (ConvNeXt, RegNet), ``layers.i`` (Swin), ``features.i``.
    """
    if all(hasattr(model, f"layer{i}") for i in range(1, 5)):
        return [f"layer{i}" for i in range(1, 5)]
    for attr in ("blocks", "stages", "layers", "features"):
        seq = getattr(model, attr, None)
        if isinstance(seq, (nn.Sequential, nn.ModuleList)) and len(seq) > 0:
            return [f"{attr}.{i}" for i in range(len(seq))]
    children = [n for n, _ in model.named_children()]
    raise ValueError(
        f"cannot find the stages of {type(model).__name__} (children: {children}); pass the "
        "module names explicitly (student_layers=[...] / teacher_layers=[...])"
    )


def default_stem(model: nn.Module) -> str:
    """Where gradient perturbation applies: ``patch_embed`` (ViT), ``maxpool`` (ResNets: the stem
    output), ``stem``, else the first stage of :func:`default_layers`."""
    if hasattr(model, "patch_embed"):
        return "patch_embed"
    if hasattr(model, "conv1") and hasattr(model, "maxpool"):
        return "maxpool"
    if isinstance(getattr(model, "stem", None), nn.Module):
        return "stem"
    return default_layers(model)[0]


class Tap:
    """Forward hook: while armed, pools and keeps the module's output; can add a perturbation."""

    def __init__(self, name: str, token_pool: str, num_prefix: int) -> None:
        self.name, self.token_pool, self.num_prefix = name, token_pool, num_prefix
        self.armed, self.calls = False, 0
        self.add: Tensor | None = None
        self.raw: Tensor | None = None
        self.out: Tensor | None = None

    def arm(self, add: Tensor | None = None) -> None:
        self.armed, self.calls, self.add, self.raw, self.out = True, 0, add, None, None

    def __call__(self, module: nn.Module, inputs: Any, output: Any) -> Tensor | None:
        if not self.armed:
            return None
        self.calls += 1
        is_seq = isinstance(output, (tuple, list))
        x = output[0] if is_seq else output
        if self.add is not None:
            x = x + self.add.to(x.dtype)
            output = (x, *output[1:]) if is_seq else x
        self.raw, self.out = x, self._pool(x)
        return output if self.add is not None else None

    def take(self) -> Tensor:
        """The pooled output, releasing the references the hook kept."""
        out, self.out, self.raw = self.out, None, None
        return self._recorded(out)

    def take_raw(self) -> Tensor:
        """The output before pooling (with the perturbation added), releasing the references."""
        raw, self.out, self.raw = self.raw, None, None
        return self._recorded(raw)

    def _recorded(self, x: Tensor | None) -> Tensor:
        if x is None:
            raise RuntimeError(f"layer {self.name!r}: no output recorded; read a tap once, "
                               "after a forward inside armed_taps")
        return x

    def _pool(self, x: Tensor) -> Tensor:
        if x.dim() == 4:  # N C H W -> global average pool
            return x.mean(dim=(2, 3))
        if x.dim() == 3:  # N L C tokens
            return x[:, 0] if self.token_pool == "cls" else x[:, self.num_prefix :].mean(dim=1)
        if x.dim() == 2:
            return x
        raise ValueError(f"layer {self.name!r}: cannot pool an output of shape {tuple(x.shape)}")


def attach_taps(model: nn.Module, names: Sequence[str], token_pool: str) -> list[Tap]:
    pool = token_pool
    if pool == "auto":
        pool = "cls" if getattr(model, "cls_token", None) is not None else "mean"
    prefix = int(getattr(model, "num_prefix_tokens", 0))
    taps = []
    for name in names:
        try:
            module = model.get_submodule(name)
        except AttributeError as e:
            known = [n for n, _ in model.named_modules() if n][:12]
            raise ValueError(
                f"no submodule {name!r} in {type(model).__name__} (e.g. {known})"
            ) from e
        tap = Tap(name, pool, prefix)
        module.register_forward_hook(tap)
        taps.append(tap)
    return taps


@contextlib.contextmanager
def armed_taps(taps: Sequence[Tap], adds: dict[int, Tensor] | None = None) -> Iterator[None]:
    for i, tap in enumerate(taps):
        tap.arm((adds or {}).get(i))
    try:
        yield
    finally:
        for tap in taps:
            tap.armed, tap.add = False, None
    for tap in taps:
        if tap.calls != 1:
            raise RuntimeError(
                f"layer {tap.name!r} ran {tap.calls} times in one forward; pick "
                "a module that runs exactly once"
            )


def module_device(module: nn.Module) -> torch.device:
    return next(module.parameters(), torch.empty(0)).device


@contextlib.contextmanager
def bn_stats_kept(module: nn.Module) -> Iterator[None]:
    """Restore BatchNorm running statistics after the block (pass 1 must not update them)."""
    bns = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [[b.clone() for b in m.buffers()] for m in bns]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, bufs in zip(bns, saved):
                for b, s in zip(m.buffers(), bufs):
                    b.copy_(s)


class Renormalise(nn.Module):
    """Images normalised one way, x = (u - mean_from) / std_from, normalised another way:
    ``(x * std_from + mean_from - mean_to) / std_to`` (= (u - mean_to) / std_to), per channel.

    Why: a distillation's teacher sees the normalisation its weights were trained with while
    the student sees the recipe's, from ONE pipeline (one crop of each image for both): the
    pipeline normalises for the student and the method re-normalises the teacher's copy on the
    device. The statistics are float64 non-persistent buffers (they follow ``.to(device)``,
    stay out of checkpoints) cast to the input's dtype when applied.
    """

    mean_from: Tensor
    std_from: Tensor
    mean_to: Tensor
    std_to: Tensor

    def __init__(self, mean_from: Sequence[float], std_from: Sequence[float],
                 mean_to: Sequence[float], std_to: Sequence[float]) -> None:
        super().__init__()
        stats = {"mean_from": mean_from, "std_from": std_from, "mean_to": mean_to, "std_to": std_to}
        for name, values in stats.items():
            t = torch.tensor([float(v) for v in values], dtype=torch.float64)
            if t.numel() not in (1, 3) or (name.startswith("std") and bool((t <= 0).any())):
                raise ValueError(f"Renormalise: {name} must be 1 or 3 numbers (std above 0), "
                                 f"got {list(values)}")
            self.register_buffer(name, t.view(1, -1, 1, 1), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        std_from, mean_from, mean_to, std_to = (
            b.to(dtype=x.dtype) for b in (self.std_from, self.mean_from, self.mean_to, self.std_to))
        return (x * std_from + mean_from - mean_to) / std_to

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={[round(float(v), 4) for v in b.flatten()]}"
                         for k, b in self.named_buffers())
