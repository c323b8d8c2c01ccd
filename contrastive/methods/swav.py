"""SwAV: swapping assignments between views, online clustering with Sinkhorn-Knopp codes.

Caron et al., "Unsupervised Learning of Visual Features by Contrasting Cluster Assignments",
NeurIPS 2020 (arXiv 2006.09882); the authors' code is facebookresearch/swav (``main_swav.py``).

One step::

    prototypes <- normalize(prototypes)                        # unit rows, every step
    z_v = normalize(projector(encoder(x_v)))  for every view   # 2 global + local crops
    scores = z @ prototypes^T                  (B, V, K)
    codes_t = sinkhorn(scores of global view t [+ queued scores])  # over the GLOBAL batch
    loss = mean_t mean_{v != t} CE(codes_t, softmax(scores_v / tau))   # the registry's swav

Defaults (paper Sec. 4, the code's README): projector 2048 -> 128, 3000 prototypes, tau 0.1,
epsilon 0.05, 3 Sinkhorn iterations; the prototypes frozen for the first
``freeze_prototypes_steps`` steps (a parameter group; the code's ``freeze_prototypes_niters``,
the first epoch); an optional queue of past global-view embeddings (``queue_size`` > 0, the
code's ``queue_length`` for small batches), per process as in the code (the Sinkhorn sums
include every process's queue). The queue starts filling at optimiser step
``queue_start_steps`` (the declared ``queue_on`` schedule; the code's ``epoch_queue_starts``,
15 epochs there, 50 in solo-learn's CIFAR config) and joins the Sinkhorn once full, as the code.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses.clustering import swav, swav_codes
from contrastive.methods._common import unit, width
from contrastive.methods.base import Method, ParamGroup, Schedule, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import KeyQueue, build_mlp, resolve_encoder

__all__ = ["SwAV"]


@register_method("swav")
class SwAV(Method):
    """SwAV for any backbone, multi-crop (``num_global`` global views first).

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: embedding dimension (128); mlp_hidden: projector hidden width (2048).
        num_prototypes: K (3000).
        temperature: tau (0.1); epsilon (0.05) and sinkhorn_iterations (3).
        num_global: views whose codes are computed (2).
        queue_size: 0 = no queue; else the number of past embeddings kept per global view.
        queue_start_steps: the queue is neither filled nor used before this optimiser step.
        freeze_prototypes_steps: the prototypes do not move for that many optimiser steps.
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    queue_rows: Tensor  # buffer (): how many rows the queue holds, capped at its size
    needs = ("views",)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": dict(encoder="torchvision:resnet50", dim=128, mlp_hidden=2048,
                         num_prototypes=3000, temperature=0.1),
        # solo-learn scripts/pretrain/cifar/swav.yaml: 2048 -> 128, 3000 prototypes, tau 0.1,
        # queue 3840
        "cifar": dict(encoder="cifar_resnet18", dim=128, mlp_hidden=2048, num_prototypes=3000,
                      temperature=0.1, queue_size=3840),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 128,
                 mlp_hidden: int = 2048, num_prototypes: int = 3000, temperature: float = 0.1,
                 epsilon: float = 0.05, sinkhorn_iterations: int = 3, num_global: int = 2,
                 queue_size: int = 0, queue_start_steps: int = 0,
                 freeze_prototypes_steps: int = 0,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.projector: nn.Module = build_mlp(width(self.encoder), mlp_hidden, dim, 2)
        self.prototypes = nn.Linear(dim, num_prototypes, bias=False)
        self.temperature, self.epsilon, self.iterations = temperature, epsilon, sinkhorn_iterations
        self.num_global, self.freeze_prototypes_steps = num_global, freeze_prototypes_steps
        if queue_start_steps < 0:
            raise ValueError(f"SwAV: queue_start_steps must be >= 0, got {queue_start_steps}")
        self.queue_start_steps = queue_start_steps
        # one queue row holds the num_global embeddings of one image, concatenated
        self.queue = KeyQueue(dim * num_global, queue_size, normalize=False) if queue_size else None
        self.register_buffer("queue_rows", torch.zeros((), dtype=torch.long))  # rows written

    def schedules(self) -> dict[str, Schedule]:
        """``queue_on``: 1.0 from optimiser step ``queue_start_steps`` on, else 0.0."""
        if self.queue is None:
            return {}
        return {"queue_on": functools.partial(_from_step, start=self.queue_start_steps)}

    def param_groups(self) -> list[ParamGroup]:
        if not self.freeze_prototypes_steps:
            return []
        return [ParamGroup("prototypes", list(self.prototypes.parameters()),  # the weight (no bias)
                           frozen_steps=self.freeze_prototypes_steps)]

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "SwAV", min_n=max(2, self.num_global))
        with torch.no_grad():  # the code normalises the prototypes at the start of each step
            self.prototypes.weight.copy_(F.normalize(self.prototypes.weight, dim=1))
        zs = [unit(self.projector(self.encoder(x))) for x in views]
        scores = torch.stack([self.prototypes(z) for z in zs], dim=1)  # B x V x K
        n, t = zs[0].shape[0], self.num_global
        rows = None
        # without the schedule value (a direct call) the queue is on
        queue = self.queue if float(batch.get("queue_on", 1.0)) > 0 else None
        # the queue joins the Sinkhorn once full, as the code (one host read per step)
        if queue is not None and int(self.queue_rows) >= queue.size:
            rows = queue.ordered_keys().view(queue.size, t, -1).to(zs[0].dtype)
        w = self.prototypes.weight.detach()
        codes = torch.stack([swav_codes(scores[:, i], epsilon=self.epsilon,
                                        iterations=self.iterations,
                                        queue_scores=None if rows is None else rows[:, i] @ w.T)
                             for i in range(t)], dim=1)  # queue scores: Q x K per view
        loss = swav(scores, codes, temperature=self.temperature)
        if queue is not None:  # per process, as the code (the Sinkhorn sums all of them)
            queue.enqueue(torch.cat([z.detach() for z in zs[:t]], dim=1), gathered=True)
            self.queue_rows.copy_(torch.clamp(self.queue_rows + n, max=queue.size))
        with torch.no_grad():
            top = codes[:, 0].argmax(dim=1)
            used = torch.zeros(scores.shape[2], device=top.device).index_fill_(0, top, 1.0).sum()
        return {"loss": loss, "prototypes_used": used, "embeddings": zs[0].detach()}


def _from_step(step: int, total: int, *, start: int) -> float:
    """1.0 from optimiser step ``start`` on (a switch as a schedule), else 0.0."""
    return float(step >= start)
