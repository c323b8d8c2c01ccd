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
  ``visual.proj`` / ``text_projection``).
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
  ``p.ndim < 2``, ``bn``, ``ln``, ``bias`` and ``logit_scale``): :meth:`param_groups`.
- Several processes: each process scores its N local images against the M gathered texts and
  its N texts against the M gathered images (open_clip's ``ClipLoss`` with ``local_loss=True,
  gather_with_grad=True``); the gather keeps the gradient, so with DDP's gradient average the
  update equals one process with the whole batch. A gather without gradient silently loses the
  negatives' share of the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

from contrastive.losses.functional import infonce
from contrastive.methods._common import in_batch_metrics, unit
from contrastive.methods.base import Method, ParamGroup, read, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import resolve_encoder
from contrastive.nn.distributed import gather_with_grad, rank, world_size

__all__ = ["CLIP"]


@register_method("clip")
class CLIP(Method):
    """CLIP with an image encoder of the registry and a text encoder (e.g. ``"bert"``).

    Args:
        encoder: image backbone name or module with ``num_features`` (``self.encoder``, the one
            exported).
        text_encoder: text backbone name or module: called as ``text_encoder(input_ids,
            attention_mask)`` -> (N, num_features) (:class:`~contrastive.text.TextEncoder`).
        dim: shared embedding width (512 for CLIP ViT-B/32; small here).
        temperature: initial tau (0.07): ``logit_scale = log(1 / temperature)``.
        max_logit_scale: the clamp of ``exp(logit_scale)`` (100).
        encoder_kwargs, text_kwargs: keyword arguments for the two encoders (e.g.
            ``dict(num_layers=2, hidden_size=64, num_heads=2, vocab_size=..., pooling="mean")``).

    ``forward(batch)`` reads ``batch["views"]`` (one (N, C, H, W) image view; more are
    ignored), ``batch["input_ids"]`` and ``batch["attention_mask"]`` ((N, T) int64).
    """

    needs = ("views", "input_ids", "attention_mask")
    uses_in_batch_negatives = True
    backbones = ("encoder", "text_encoder")

    def __init__(self, encoder: str | nn.Module = "small_cnn",
                 text_encoder: str | nn.Module = "bert", dim: int = 64,
                 temperature: float = 0.07, max_logit_scale: float = 100.0,
                 encoder_kwargs: dict[str, Any] | None = None,
                 text_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not 0 < temperature or 1.0 / temperature > max_logit_scale:
            raise ValueError(f"CLIP: need temperature > 0 and 1 / temperature <= "
                             f"max_logit_scale; got {temperature}, {max_logit_scale}")
        self._build_towers(encoder, text_encoder, dim, encoder_kwargs, text_kwargs)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)))
        self.max_logit_scale = float(max_logit_scale)

    def _build_towers(self, encoder: str | nn.Module, text_encoder: str | nn.Module, dim: int,
                      encoder_kwargs: dict[str, Any] | None,
                      text_kwargs: dict[str, Any] | None) -> None:
        """The two encoders and their bias-free projections to the shared space (also SigLIP's)."""
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.text_encoder = resolve_encoder(text_encoder, **(text_kwargs or {}))
        # a text pooler the pooling does not use (BERT's, with "cls" / "mean") gets no gradient:
        # frozen, so that DDP does not wait for its gradient (several processes would fail)
        pooler = getattr(getattr(self.text_encoder, "model", None), "pooler", None)
        if isinstance(pooler, nn.Module) and getattr(self.text_encoder, "pooling",
                                                     "pooler") != "pooler":
            pooler.requires_grad_(False)
        self.image_proj = nn.Linear(cast(int, self.encoder.num_features), dim, bias=False)
        self.text_proj = nn.Linear(cast(int, self.text_encoder.num_features), dim, bias=False)

    @torch.no_grad()
    def clamp_logit_scale(self) -> None:
        """``logit_scale`` into ``[0, log(max_logit_scale)]`` in place (open_clip's clamp)."""
        self.logit_scale.clamp_(0.0, math.log(self.max_logit_scale))

    def after_optimizer_step(self) -> None:
        """The loop's post-step hook: open_clip's clamp after ``optimizer.step()``."""
        self.clamp_logit_scale()

    def param_groups(self) -> list[ParamGroup]:
        """The scale and every parameter with ``ndim < 2`` (biases, norms): no weight decay."""
        flat = [p for p in self.parameters() if p.ndim < 2]
        return [ParamGroup("no_decay_clip", flat, weight_decay=0.0)]

    def encode_image(self, images: Tensor) -> Tensor:
        """Unit image embeddings (N, dim) (float32 or wider)."""
        return unit(self.image_proj(self.encoder(images)))

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Unit text embeddings (N, dim) of token ids (N, T)."""
        return unit(self.text_proj(self.text_encoder(input_ids, attention_mask)))

    def encode_pairs(self, batch: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
        """Unit image and text embeddings (N, dim) of a batch's image-text pairs."""
        name = type(self).__name__
        image = views_of(batch, name)[0]
        ids, mask = read(batch, "input_ids", name), read(batch, "attention_mask", name)
        if ids.shape != mask.shape or ids.dim() != 2 or ids.shape[0] != image.shape[0]:
            raise ValueError(f"{name}: input_ids and attention_mask must be (N, T) with the N of "
                             f"the images ({image.shape[0]}); got {tuple(ids.shape)} and "
                             f"{tuple(mask.shape)}")
        return self.encode_image(image), self.encode_text(ids, mask)

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
