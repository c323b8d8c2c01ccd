"""The two towers of the image-text methods (CLIP, SigLIP): their one home.

:class:`DualEncoder` builds an image encoder and a text encoder of the registry, each followed by
a bias-free linear projection to the shared space (CLIP's ``W_i``, ``W_t``; open_clip
``visual.proj`` / ``text_projection``), and encodes unit embeddings with them::

    i = normalize(image_proj(encoder(image)))                    # N x dim
    t = normalize(text_proj(text_encoder(input_ids, mask)))      # N x dim

``lock_image`` is LiT's locked image tower (Zhai et al., "LiT: Zero-Shot Transfer with
Locked-image text Tuning", CVPR 2022, arXiv 2111.07991): the pretrained image encoder gets no
gradient (so the optimiser never holds it) and stays in eval mode (its BatchNorm statistics
frozen), while the text tower and both projections train. google-research/big_vision
``configs/proj/image_text/lit_coco.py`` freezes everything under ``img/`` (``schedule =
[('img/.*', None), ...]``); by default its image tower has no head at all (``img_head=False``,
``out_dim = (None, dim)``: the text head maps to the image features' width), and with
``img_head`` the image head is the pretrained checkpoint's, frozen with the rest. Here the image
projection is a new random map from the backbone's width to ``dim``: frozen, it would fix a
random compression of the features, so it trains (the image side's only trained parameters).

It holds no loss and no scale: a subclass adds those (:class:`~contrastive.methods.CLIP`: the
softmax logit scale clamped after every step; :class:`~contrastive.methods.SigLIP`: the sigmoid
loss with its learnt t' and b) and writes ``forward``. Every parameter with ``ndim < 2`` (biases,
norm parameters, the subclass's scalars) gets no weight decay (open_clip ``main.py`` excludes
``p.ndim < 2``, ``bn``, ``ln``, ``bias`` and ``logit_scale``): :meth:`DualEncoder.param_groups`.
The zero-shot evaluation (:mod:`contrastive.eval.zeroshot`) reads only ``encode_image`` /
``encode_text``; the run folder (:class:`~contrastive.engine.kits.image_text.ClipArtefacts`) the
state_dict, ``encoder`` and the registered name (and CLIP's clamp where the method has one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

from contrastive.methods._common import unit
from contrastive.methods.base import Method, ParamGroup, read, views_of
from contrastive.nn import resolve_encoder

__all__ = ["DualEncoder"]


class DualEncoder(Method):
    """An image tower and a text tower with projections to a shared space (no loss; subclass it).

    Args:
        encoder: image backbone name or module with ``num_features`` (``self.encoder``, the one
            exported).
        text_encoder: text backbone name or module: called as ``text_encoder(input_ids,
            attention_mask)`` -> (N, num_features) (:class:`~contrastive.text.TextEncoder`).
        dim: shared embedding width (512 for CLIP ViT-B/32; small here).
        encoder_kwargs, text_kwargs: keyword arguments for the two encoders (e.g.
            ``dict(num_layers=2, hidden_size=64, num_heads=2, vocab_size=..., pooling="mean")``).
        lock_image: LiT's locked image tower (module docstring): ``encoder`` frozen and kept
            in eval mode; ``image_proj`` trains.

    A batch holds ``batch["views"]`` (one (N, C, H, W) image view; more are ignored),
    ``batch["input_ids"]`` and ``batch["attention_mask"]`` ((N, T) int64).
    """

    needs = ("views", "input_ids", "attention_mask")
    uses_in_batch_negatives = True
    backbones = ("encoder", "text_encoder")

    def __init__(self, encoder: str | nn.Module = "small_cnn",
                 text_encoder: str | nn.Module = "bert", dim: int = 64,
                 encoder_kwargs: dict[str, Any] | None = None,
                 text_kwargs: dict[str, Any] | None = None, lock_image: bool = False) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.lock_image = bool(lock_image)
        if self.lock_image:
            self.encoder.requires_grad_(False).eval()
        self.text_encoder = resolve_encoder(text_encoder, **(text_kwargs or {}))
        # a text pooler the pooling does not use (BERT's, with "cls" / "mean") gets no gradient:
        # frozen, so that DDP does not wait for its gradient (several processes would fail)
        pooler = getattr(getattr(self.text_encoder, "model", None), "pooler", None)
        if isinstance(pooler, nn.Module) and getattr(self.text_encoder, "pooling",
                                                     "pooler") != "pooler":
            pooler.requires_grad_(False)
        self.image_proj = nn.Linear(cast(int, self.encoder.num_features), dim, bias=False)
        self.text_proj = nn.Linear(cast(int, self.text_encoder.num_features), dim, bias=False)

    def train(self, mode: bool = True) -> DualEncoder:
        """Train mode, but a locked image tower (``lock_image``) stays in eval mode."""
        super().train(mode)
        if self.lock_image:
            self.encoder.eval()
        return self

    def param_groups(self) -> list[ParamGroup]:
        """Every parameter with ``ndim < 2`` (biases, norms, the loss's scale and bias): no
        weight decay. The group keeps CLIP's name, which resume checkpoints record."""
        flat = [p for p in self.parameters() if p.ndim < 2]
        return [ParamGroup("no_decay_clip", flat, weight_decay=0.0)]

    def encode_image(self, images: Tensor) -> Tensor:
        """Unit image embeddings (N, dim) (float32 or wider)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.lock_image):
            features = self.encoder(images)
        return unit(self.image_proj(features))

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
