"""LRC-BERT: latent-representation contrastive distillation of a fine-tuned BERT (text).

Fu et al., "LRC-BERT: Latent-representation Contrastive Knowledge Distillation for Natural
Language Understanding", AAAI 2021 (arXiv 2012.07335). The authors published no code that we
could find; we checked the public reimplementation in ProFatXuanAll/BERT-gang
(``fine_tune/util/train_LRC.py``: per-layer linear "adaptive layers" student -> 768, COS-NCE
on the [CLS] row, teacher features of other inputs as negatives, a contrast-only first stage).

One step (:meth:`LRCBert.forward`) on a batch of token ids::

    H^T_j = teacher layer j (x)                    frozen fine-tuned teacher, no grad
    H^S_i = student layer i (x), i = 1..M          mapped to teacher layer phi(i) (uniform map)
    L_i   = COS-NCE(r(H^S_i W_i), r(H^T_phi(i)), negatives)       registry "cosnce"
    L     = alpha * mean_i L_i + beta * KD(z^S, z^T, t=1.1) + gamma * CE(z^S, y)
    (alpha, beta, gamma) = (1, 0, 0) for the first 80 % of optimiser steps, then (1, 1, 3)

with regression tasks (STS-B) using MSE for both the soft loss (to the teacher's score) and
the hard loss (to the label).

Representation r (the paper says "the output of the intermediate layer", a tokens x hidden
matrix, and compares it by angle): by default ``"tokens"``, the whole matrix with padded
positions set to zero, flattened to one (T * d) vector, so g = 1 - cos is the angle between the
two layer outputs as matrices (the Frobenius inner product). Why: it keeps every token, as
TinyBERT's hidden-state loss does for the same 4 x 312 student, while a [CLS] row (the
BERT-gang choice, ``"cls"``) or a masked mean (``"mean"``) throws the intermediate layers'
token-level structure away; zeroed padding makes it exact under any amount of padding (zero
entries change neither dot products nor norms), so batches padded to different lengths, or
processes padding to a common length, give the same loss. ``W_i`` is a learned linear map
(no bias: the paper's W; BERT-gang's adaptive layers have one) from the student's width to the
teacher's, applied per token. The layer losses are averaged over the M student layers (as in
the image Distiller), so alpha weighs the intermediate term the same whatever M.

Negatives: the teacher representations of the other samples of the batch (K = N - 1; the
paper: batch 16, K = 15). With several processes every process's teacher representations are
gathered (padded to the longest sequence of all processes first) and a sample's negatives are
the global batch minus itself, K = world * N - 1. The negatives come from the frozen teacher,
so no gradient flows through them (gathered with or without gradient is the same).

Gradient perturbation (``perturb=True``): pass 1 computes L and g = dL/d emb at the student's
embedding-layer output emb (B, T, H); pass 2 reruns the student with emb' = emb + eps * g_i /
||g_i||_2 (per sample over all its tokens and hidden units, g detached; eps = 1); the loss of
pass 2 is returned and trained on. The teacher runs once per step, and not at all in a stage that weighs it 0 (0:0:gamma).

Pre-training distillation (the paper's first stage, on unlabelled text before the task stage):
a teacher encoder without a prediction layer, COS-NCE alone, no labels; the student is written
as a Hugging Face folder (:meth:`LRCBert.sentence_encoder`) that the task stage starts from.

Two stages, the frozen teacher, the negatives of several processes and the perturbation are
shared with the image :class:`~contrastive.methods.distill.Distiller` through their common base,
:class:`~contrastive.methods.distill_parts.ContrastiveDistillation` (the ``"stage"`` schedule: 1,
then 2 from ``round(0.8 * total_steps)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import batch_accuracy, in_batch_metrics, unit, wide
from contrastive.methods.base import read
from contrastive.methods.distill_layers import uniform_layer_map
from contrastive.methods.distill_parts import ContrastiveDistillation, Weights
from contrastive.methods.registry import register_method
from contrastive.methods.text_classifier import TEXT_KEYS, TextClassifier, encoder_inputs, task_loss
from contrastive.nn.distributed import world_size
from contrastive.nn.text_encoders import TextEncoder

__all__ = ["REPRESENTATIONS", "LRCBert", "layer_representation"]

REPRESENTATIONS = ("tokens", "mean", "cls")


def layer_representation(h: Tensor, mask: Tensor, how: str = "tokens", length: int | None = None
                         ) -> Tensor:
    """One vector per sample from a layer output h (B, T, D) and its attention mask (B, T).

    ``"tokens"``: padded positions zeroed, padded with zero tokens to ``length`` (default T),
    flattened: (B, length * D). ``"mean"``: masked mean over real tokens (B, D). ``"cls"``: the
    first token (B, D). See the module docstring for the choice.
    """
    if how == "cls":
        return h[:, 0]
    m = mask.to(h.dtype).unsqueeze(-1)
    if how == "mean":
        return (h * m).sum(1) / m.sum(1).clamp(min=1.0)
    if how != "tokens":
        raise ValueError(f"representation must be one of {REPRESENTATIONS}, got {how!r}")
    h = h * m
    if length is not None and length > h.shape[1]:
        h = F.pad(h, (0, 0, 0, length - h.shape[1]))
    return h.flatten(1)


@register_method("lrc_bert")
class LRCBert(ContrastiveDistillation):
    """LRC-BERT distillation of a fine-tuned ``teacher`` into a ``student`` encoder.

    Args:
        teacher: a fine-tuned :class:`~contrastive.methods.text_classifier.TextClassifier` (frozen here:
            eval mode, ``requires_grad=False``); its prediction layer gives the soft targets.
            Or a :class:`~contrastive.nn.text_encoders.TextEncoder` without one (the paper's
            pre-training distillation, ``recipes/lrc_bert_pretrain.py``): then COS-NCE is the
            only loss (stage weights ``(alpha, 0, 0)``), there is no ``head`` and no labels.
        student: a :class:`~contrastive.nn.text_encoders.TextEncoder` (``self.encoder``); a new
            prediction layer ``head`` is built for it (the teacher's number of labels).
        layer_map: teacher layer (0-based) for each student layer; default the paper's uniform
            map (4 of 12: layers 3, 6, 9, 12).
        representation: ``"tokens"`` (default), ``"mean"`` or ``"cls"``: see the module.
        intermediate: ``"cosnce"`` (the paper) or ``"mse"`` (the ablation: mean squared error
            between W H^S and H^T over real tokens).
        stage_weights, stage1_fraction, switch_step: the two stages (``(1,0,0), (1,1,3)``, 0.8).
        temperature: of the soft loss (1.1).
        perturb, perturb_scale: gradient perturbation and its norm eps (1.0).

    A stage with alpha = 0 skips the intermediate layers (plain KD: soft + hard loss).

    ``forward(batch)``: ``input_ids``, ``attention_mask``, ``token_type_ids`` (optional),
    ``labels`` (N,) and ``stage`` (the schedule). Returns ``loss`` and detached metrics:
    ``loss_intermediate``, ``intermediate_layers`` (M,), ``loss_soft`` / ``loss_hard``
    (stage 2), ``loss_pass1`` (with perturbation), ``stage``, ``pos_acc`` / ``pos_sim`` /
    ``neg_sim`` (deepest layer), ``accuracy`` (classification; with perturbation, of the
    perturbed pass, which can sit near the majority class while the student learns the task),
    ``accuracy_pass1`` (with perturbation: of the unperturbed pass) and ``embeddings``.
    """

    needs: tuple[str, ...] = TEXT_KEYS
    uses_in_batch_negatives = True

    def __init__(
        self,
        teacher: TextClassifier | TextEncoder,
        student: TextEncoder,
        *,
        layer_map: Sequence[int] | None = None,
        representation: str = "tokens",
        intermediate: str = "cosnce",
        stage_weights: tuple[Weights, Weights] = ((1.0, 0.0, 0.0), (1.0, 1.0, 3.0)),
        stage1_fraction: float = 0.8,
        switch_step: int | None = None,
        temperature: float = 1.1,
        perturb: bool = True,
        perturb_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if representation not in REPRESENTATIONS:
            raise ValueError(f"representation must be one of {REPRESENTATIONS}, got "
                             f"{representation!r}")
        if intermediate not in ("cosnce", "mse"):
            raise ValueError(f"intermediate must be 'cosnce' or 'mse', got {intermediate!r}")
        self._init_stages(stage_weights, stage1_fraction, switch_step)
        if perturb_scale < 0 or temperature <= 0:
            raise ValueError(f"need perturb_scale >= 0, temperature > 0; got {perturb_scale}, "
                             f"{temperature}")
        classifier = callable(getattr(teacher, "predict", None))
        teacher_encoder: TextEncoder = (cast(TextClassifier, teacher).encoder if classifier
                                        else cast(TextEncoder, teacher))
        for name, m in (("teacher", teacher_encoder), ("student", student)):
            if not callable(getattr(m, "encode", None)):
                raise TypeError(f"LRCBert: {name} must be a TextClassifier or TextEncoder "
                                f"(teacher) / TextEncoder (student), got {type(m).__name__}")
        if not classifier and any(b or c for _, b, c in self.stage_weights):
            raise ValueError("LRCBert: a teacher without a prediction layer (pre-training "
                             "distillation) gives no soft or hard targets: stage weights must "
                             f"be (alpha, 0, 0), got {self.stage_weights}")
        self.teacher: TextClassifier | TextEncoder = teacher.requires_grad_(False).eval()
        self.encoder: TextEncoder = student
        n_s, n_t = student.num_layers, teacher_encoder.num_layers
        phi = list(layer_map) if layer_map is not None else uniform_layer_map(n_s, n_t)
        if len(phi) != n_s or not all(0 <= j < n_t for j in phi):
            raise ValueError(f"layer_map must give a teacher layer in 0..{n_t - 1} for each of "
                             f"the {n_s} student layers, got {phi}")
        self.layer_map = phi
        self.projections = nn.ModuleList(
            nn.Linear(student.hidden_size, teacher_encoder.hidden_size, bias=False)
            for _ in range(n_s))
        self.regression = bool(getattr(teacher, "regression", False))
        self.head: nn.Linear | None = None
        if classifier:
            self.head = nn.Linear(student.hidden_size, cast(TextClassifier, teacher).num_labels)
        self.needs = TEXT_KEYS if classifier else TEXT_KEYS[:3]  # no labels to read
        self.representation, self.intermediate = representation, intermediate
        self.temperature, self.perturb, self.perturb_scale = temperature, perturb, perturb_scale
        self.cosnce = get_loss("cosnce", normalize=False)  # inputs are made unit here
        self.kd = get_loss("kd", temperature=temperature)

    def predict(self, batch: Mapping[str, Any]) -> Tensor:
        """The student's logits (B, C) (scores (B, 1) for regression)."""
        if self.head is None:
            raise TypeError("LRCBert.predict: a pre-training distillation (a teacher without a "
                            "prediction layer) trains no prediction layer")
        ids, mask, types = encoder_inputs(batch, "LRCBert")
        return self.head(self.encoder.encode(ids, mask, types).pooled)

    def sentence_encoder(self) -> TextEncoder:
        """The student encoder: a pre-training distillation's artefact (``model/``, an ``hf:``
        folder a task distillation starts from with ``--student hf:FOLDER``)."""
        return self.encoder

    def _teacher_encoder(self) -> TextEncoder:
        """The teacher's encoder: the classifier's, or the teacher itself when it has no
        prediction layer (pre-training distillation)."""
        if self.head is None:
            return cast(TextEncoder, self.teacher)
        return cast(TextClassifier, self.teacher).encoder

    # -- pieces ----------------------------------------------------------------------------
    def _length(self, mask: Tensor) -> int:
        """Common sequence length of all processes (``"tokens"`` representations)."""
        t = mask.shape[1]
        if self.representation != "tokens" or world_size() == 1:
            return t
        n = torch.tensor([t], device=mask.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        return int(n.item())

    @torch.no_grad()
    def _teacher(self, ids: Tensor, mask: Tensor, types: Tensor | None, length: int
                 ) -> tuple[list[Tensor], list[Tensor], Tensor | None]:
        out = self._teacher_encoder().encode(ids, mask, types)
        logits = None
        if self.head is not None:
            classifier = cast(TextClassifier, self.teacher)
            logits = classifier.head(classifier.dropout(out.pooled))
        raw = [out.hidden_states[j] for j in self.layer_map]
        reps = [unit(layer_representation(h, mask, self.representation, length)) for h in raw]
        return reps, raw, logits

    def _intermediate(self, s_raw: list[Tensor], ctx: dict[str, Any]) -> Tensor:
        mask, length = ctx["mask"], ctx["length"]
        losses = []
        for i, (h, proj) in enumerate(zip(s_raw, self.projections)):
            p = proj(h)
            if self.intermediate == "mse":
                m = mask.to(p.dtype).unsqueeze(-1)
                diff = (wide(p) - wide(ctx["t_raw"][i])) * m
                losses.append(diff.pow(2).sum() / (m.sum() * p.shape[-1]).clamp(min=1.0))
            else:
                s = unit(layer_representation(p, mask, self.representation, length))
                losses.append(self.cosnce(s, ctx["t"][i], ctx["neg"][i]))
                if i == len(s_raw) - 1:
                    ctx["last"] = s
        return torch.stack(losses)

    def _student_pass(self, ctx: dict[str, Any], delta: Tensor | None = None
                      ) -> tuple[Tensor, dict[str, Tensor]]:
        out = self.encoder.encode(ctx["ids"], ctx["mask"], ctx["types"], embedding_delta=delta)
        alpha, beta, gamma = ctx["weights"]
        parts: dict[str, Tensor] = {"emb": out.embeddings}
        loss = out.embeddings.new_zeros(())
        if alpha:  # alpha = 0 (plain KD, a stage without COS-NCE): the layers are not compared
            layers = self._intermediate(list(out.hidden_states), ctx)
            parts.update(intermediate=layers.mean(), layers=layers)
            loss = alpha * parts["intermediate"]
        if beta or gamma:
            assert self.head is not None  # __init__: no soft or hard loss without a head
            logits = self.head(out.pooled)
            parts["logits"] = logits
            if beta:
                if self.regression:
                    parts["soft"] = F.mse_loss(wide(logits), wide(ctx["t_logits"]))
                else:
                    parts["soft"] = self.kd(logits, ctx["t_logits"])
                loss = loss + beta * parts["soft"]
            if gamma:
                parts["hard"] = task_loss(logits, ctx["labels"], self.regression)
                loss = loss + gamma * parts["hard"]
        return loss, parts

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        ids, mask, types = encoder_inputs(batch, "LRCBert")
        stage = int(read(batch, "stage", "LRCBert"))
        labels = read(batch, "labels", "LRCBert") if self.head is not None else None
        if labels is not None and labels.shape != ids.shape[:1]:
            raise ValueError(f"LRCBert: labels must be ({ids.shape[0]},), got "
                             f"{tuple(labels.shape)}")
        length = self._length(mask)
        weights = self.weights_at(stage)
        if weights[0] or weights[1]:
            t_reps, t_raw, t_logits = self._teacher(ids, mask, types, length)
            neg = self._negatives(t_reps)
        else:  # cross-entropy only (0:0:gamma): nothing reads the teacher; in eval mode it
            # draws no random numbers, so skipping it changes no result, only the time
            t_reps, t_raw, t_logits, neg = [], [], None, []
        ctx: dict[str, Any] = {
            "ids": ids, "mask": mask, "types": types, "labels": labels, "length": length,
            "weights": weights, "t": t_reps, "t_raw": t_raw, "neg": neg, "t_logits": t_logits,
        }
        result: dict[str, Tensor] = {}
        if self.perturb and self.training and torch.is_grad_enabled():
            loss, parts, result["loss_pass1"] = self._perturbed_pass(
                lambda delta: self._student_pass(ctx, delta), self.perturb_scale)
        else:
            loss, parts = self._student_pass(ctx)
        result.update(loss=loss, stage=torch.tensor(float(stage), device=loss.device))
        if "intermediate" in parts:
            result.update(loss_intermediate=parts["intermediate"].detach(),
                          intermediate_layers=parts["layers"].detach())
        for k in ("soft", "hard"):
            if k in parts:
                result[f"loss_{k}"] = parts[k].detach()
        if "logits" in parts and not self.regression:
            assert labels is not None  # a head (the task stage) reads them
            result["accuracy"] = batch_accuracy(parts["logits"], labels)
            if "logits_pass1" in parts:  # the unperturbed pass: what the student predicts
                result["accuracy_pass1"] = batch_accuracy(parts["logits_pass1"], labels)
        if "last" in ctx:
            s = ctx["last"].detach()
            t = t_reps[-1]
            neg = ctx["neg"][-1]
            if neg is None:
                result.update(in_batch_metrics(s, t, torch.arange(s.shape[0], device=s.device)))
            result["embeddings"] = s
        return result
