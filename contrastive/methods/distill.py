"""COS-NCE contrastive distillation for any teacher and student image encoder.

Fu et al., "LRC-BERT: Latent-representation Contrastive Knowledge Distillation for Natural
Language Understanding", AAAI 2021 (arXiv 2012.07335), carried from BERT layers to encoder stages.

One step (``Distiller.forward``) on a batch x::

    t_j = pool(teacher stage j (x))              frozen teacher, eval mode, no grad, once a step
    s_i = W_i pool(student stage i (x))          student stage i -> teacher stage phi(i)
    L = alpha * mean_i COS-NCE(s_i, t_phi(i), negatives)     (registry "cosnce")
      + beta  * KD(student_logits, teacher_logits, t=1.1)    (teacher has a classifier)
      + gamma * CE(student_logits, labels)                   (labels given; -1 = unlabelled)
    (alpha, beta, gamma) = (1, 0, 0) for the first 80 % of steps, then (1, 1, 3)

COS-NCE with g(x, y) = 1 - cos(x, y) and K negatives n_k (teacher features of other images):
(2K - (sum_k g(n_k, s) - K g(t, s))) / 2K + g(t, s), averaged over the batch (see
``contrastive.losses.functional.cosnce``); s, t and the negatives are made unit here.

Pooling: global average over H, W for (N, C, H, W) stage outputs; the class token (or the mean
of the patch tokens, ``token_pool="mean"``) for (N, L, C) ViT blocks. Stage outputs come from
forward hooks on named submodules, so the encoders run their ordinary ``forward``.

Negatives for COS-NCE: the other samples of the batch (K = N - 1; with several processes the
teacher features of all processes are gathered, K = world * N - 1), or with ``queue_size > 0`` a
:class:`~contrastive.nn.KeyQueue` of past teacher features per teacher stage.

Gradient perturbation (``perturb=True``, the paper's default) costs a second student pass:
pass 1 computes L and g = dL/d emb at the student's stem output emb (the patch embedding for a
ViT); pass 2 recomputes the student with emb' = emb + eps * g_i / ||g_i||_2, normalised per
sample i over all of its elements, g detached; the loss of pass 2 is returned and trained on.
Pass 1 does not update BatchNorm running statistics (they are restored), so the only effect of
the extra pass is the perturbation. The teacher runs once per step.

Normalisation: ``input_norm`` (the batch's mean, std) and ``teacher_norm`` (those the teacher's
weights were trained with), when both are given and differ, re-normalise the teacher's input
only, ``(x * std_s + mean_s - mean_t) / std_t`` on the device (:class:`Renormalise`): one
pipeline normalises the images for the student, the teacher sees them as it was trained to.

Stage switch: the ``"stage"`` schedule (:meth:`Distiller.schedules`) is 1 before
``switch_step`` and 2 from it on, ``switch_step = round(stage1_fraction * total_steps)`` unless
given; the training loop evaluates it once per optimiser step and passes ``batch["stage"]`` (so
micro-batches of one step share a stage and a resumed run continues the schedule: it is a
function of the step, nothing is checkpointed for it).
The student classifier ``head`` is only called when beta or gamma is non-zero: under DDP use
``find_unused_parameters=True`` when it exists (``needs_find_unused_parameters``).

Learning check (tests/distill/test_learning.py, shapes 32 px, CPU minutes, no labels): a student
distilled with COS-NCE alone reaches 62.6 % linear-probe top-1 against 19.7 % at random init and
80.1 % for its teacher. For small CNN students at such budgets mapping only the last stage
(``student_layers=["blocks.3"], layer_map=[3]``) learnt faster than the all-stage uniform map
(benchmarks/results/distill.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import in_batch_metrics, queue_metrics, unit, wide, width
from contrastive.methods.base import read, views_of
from contrastive.methods.distill_layers import (
    Renormalise,
    armed_taps,
    attach_taps,
    bn_stats_kept,
    default_layers,
    default_stem,
    module_device,
    uniform_layer_map,
)
from contrastive.methods.distill_parts import ContrastiveDistillation, Weights
from contrastive.methods.registry import register_method
from contrastive.nn import KeyQueue, resolve_encoder, split_classifier

__all__ = ["Distiller", "default_layers", "default_stem", "split_classifier", "uniform_layer_map"]


def _floats(norm: tuple[Sequence[float], Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in t) for t in norm)


@dataclass
class _Targets:
    """The teacher's side of a step, shared by both student passes."""

    weights: Weights  # (alpha, beta, gamma) of the step's stage
    t: list[Tensor]  # unit teacher features per used teacher layer, (N, D_j)
    neg: list[Tensor | None]  # their negatives (see Distiller._negatives)
    soft: Tensor | None  # teacher logits when the KD soft loss is on
    hard: Tensor | None  # labels (N,) when the CE hard loss is on


@register_method("distill")
class Distiller(ContrastiveDistillation):
    """COS-NCE distillation of a frozen ``teacher`` into a ``student`` (see the module docstring).

    Args:
        teacher: encoder name (``create_encoder``) or module with ``num_features``, returning
            pooled features; frozen (eval mode, ``requires_grad=False``, never optimised).
        student: the same for the student (``self.encoder``, what gets exported).
        teacher_head: classifier on the teacher's pooled features (enables the KD soft loss);
            see :func:`split_classifier` for a timm / torchvision classification model.
        num_classes: build a student ``head`` for the CE hard loss without a teacher head
            (with one, the head has the teacher's number of classes).
        student_layers, teacher_layers: module names of the distilled stages
            (:func:`default_layers`); layer_map: teacher-layer index phi(i) for each student
            layer (default :func:`uniform_layer_map`).
        token_pool: ``"auto"`` (class token when the model has one, else mean), ``"cls"``,
            ``"mean"``: pooling of (N, L, C) token outputs.
        queue_size: 0 = in-batch negatives; K > 0 = a queue of K teacher features per stage.
        stage_weights: (alpha, beta, gamma) of stage 1 and stage 2 (paper: (1,0,0), (1,1,3)).
        stage1_fraction, switch_step: stage 2 starts at optimiser step ``switch_step``, default
            ``round(stage1_fraction * total_steps)`` of the run (the ``"stage"`` schedule).
        use_labels: read ``batch["labels"]`` for the CE hard loss (default: when there is a
            student ``head``); -1 marks an unlabelled image.
        temperature: KD temperature t (1.1).
        perturb, perturb_scale, stem: gradient perturbation, its norm eps (1.0) and the student
            module whose output is perturbed (:func:`default_stem`).
        image_size: side of the dummy input used once to find the feature widths (default:
            the ViT's ``patch_embed.img_size``, else 32).
        teacher_kwargs, student_kwargs: ``create_encoder`` keyword arguments for names.
        input_norm, teacher_norm: (mean, std) of the batch's images and of the teacher's
            training inputs; the teacher's input is re-normalised when they differ (both given).

    ``forward(batch) -> dict``: ``batch["views"]`` holds one (N, 3, H, W) batch (teacher and
    student see the same images), ``batch["stage"]`` is 1 or 2 (the schedule), and with
    ``use_labels`` ``batch["labels"]`` (N,) int64 class labels (-1 = none).
    Returns ``loss`` and detached metrics: ``loss_cosnce``, ``loss_soft``, ``loss_hard``,
    ``cosnce_layers`` (M,), ``stage``, ``pos_acc``/``pos_sim``/``neg_sim`` (deepest mapped
    layer: % of samples closer to their own teacher feature than to every negative, mean
    cosines), ``embeddings`` (unit projected deepest student features), and ``loss_pass1``
    with perturbation.
    """

    def __init__(
        self,
        teacher: str | nn.Module,
        student: str | nn.Module = "small_cnn",
        *,
        teacher_head: nn.Module | None = None,
        num_classes: int | None = None,
        student_layers: Sequence[str] | None = None,
        teacher_layers: Sequence[str] | None = None,
        layer_map: Sequence[int] | None = None,
        token_pool: str = "auto",
        queue_size: int = 0,
        stage_weights: tuple[Weights, Weights] = ((1.0, 0.0, 0.0), (1.0, 1.0, 3.0)),
        stage1_fraction: float = 0.8,
        switch_step: int | None = None,
        use_labels: bool | None = None,
        temperature: float = 1.1,
        perturb: bool = True,
        perturb_scale: float = 1.0,
        stem: str | None = None,
        image_size: int | None = None,
        teacher_kwargs: dict[str, Any] | None = None,
        student_kwargs: dict[str, Any] | None = None,
        input_norm: tuple[Sequence[float], Sequence[float]] | None = None,
        teacher_norm: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> None:
        super().__init__()
        if token_pool not in ("auto", "cls", "mean"):
            raise ValueError(f"token_pool must be 'auto', 'cls' or 'mean', got {token_pool!r}")
        self._init_stages(stage_weights, stage1_fraction, switch_step)
        if queue_size < 0 or perturb_scale < 0:
            raise ValueError(f"need queue_size >= 0, perturb_scale >= 0; got {queue_size}, "
                             f"{perturb_scale}")
        self.teacher = resolve_encoder(teacher, **(teacher_kwargs or {}))
        self.encoder = resolve_encoder(student, **(student_kwargs or {}))
        self.teacher_head = teacher_head
        for m in (self.teacher, self.teacher_head):
            if m is not None:
                m.requires_grad_(False).eval()
        self.teacher_input = (
            Renormalise(*input_norm, *teacher_norm)
            if input_norm is not None and teacher_norm is not None
            and _floats(input_norm) != _floats(teacher_norm) else None)

        s_names = list(student_layers or default_layers(self.encoder))
        t_names = list(teacher_layers or default_layers(self.teacher))
        phi = (
            list(layer_map)
            if layer_map is not None
            else uniform_layer_map(len(s_names), len(t_names))
        )
        if len(phi) != len(s_names) or not all(0 <= j < len(t_names) for j in phi):
            raise ValueError(
                f"layer_map must give a teacher index in 0..{len(t_names) - 1} for "
                f"each of the {len(s_names)} student layers, got {phi}"
            )
        self.teacher_ids = sorted(set(phi))  # teacher layers actually needed
        self.layer_map = [self.teacher_ids.index(j) for j in phi]  # student i -> position
        self.student_layers, self.teacher_layers = s_names, [t_names[j] for j in self.teacher_ids]
        # the stem hook first: a layer tap on the same module then sees the perturbed output
        self.stem = (stem or default_stem(self.encoder)) if perturb else None
        self._stem_tap = (attach_taps(self.encoder, [self.stem], token_pool)[0]
                          if self.stem is not None else None)
        self._s_taps = attach_taps(self.encoder, s_names, token_pool)
        self._t_taps = attach_taps(self.teacher, self.teacher_layers, token_pool)

        s_dims, t_dims, n_logits = self._probe(image_size)
        self.projections = nn.ModuleList(
            nn.Linear(s_dims[i], t_dims[self.layer_map[i]], bias=False) for i in range(len(s_names))
        )
        if n_logits is not None and num_classes not in (None, n_logits):
            raise ValueError(
                f"num_classes={num_classes} differs from the teacher head's {n_logits} classes"
            )
        n_cls = n_logits or num_classes
        self.head = nn.Linear(width(self.encoder), n_cls) if n_cls else None
        self.queues = nn.ModuleList(KeyQueue(d, queue_size) for d in t_dims) if queue_size else None
        self.uses_in_batch_negatives = not queue_size

        self.use_labels = self.head is not None if use_labels is None else bool(use_labels)
        self.needs = ("views", "labels") if self.use_labels else ("views",)

        self.temperature, self.perturb, self.perturb_scale = temperature, perturb, perturb_scale
        self.cosnce = get_loss("cosnce", normalize=False)  # inputs are made unit here
        self.kd = get_loss("kd", temperature=temperature)

    # -- set-up ------------------------------------------------------------------------------
    @torch.no_grad()
    def _probe(self, image_size: int | None) -> tuple[list[int], list[int], int | None]:
        fixed = [
            getattr(getattr(m, "patch_embed", None), "img_size", None)
            for m in (self.teacher, self.encoder)
        ]
        size = image_size or next((s for s in fixed if s), 32)
        size = size[0] if isinstance(size, (tuple, list)) else size
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            x = torch.zeros(2, 3, int(size), int(size))
            with armed_taps(self._s_taps):
                self.encoder(x.to(module_device(self.encoder)))
            feats, logits = self._teacher_forward(x.to(module_device(self.teacher)))
        finally:
            self.encoder.train(was_training)
        s_dims = [t.take().shape[-1] for t in self._s_taps]
        return s_dims, [f.shape[-1] for f in feats], None if logits is None else logits.shape[1]

    # -- passes --------------------------------------------------------------------------------
    @torch.no_grad()
    def _teacher_forward(self, x: Tensor) -> tuple[list[Tensor], Tensor | None]:
        if self.teacher_input is not None:
            x = self.teacher_input(x)
        with armed_taps(self._t_taps):
            pooled = self.teacher(x)
        logits = self.teacher_head(pooled) if self.teacher_head is not None else None
        return [unit(t.take().detach()) for t in self._t_taps], logits

    def _negatives(self, feats: list[Tensor]) -> list[Tensor | None]:
        """Per teacher layer: the queue (K, D) with ``queue_size``, else the in-batch / gathered
        negatives of :class:`~contrastive.methods.distill_parts.ContrastiveDistillation`."""
        if self.queues is not None:
            return [q.keys for q in self._queue_list()]
        return super()._negatives(feats)

    def _queue_list(self) -> list[KeyQueue]:
        """``self.queues`` (an untyped ``nn.ModuleList``, built of KeyQueues in __init__)."""
        return [cast(KeyQueue, q) for q in self.queues] if self.queues is not None else []

    def _student_pass(
        self, x: Tensor, ctx: _Targets, delta: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        taps = self._s_taps + ([self._stem_tap] if self._stem_tap is not None else [])
        adds = {len(taps) - 1: delta} if delta is not None else None
        with armed_taps(taps, adds):
            pooled = self.encoder(x)
        alpha, beta, gamma = ctx.weights
        feats = [unit(proj(t.take())) for proj, t in zip(self.projections, self._s_taps)]
        layers = torch.stack(
            [self.cosnce(s, ctx.t[j], ctx.neg[j]) for s, j in zip(feats, self.layer_map)]
        )
        parts = {"cosnce": layers.mean(), "layers": layers, "last": feats[-1]}
        loss = alpha * parts["cosnce"]
        if self.head is not None and (ctx.soft is not None or ctx.hard is not None):
            logits = self.head(pooled)
            if ctx.soft is not None:
                parts["soft"] = self.kd(logits, ctx.soft)
                loss = loss + beta * parts["soft"]
            if ctx.hard is not None:
                labels = ctx.hard
                known = labels >= 0
                ce = F.cross_entropy(wide(logits), labels.clamp(min=0), reduction="none")
                parts["hard"] = (ce * known).sum() / known.sum().clamp(min=1)
                loss = loss + gamma * parts["hard"]
        if self._stem_tap is not None:
            parts["emb"] = self._stem_tap.take_raw()
        return loss, parts

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = read(batch, "views", "Distiller")
        if isinstance(views, Sequence) and len(views) != 1:
            raise ValueError(
                f"Distiller: batch['views'] must hold one (N, 3, H, W) batch, got {len(views)} "
                "views (teacher and student see the same images: use a 1-view pipeline)"
            )
        (x,) = views_of(batch, "Distiller", n=1)
        stage = int(read(batch, "stage", "Distiller"))
        weights = self.weights_at(stage)
        labels = read(batch, "labels", "Distiller") if self.use_labels else None
        t_feats, t_logits = self._teacher_forward(x)
        has_head = self.head is not None
        if labels is not None and labels.shape != x.shape[:1]:
            raise ValueError(f"labels must be ({x.shape[0]},), got {tuple(labels.shape)}")
        ctx = _Targets(
            weights=weights,
            t=t_feats,
            neg=self._negatives(t_feats),
            soft=t_logits if has_head and weights[1] != 0 else None,
            hard=labels if has_head and weights[2] != 0 else None,
        )
        train_step = self.training and torch.is_grad_enabled()
        out: dict[str, Tensor] = {}
        if self.perturb and train_step:  # pass 1 keeps BatchNorm statistics (restored after)
            loss, parts, out["loss_pass1"] = self._perturbed_pass(
                lambda delta: self._student_pass(x, ctx, delta), self.perturb_scale,
                lambda: bn_stats_kept(self.encoder))
        else:
            loss, parts = self._student_pass(x, ctx)
        for q, f in zip(self._queue_list(), t_feats):
            q.enqueue(f)
        out.update(
            self._metrics(parts, t_feats[self.layer_map[-1]], ctx.neg[self.layer_map[-1]])
        )
        out.update(
            loss=loss,
            stage=torch.tensor(float(stage), device=loss.device),
            loss_cosnce=parts["cosnce"].detach(),
            cosnce_layers=parts["layers"].detach(),
        )
        for k in ("soft", "hard"):
            if k in parts:
                out[f"loss_{k}"] = parts[k].detach()
        return out

    @torch.no_grad()
    def _metrics(
        self, parts: dict[str, Tensor], t: Tensor, neg: Tensor | None
    ) -> dict[str, Tensor]:
        s = parts["last"].detach()  # unit rows, like t and neg
        if neg is None:
            rows = torch.arange(s.shape[0], device=s.device)
            m = in_batch_metrics(s, t, pos_col=rows)
        elif neg.dim() == 2:
            m = queue_metrics(s, t, neg)
        else:  # per-sample negatives (N, K, D)
            sims = torch.einsum("nd,nkd->nk", s, neg)
            pos = (s * t).sum(dim=1)
            m = {
                "pos_acc": (pos >= sims.max(dim=1).values).float().mean() * 100.0,
                "pos_sim": pos.mean(),
                "neg_sim": sims.mean(),
            }
        return {**m, "embeddings": s}
