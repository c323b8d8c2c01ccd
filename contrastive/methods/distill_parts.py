"""What LRC-BERT's two distillers share: the two-stage schedule, negatives across processes and
the gradient perturbation (Fu et al., AAAI 2021, arXiv 2012.07335).

:class:`ContrastiveDistillation` is the base of the image :class:`~contrastive.methods.distill.
Distiller` and the text :class:`~contrastive.methods.lrc_bert.LRCBert`; each keeps what differs
(how features are read from the networks, the task losses) and inherits the rest:

- the two training stages: ``(alpha, beta, gamma)`` = ``stage_weights[0]`` (paper: 1:0:0) for
  the first ``stage1_fraction`` (0.8) of the optimiser steps, then ``stage_weights[1]`` (1:1:3);
  the ``"stage"`` schedule (a function of the step: nothing is checkpointed for it, a resumed
  run continues it, and micro-batches of one step share it);
- the teacher frozen in eval mode whatever ``train(mode)`` the student gets;
- negatives with several processes: every process's teacher rows but the sample's own
  (K = world * N - 1), gathered (the teacher is frozen: no gradient to carry);
- gradient perturbation: pass 1 computes L and g = dL/d emb at the student's embedding output,
  pass 2 reruns the student with emb + eps * g_i / ||g_i||_2 (per sample, g detached) and its
  loss is the one trained on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from contrastive.methods._common import wide
from contrastive.methods.base import Method, Schedule
from contrastive.nn.distributed import gather, rank, world_size

__all__ = ["ContrastiveDistillation", "StudentPass", "Weights", "unit_gradient"]

Weights = tuple[float, float, float]
StudentPass = Callable[[Tensor | None], tuple[Tensor, dict[str, Tensor]]]
"""One student pass: the embedding perturbation (or None) -> (loss, parts); ``parts["emb"]`` is
the embedding output that pass 1's gradient is taken at."""


def unit_gradient(g: Tensor, scale: float = 1.0) -> Tensor:
    """``scale * g_i / ||g_i||_2`` per sample i, the norm over all of its other dimensions."""
    norm = g.flatten(1).norm(dim=1).clamp(min=1e-12)
    return g * (scale / norm).view(-1, *[1] * (g.dim() - 1))


class ContrastiveDistillation(Method):
    """The stages, frozen teacher, negatives and perturbation of LRC-BERT (module docstring).

    Subclasses set ``self.teacher`` (and ``self.head``, the student's prediction layer, or
    None) and call :meth:`_init_stages` in their constructor.
    """

    teacher: Any
    head: Any
    backbones = ()  # the losses read intermediate layers: no --grad-cache-chunk

    def _init_stages(self, stage_weights: Sequence[Sequence[float]], stage1_fraction: float,
                     switch_step: int | None) -> None:
        """Check and keep the two stages (``stage_weights``, ``stage1_fraction``, ``switch_step``)."""
        if len(stage_weights) != 2 or any(len(w) != 3 or min(w) < 0 for w in stage_weights):
            raise ValueError(f"stage_weights must be two (alpha, beta, gamma) triples of weights "
                             f">= 0, got {stage_weights!r}")
        if not 0.0 <= stage1_fraction <= 1.0:
            raise ValueError(f"need 0 <= stage1_fraction <= 1, got {stage1_fraction}")
        if switch_step is not None and switch_step < 0:
            raise ValueError(f"switch_step must be >= 0, got {switch_step}")
        w1, w2 = ((float(a), float(b), float(c)) for a, b, c in stage_weights)
        self.stage_weights: tuple[Weights, Weights] = (w1, w2)
        self.stage1_fraction, self.switch_step = float(stage1_fraction), switch_step

    # -- the two stages ------------------------------------------------------------------------
    def switch_at(self, total_steps: int) -> int:
        """The first optimiser step of stage 2 in a run of ``total_steps``."""
        if self.switch_step is not None:
            return self.switch_step
        return round(self.stage1_fraction * total_steps)

    def stage_at(self, step: int, total_steps: int) -> int:
        """1 before :meth:`switch_at`, 2 from it on."""
        return 2 if step >= self.switch_at(total_steps) else 1

    def weights_at(self, stage: int) -> Weights:
        """(alpha, beta, gamma) of stage 1 or 2."""
        if stage not in (1, 2):
            raise ValueError(f"{type(self).__name__}: stage must be 1 or 2, got {stage!r}")
        return self.stage_weights[stage - 1]

    def schedules(self) -> dict[str, Schedule]:
        """``stage``: 1, then 2 from :meth:`switch_at` on (LRC-BERT's two training stages)."""
        return {"stage": self.stage_at}

    @property
    def needs_find_unused_parameters(self) -> bool:
        """True when the student head exists and a stage leaves it unused (beta = gamma = 0):
        DDP then needs ``find_unused_parameters=True``."""
        return getattr(self, "head", None) is not None and any(
            w[1] == w[2] == 0 for w in self.stage_weights)

    def train(self, mode: bool = True) -> ContrastiveDistillation:
        """Train mode for the student; the teacher (and a ``teacher_head``) stay in eval mode."""
        super().train(mode)
        self.teacher.eval()
        teacher_head = getattr(self, "teacher_head", None)
        if teacher_head is not None:
            teacher_head.eval()
        return self

    # -- negatives -----------------------------------------------------------------------------
    def _negatives(self, feats: list[Tensor]) -> list[Tensor | None]:
        """Per teacher layer: None in one process (the other rows of the batch); with several,
        (N, world * N - 1, D): every process's rows but the sample's own."""
        if world_size() == 1:
            return [None] * len(feats)
        out: list[Tensor | None] = []
        for f in feats:
            n, d = f.shape
            rows = gather(f)  # M x D, rank 0's rows first; teacher features carry no gradient
            m, own = rows.shape[0], n * rank()
            # sample i's window: rows own + i + 1 .. own + i + M - 1 of [rows; rows], i.e. all
            # but its own; a strided view, so no (N, M - 1, D) copy is made
            both = torch.cat([rows, rows])
            out.append(both.as_strided((n, m - 1, d), (d, d, 1), (own + 1) * d))
        return out

    # -- gradient perturbation -----------------------------------------------------------------
    def _perturbed_pass(self, student_pass: StudentPass, scale: float,
                        pass1_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
                        ) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """Pass 1 (inside ``pass1_context``, e.g. BatchNorm statistics kept), g = dL/d emb, then
        pass 2 with ``emb + unit_gradient(g, scale)``. Returns pass 2's loss and parts and pass
        1's detached loss; pass 1's ``logits`` (the unperturbed predictions), where it has them,
        join pass 2's parts detached as ``logits_pass1``: pass 2's predict the perturbed input."""
        with pass1_context():
            loss1, parts1 = student_pass(None)
            emb = parts1.pop("emb")
            g = None
            if loss1.requires_grad and emb.requires_grad:
                (g,) = torch.autograd.grad(loss1, emb, allow_unused=True)
            clean_logits = parts1["logits"].detach() if "logits" in parts1 else None
            del parts1
        g = wide(torch.zeros_like(emb)) if g is None else wide(g.detach())
        loss, parts = student_pass(unit_gradient(g, scale))
        if clean_logits is not None:
            parts["logits_pass1"] = clean_logits
        return loss, parts, loss1.detach()
