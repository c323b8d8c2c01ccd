"""CLIP: contrastive image-text pre-training.

Radford et al., "Learning Transferable Visual Models From Natural Language Supervision", ICML
2021 (arXiv 2103.00020), Fig. 3 and sec. 2.5; defaults checked against mlfoundations/open_clip.

One step::

    i = normalize(image_proj(image_encoder(image)))          # N x D, local
    t = normalize(text_proj(text_encoder(tokens)))           # N x D
    i_all, t_all = gather_with_grad(i), gather_with_grad(t)  # M = N * world_size rows
    s = exp(logit_scale)                                     # 1 / tau
    loss = (CE(s i t_all^T, o + arange(N)) + CE(s t i_all^T, o + arange(N))) / 2, o = N * rank

- Linear projections without bias to the shared space (the paper's ``W_i``, ``W_t``; open_clip
  ``visual.proj`` / ``text_projection``): the towers are
  :class:`~contrastive.methods.dual_encoder.DualEncoder`'s, shared with SigLIP.
- ``logit_scale`` is learnt in log space, initialised to ``log(1 / 0.07)`` (paper sec. 2.5:
  "initialized to the equivalent of 0.07 ... and clipped to prevent scaling the logits by more
  than 100"; open_clip ``model.py``: ``init_logit_scale = np.log(1 / 0.07)``) and clamped to
  ``[0, log 100]`` after every optimiser step (open_clip ``open_clip_train/train.py``:
  ``logit_scale.clamp_(0, math.log(100))`` under ``no_grad`` after ``optimizer.step()``).
  The training loop calls :meth:`after_optimizer_step` (= :meth:`clamp_logit_scale`, in
  place, without gradient) after every optimiser step, so checkpoints hold the clamped value;
  ``forward`` clamps too, so a hand-written loop without the hook sees the same values.
- The loss is the registry's InfoNCE (:func:`contrastive.losses.functional.infonce`) called once
  per direction, as its docstring prescribes for several processes. ``InfoNCELoss(
  learnable_temperature=True)`` is not used: it clamps inside the graph (no gradient past 100,
  the parameter may drift above), where open_clip clamps the parameter itself.
- No weight decay on the scale, biases and norm parameters (open_clip ``main.py`` excludes
  ``p.ndim < 2``, ``bn``, ``ln``, ``bias`` and ``logit_scale``): the towers' rule,
  :meth:`~contrastive.methods.dual_encoder.DualEncoder.param_groups`.
- Several processes: each process scores its N local images against the M gathered texts and
  its N texts against the M gathered images (open_clip's ``ClipLoss`` with ``local_loss=True,
  gather_with_grad=True``); the gather keeps the gradient, so with DDP's gradient average the
  update equals one process with the whole batch. A gather without gradient silently loses the
  negatives' share of the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.losses.functional import infonce
from contrastive.methods._common import in_batch_metrics
from contrastive.methods.dual_encoder import DualEncoder
from contrastive.methods.registry import register_method
from contrastive.nn.distributed import gather_with_grad, rank, world_size

__all__ = ["CLIP"]


@register_method("clip")
class CLIP(DualEncoder):
    """CLIP with an image encoder of the registry and a text encoder (e.g. ``"bert"``): the towers
    of :class:`~contrastive.methods.dual_encoder.DualEncoder` and the softmax loss with its
    learnt, clamped logit scale.

    Args:
        encoder, text_encoder, dim, encoder_kwargs, text_kwargs, lock_image: the towers
            (:class:`DualEncoder`).
        temperature: initial tau (0.07): ``logit_scale = log(1 / temperature)``.
        max_logit_scale: the clamp of ``exp(logit_scale)`` (100).

    ``forward(batch)`` reads ``batch["views"]`` (one (N, C, H, W) image view; more are
    ignored), ``batch["input_ids"]`` and ``batch["attention_mask"]`` ((N, T) int64).
    """

    def __init__(self, encoder: str | nn.Module = "small_cnn",
                 text_encoder: str | nn.Module = "bert", dim: int = 64,
                 temperature: float = 0.07, max_logit_scale: float = 100.0,
                 encoder_kwargs: dict[str, Any] | None = None,
                 text_kwargs: dict[str, Any] | None = None, lock_image: bool = False) -> None:
        if not 0 < temperature or 1.0 / temperature > max_logit_scale:
            raise ValueError(f"CLIP: need temperature > 0 and 1 / temperature <= "
                             f"max_logit_scale; got {temperature}, {max_logit_scale}")
        super().__init__(encoder, text_encoder, dim, encoder_kwargs, text_kwargs, lock_image)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)))
        self.max_logit_scale = float(max_logit_scale)

    @torch.no_grad()
    def clamp_logit_scale(self) -> None:
        """``logit_scale`` into ``[0, log(max_logit_scale)]`` in place (open_clip's clamp)."""
        self.logit_scale.clamp_(0.0, math.log(self.max_logit_scale))

    def after_optimizer_step(self) -> None:
        """The loop's post-step hook: open_clip's clamp after ``optimizer.step()``."""
        self.clamp_logit_scale()

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        self.clamp_logit_scale()  # = the clamp after the previous optimiser step
        zi, zt = self.encode_pairs(batch)
        n = zi.shape[0]
        if world_size() > 1:
            zi_all, zt_all, offset = gather_with_grad(zi), gather_with_grad(zt), n * rank()
        else:
            zi_all, zt_all, offset = zi, zt, 0
        tau = 1.0 / self.logit_scale.exp()
        loss = (infonce(zi, zt_all, temperature=tau, normalize=False, positive_offset=offset)
                + infonce(zt, zi_all, temperature=tau, normalize=False,
                          positive_offset=offset)) / 2
        cols = torch.arange(n, device=zi.device) + offset
        metrics = in_batch_metrics(zi.detach(), zt_all.detach(), pos_col=cols)  # image -> text
        return {"loss": loss, **metrics, "logit_scale": self.logit_scale.detach().exp(),
                "embeddings": zi.detach()}
