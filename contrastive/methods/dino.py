"""DINO: self-distillation with no labels, a momentum teacher, centring and sharpening.

Caron et al., "Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021
(arXiv 2104.14294); the authors' code is facebookresearch/dino (``main_dino.py``,
``vision_transformer.py``: ``DINOHead``).

One step (paper Algorithm 1)::

    teacher <- m * teacher + (1 - m) * student                    # m: cosine 0.996 -> 1
    t = teacher(global views)          (B, 2, K), no gradient
    s = student(every view)            (B, V, K)                   # 2 global + local crops
    loss = mean over pairs (t_i, s_v), v != i, of CE(softmax((t_i - C) / tau_t), softmax(s_v / tau_s))
    C <- 0.9 C + 0.1 mean(t)           # over the GLOBAL batch (all-reduced), a buffer

The head is ``DINOHead``: an MLP (3 layers, 2048 hidden, GELU) to a 256-d bottleneck, L2
normalisation, then a weight-normalised linear layer to K = 65536 prototypes without bias, its
norm fixed at 1 (``norm_last_layer``). Declared schedules: ``momentum``, ``teacher_temperature``
(linear warm-up from ``warmup_teacher_temperature`` over ``warmup_teacher_steps``, then
constant; the code's 0.04 -> 0.04, or 0.04 -> 0.07 over 30 epochs for ViT-S/16) and
``weight_decay`` (cosine ``weight_decay`` -> ``weight_decay_end``: 0.04 -> 0.4), and the last
layer frozen for ``freeze_last_layer_steps`` (the code's first epoch) as a parameter group.
``--clip-grad-norm`` clips each parameter's gradient apart with ``clip_mode="parameter"`` (the
code's ``utils.clip_gradients``, ``--clip_grad 3.0``; :func:`~contrastive.methods.base.clip_parts_by`),
set by the ``vit_small`` preset.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from contrastive.losses.clustering import dino, dino_center
from contrastive.methods._common import width
from contrastive.methods.base import (
    Method,
    ParamGroup,
    Schedule,
    check_clip_mode,
    clip_parts_by,
    read,
    views_of,
)
from contrastive.methods.registry import register_method
from contrastive.nn import MomentumEncoder, build_mlp, cosine_momentum, resolve_encoder
from contrastive.nn.encoders import strip_drop_path

__all__ = ["DINO", "DINOHead"]


class DINOHead(nn.Module):
    """MLP -> L2-normalised bottleneck -> weight-normalised prototypes (official ``DINOHead``)."""

    def __init__(self, in_dim: int, out_dim: int = 65536, hidden_dim: int = 2048,
                 bottleneck_dim: int = 256, num_layers: int = 3, use_bn: bool = False,
                 norm_last_layer: bool = True) -> None:
        super().__init__()
        self.mlp = build_mlp(in_dim, hidden_dim, bottleneck_dim, num_layers, hidden_bn=use_bn,
                             bias=True, activation=nn.GELU)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):  # the code: trunc_normal_(std=.02), zero bias
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        with torch.no_grad():
            self.last_layer.parametrizations.weight.original0.fill_(1.0)
        if norm_last_layer:
            self.last_layer.parametrizations.weight.original0.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2))


def _teacher_temperature(step: int, total: int, *, start: float, end: float,
                         warmup: int) -> float:
    return end if step >= warmup else start + (end - start) * step / max(1, warmup)


def _cosine_value(step: int, total: int, *, start: float, end: float) -> float:
    """The code's ``cosine_scheduler`` per step: start -> end over the run."""
    return end + (start - end) * (1 + math.cos(math.pi * min(step, total) / max(1, total))) / 2


def teacher_schedules(base_momentum: float,
                      temperatures: dict[str, tuple[float, float, int]],
                      weight_decays: tuple[float, float] | None) -> dict[str, Schedule]:
    """The schedules of a DINO-family method (DINO, iBOT): the teacher's cosine momentum, each
    teacher temperature ``(start, end, warm-up steps)`` by name, and the cosine weight decay when
    given."""
    out: dict[str, Schedule] = {
        "momentum": functools.partial(cosine_momentum, m0=base_momentum)}
    for name, (start, end, warmup) in temperatures.items():
        out[name] = functools.partial(_teacher_temperature, start=start, end=end, warmup=warmup)
    if weight_decays is not None:
        out["weight_decay"] = functools.partial(_cosine_value, start=weight_decays[0],
                                                end=weight_decays[1])
    return out


def build_teacher(student: nn.Module) -> MomentumEncoder:
    """DINO's and iBOT's momentum teacher: a copy of the ``student`` parts without drop path
    (:func:`~contrastive.nn.encoders.strip_drop_path`: the authors' teachers have none and,
    like theirs, this one runs in train mode)."""
    teacher = MomentumEncoder(student)
    strip_drop_path(teacher.module)
    return teacher


def teacher_step_spans(method: Any) -> dict[str, int]:
    """DINO's and iBOT's settings in steps (:meth:`Method.step_spans`): the teacher
    temperature's warm-up and the frozen last layer."""
    start, end, steps = method.teacher_temperatures
    warm = {"warmup_teacher_steps": int(steps)} if start != end else {}  # equal: no warm-up
    return {**warm, "freeze_last_layer_steps": int(method.freeze_last_layer_steps)}


def last_layer_groups(heads: Sequence[DINOHead], frozen_steps: int,
                      frozen_by: str = "grad") -> list[ParamGroup]:
    """The heads' last layers as one group frozen for the first ``frozen_steps`` (DINO's
    ``freeze_last_layer``: gradients dropped; DINOv2's: ``frozen_by="lr"``, see
    :class:`ParamGroup`); none when 0."""
    if not frozen_steps:
        return []
    trainable = [p for h in heads for p in h.last_layer.parameters() if p.requires_grad]
    return [ParamGroup("last_layer", trainable, frozen_steps=frozen_steps, frozen_by=frozen_by)]


@register_method("dino")
class DINO(Method):
    """DINO for ResNets and ViTs (multi-crop: ``num_global`` global views first).

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        out_dim, hidden_dim, bottleneck_dim, head_layers, use_bn, norm_last_layer: the head
            (65536, 2048, 256, 3, False, True).
        momentum: m0 of the teacher's cosine schedule (0.996).
        student_temperature: 0.1; teacher_temperature: its final value (0.04);
        warmup_teacher_temperature / warmup_teacher_steps: the warm-up start and length.
        center_momentum: 0.9.
        weight_decay / weight_decay_end: the cosine weight-decay schedule (None: no schedule,
            the run's constant --weight-decay).
        freeze_last_layer_steps: the last layer does not move for that many steps (0: never
            frozen).
        clip_mode: what ``--clip-grad-norm`` clips apart (:meth:`clip_parts`): "all"
            parameters together (the engine's default), each "part" (encoder, head) or each
            "parameter" (the code's ``utils.clip_gradients``: each gradient times
            min(1, clip / (|g| + 1e-6))).
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    center: Tensor  # buffer (out_dim,): the running mean of the teacher outputs
    needs = ("views",)
    #: the teacher's backbone is exported and evaluated, as the authors' evaluations load it
    #: (facebookresearch/dino eval_knn.py, eval_linear.py: ``--checkpoint_key teacher``)
    evaluated = "teacher.module.0"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # ViT-S/16 with the code's defaults (main_dino.py): 65536 prototypes, m0 0.996,
        # teacher temperature 0.04 without warm-up, norm_last_layer; dynamic_img_size for the
        # 96-px local crops (timm resamples the 14 x 14 position embedding to 6 x 6, as the
        # code's vision_transformer.py interpolate_pos_encoding; a fixed-size ViT rejects them);
        # each parameter's gradient clipped apart (train_one_epoch: utils.clip_gradients)
        "vit_small": dict(encoder="timm:vit_small_patch16_224", out_dim=65536, momentum=0.996,
                          teacher_temperature=0.04, clip_mode="parameter",
                          # main_dino.py --drop_path_rate 0.1: the student's stochastic depth
                          # (the teacher is built without it: build_teacher)
                          encoder_kwargs=dict(dynamic_img_size=True, drop_path_rate=0.1)),
        # solo-learn scripts/pretrain/cifar/dino.yaml: ResNet-18, 2048 hidden, 256 bottleneck,
        # 4096 prototypes, tau 0.9995 -> 1
        "cifar": dict(encoder="cifar_resnet18", out_dim=4096, hidden_dim=2048,
                      bottleneck_dim=256, momentum=0.9995),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", out_dim: int = 65536,
                 hidden_dim: int = 2048, bottleneck_dim: int = 256, head_layers: int = 3,
                 use_bn: bool = False, norm_last_layer: bool = True, momentum: float = 0.996,
                 student_temperature: float = 0.1, teacher_temperature: float = 0.04,
                 warmup_teacher_temperature: float | None = None, warmup_teacher_steps: int = 0,
                 center_momentum: float = 0.9, num_global: int = 2,
                 weight_decay: float | None = None, weight_decay_end: float | None = None,
                 freeze_last_layer_steps: int = 0, clip_mode: str = "all",
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        check_clip_mode("DINO", clip_mode)
        if not 0.0 <= momentum <= 1.0 or not 0.0 <= center_momentum <= 1.0:
            raise ValueError(f"DINO: momentum and center_momentum must be in [0, 1], got "
                             f"{momentum}, {center_momentum}")
        if (weight_decay is None) != (weight_decay_end is None):
            raise ValueError("DINO: give both weight_decay and weight_decay_end (the cosine "
                             "schedule), or neither")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.head = DINOHead(width(self.encoder), out_dim, hidden_dim, bottleneck_dim,
                             head_layers, use_bn, norm_last_layer)
        self.teacher = build_teacher(nn.Sequential(self.encoder, self.head))
        self.register_buffer("center", torch.zeros(out_dim))
        self.base_momentum, self.num_global = momentum, num_global
        self.student_temperature, self.center_momentum = student_temperature, center_momentum
        self.teacher_temperatures = (
            teacher_temperature if warmup_teacher_temperature is None
            else warmup_teacher_temperature, teacher_temperature, warmup_teacher_steps)
        self.weight_decays = (None if weight_decay is None or weight_decay_end is None
                              else (weight_decay, weight_decay_end))  # both or neither (above)
        self.freeze_last_layer_steps, self.clip_mode = freeze_last_layer_steps, clip_mode

    def schedules(self) -> dict[str, Schedule]:
        return teacher_schedules(self.base_momentum,
                                 {"teacher_temperature": self.teacher_temperatures},
                                 self.weight_decays)

    def param_groups(self) -> list[ParamGroup]:
        return last_layer_groups([self.head], self.freeze_last_layer_steps)

    def step_spans(self) -> dict[str, int]:
        return teacher_step_spans(self)

    def clip_parts(self) -> dict[str, list[nn.Parameter]]:
        """The student's parts for ``clip_mode`` (:func:`~contrastive.methods.base.clip_parts_by`):
        ``encoder`` and ``head``, or each of their trainable parameters; none with "all"."""
        return clip_parts_by(self.clip_mode, {"encoder": list(self.encoder.parameters()),
                                              "head": list(self.head.parameters())})

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "DINO", min_n=self.num_global)
        m = read(batch, "momentum", "DINO")
        tau_t = read(batch, "teacher_temperature", "DINO")
        with torch.no_grad():
            self.teacher.update([*self.encoder.parameters(), *self.head.parameters()], m)
            teacher = torch.stack([self.teacher(x) for x in views[: self.num_global]], dim=1)
        feats = [self.encoder(x) for x in views]
        student = torch.stack([self.head(f) for f in feats], dim=1)  # B x V x K
        loss = dino(student, teacher, self.center, student_temperature=self.student_temperature,
                    teacher_temperature=tau_t)
        with torch.no_grad():
            probs = F.softmax((teacher[:, 0] - self.center) / tau_t, dim=1)
            entropy = -(probs * probs.clamp_min(1e-12).log()).sum(1).mean()  # collapse monitor
            self.center.copy_(dino_center(self.center, teacher, momentum=self.center_momentum))
        return {"loss": loss, "teacher_entropy": entropy, "embeddings": F.normalize(feats[0].detach(), dim=1)}
