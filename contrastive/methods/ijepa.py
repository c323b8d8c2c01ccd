"""I-JEPA: predict, from one context block, the target encoder's features of other blocks.

Assran, Duval, Misra, Bojanowski, Vincent, Rabbat, LeCun, Ballas, "Self-Supervised Learning from
Images with a Joint-Embedding Predictive Architecture", CVPR 2023 (arXiv 2301.08243); the
authors' code is facebookresearch/ijepa at 52c1ae9 (``src/train.py``, ``src/masks/multiblock.py``,
``src/models/vision_transformer.py``, ``src/helper.py``, ``configs/in1k_vith14_ep300.yaml``).

One step (paper sec. 3; the code's ``train_step``, train.py lines 290-338)::

    target <- m * target + (1 - m) * encoder           # m: linear m0 -> 1 (linear_momentum)
    ctx (N, Kc), tgt (M, N, Kt) = multiblock_masks(...) # 4 targets, 1 context without them
    h = layer_norm(target(x))[tgt]                      # every patch in, no gradient, no affine
    z = encoder(patches[ctx] + pos)                     # the context patches only
    p = predictor(z, ctx, tgt)                          # context + mask tokens at tgt positions
    loss = mean smooth_l1(p, h)                         # the registry's ijepa (paper: l2)

The encoder is a timm ``VisionTransformer`` without class token (``class_token=False,
global_pool="avg", fc_norm=False``: the code's ViT has none; its average-pooled normed patches
are the embedding, read by kNN and the probe), with the code's fixed 2-D sin-cos position
embedding (MoCo v3's channel order here, the code's puts the column's sin / cos first: a fixed
permutation of the channels) and its initialisation (``helper.init_model``: every linear layer
N(0, 0.02^2) truncated at +-2, zero biases, LayerNorms (1, 0); the patch projection as the
code's ``_init_weights`` gives it, the same normal; the code's ``fix_init_weight`` rescaling is
overwritten there by ``init_model`` and so not applied). The target encoder is a momentum copy
(``self.target``); the embeddings returned, the kNN monitor, the online probe and the exported
backbone read the target encoder, the one the paper evaluates (``evaluated``).

Masks: :func:`contrastive.nn.masking.multiblock_masks`. The block sizes of a step come from a
generator seeded by the method's call counter (``mask_step``, the code's ``_itr_counter``), the
positions from one seeded by ``mask_seed`` (drawn from torch's generator when the method is
built, the same in every process) and that counter: every process draws the same masks, as the
authors' (their loader workers' seeds come from each rank's identically seeded main generator,
train.py lines 58-60), and a resumed run the masks it would have drawn.

Not exact to split (``no_accumulation``): a batch shares one block size and its context is cut
to the batch's smallest, so micro-batches would train on other masks than their batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.data.loader import mix_seed
from contrastive.losses import get_loss
from contrastive.methods._common import width
from contrastive.methods.base import Method, Schedule, read, views_of
from contrastive.methods.dino import build_teacher
from contrastive.methods.registry import register_method
from contrastive.nn import linear_momentum, resolve_encoder
from contrastive.nn.masked_vit import MaskTokenTransformer, check_vit, masked_tokens
from contrastive.nn.masking import MultiBlock, check_multiblock, multiblock_masks
from contrastive.nn.pos_embed import fix_sincos_pos_embed

__all__ = ["IJEPA", "IJEPAPredictor"]

#: a timm ViT as the code's: no class token, the normed patches average-pooled
NO_CLASS_TOKEN = dict(class_token=False, global_pool="avg", fc_norm=False)


def ijepa_init_(module: nn.Module) -> None:
    """The code's ``init_weights`` (helper.py lines 86-93) on every linear layer and LayerNorm,
    and ``_init_weights``' (vision_transformer.py lines 396-399) on convolutions."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Conv2d):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class IJEPAPredictor(MaskTokenTransformer):
    """The code's ``VisionTransformerPredictor`` (vision_transformer.py lines 220-326): a narrow
    ViT on the context tokens and one mask token per target patch, each with its fixed sin-cos
    position, every target block a sequence of its own; the code's initialisation.

    ``forward(z (N, Kc, D), context (N, Kc), targets (M, N, Kt)) -> (M N, Kt, D)``, rows
    target-block-major (block 0's N images first), as the code's ``apply_masks``.
    """

    def __init__(self, in_dim: int, grid: int, dim: int = 384, depth: int = 12,
                 heads: int = 12, mlp_ratio: float = 4.0) -> None:
        super().__init__(in_dim, grid, in_dim, dim, depth, heads, mlp_ratio)
        ijepa_init_(self)
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def forward(self, z: Tensor, context: Tensor, targets: Tensor) -> Tensor:
        pos = self.pos_embed[0].to(z.dtype)  # (L, dim)
        x = self.embed(z) + pos[context]  # (N, Kc, dim)
        m, n, kt = targets.shape
        queries = (self.mask_token.to(z.dtype) + pos[targets]).flatten(0, 1)  # (M N, Kt, dim)
        x = torch.cat([x.repeat(m, 1, 1), queries], dim=1)
        return self.pred(self.norm(self.blocks(x))[:, -kt:])


def _weight_decay(step: int, total: int, *, start: float, end: float) -> float:
    """The code's ``CosineWDSchedule`` (schedulers.py lines 48-76): stepped before use, so step
    ``t`` (0-based) reads ``t + 1``."""
    progress = min(step + 1, total) / max(1, total)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


@register_method("ijepa")
class IJEPA(Method):
    """I-JEPA for a timm ViT encoder without class token.

    Args:
        encoder: ``"timm:vit_*"`` name (with ``encoder_kwargs`` holding :data:`NO_CLASS_TOKEN`)
            or such a timm ``VisionTransformer``.
        predictor_dim, predictor_depth, predictor_heads: the predictor (384, 12; heads: the
            encoder's, as ``helper.init_model``).
        num_targets, target_scale, target_aspect, context_scale, min_keep: the masks (4,
            (0.15, 0.2), (0.75, 1.5), (0.85, 1.0), 10; :func:`multiblock_masks`).
        momentum: m0 of the target's linear schedule to 1 (0.996).
        weight_decay, weight_decay_end: the cosine weight-decay schedule (0.04 -> 0.4; None:
            the run's constant ``--weight-decay``).
        distance: ``"smooth_l1"`` (the code) or ``"l2"`` (the paper's eq. 1).
        ijepa_init: the code's initialisation and sin-cos positions (True).
        encoder_kwargs: keyword arguments for ``create_encoder``.

    ``forward(batch)``: ``batch["views"]``, one view (N, C, H, W); ``batch["momentum"]``.
    """

    mask_step: Tensor  # buffer (): masks drawn so far (the code's _itr_counter)
    mask_seed: Tensor  # buffer (): the seed of the mask positions
    needs = ("views",)
    #: the encoders run through ``masked_tokens`` (the context patches only), not their forward
    backbones = ()
    #: the target encoder is exported and evaluated: the one the paper evaluates, its output
    #: average-pooled (Assran et al. 2023)
    evaluated = "target.module"
    no_accumulation = ("I-JEPA draws one block size per batch and cuts every context to the "
                       "batch's smallest (the authors' collator), so micro-batches would train "
                       "on other masks than their batch")
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # configs/in1k_vith14_ep300.yaml: ViT-H/14 at 224 px, predictor 12 x 384 (pred_depth,
        # pred_emb_dim), mask: 4 targets 0.15-0.2 aspect 0.75-1.5, context 0.85-1.0, min_keep
        # 10; ema [0.996, 1.0]; weight_decay 0.04 -> final_weight_decay 0.4
        "vit_huge14": dict(encoder="timm:vit_huge_patch14_224", encoder_kwargs=NO_CLASS_TOKEN,
                           predictor_dim=384, predictor_depth=12, num_targets=4,
                           target_scale=(0.15, 0.2), target_aspect=(0.75, 1.5),
                           context_scale=(0.85, 1.0), min_keep=10, momentum=0.996,
                           weight_decay=0.04, weight_decay_end=0.4),
        # ours, at CPU scale: ViT-Tiny on 32 px with 4-px patches (8 x 8 = 64 patches), a
        # predictor 6 x 96 (the code's is 384 wide, 12 deep for ViT-H's 1280 x 32); the code's
        # masks, min_keep 4 (the collator's default; 10 of 64 patches would refuse the 3 x 3
        # target blocks)
        "cifar": dict(encoder="timm:vit_tiny_patch16_224",
                      encoder_kwargs=dict(img_size=32, patch_size=4, **NO_CLASS_TOKEN),
                      predictor_dim=96, predictor_depth=6, num_targets=4,
                      target_scale=(0.15, 0.2), target_aspect=(0.75, 1.5),
                      context_scale=(0.85, 1.0), min_keep=4, momentum=0.996,
                      weight_decay=0.04, weight_decay_end=0.4),
    }

    def __init__(self, encoder: str | nn.Module = "timm:vit_tiny_patch16_224",
                 predictor_dim: int = 384, predictor_depth: int = 12,
                 predictor_heads: int | None = None, num_targets: int = 4,
                 target_scale: tuple[float, float] = (0.15, 0.2),
                 target_aspect: tuple[float, float] = (0.75, 1.5),
                 context_scale: tuple[float, float] = (0.85, 1.0), min_keep: int = 10,
                 momentum: float = 0.996, weight_decay: float | None = 0.04,
                 weight_decay_end: float | None = 0.4, distance: str = "smooth_l1",
                 ijepa_init: bool = True, encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0 or num_targets < 1 or min_keep < 0:
            raise ValueError(f"I-JEPA: need momentum in [0, 1], num_targets >= 1 and min_keep "
                             f">= 0, got {momentum}, {num_targets}, {min_keep}")
        for name, (lo, hi) in (("target_scale", target_scale), ("context_scale", context_scale),
                               ("target_aspect", target_aspect)):
            if not 0.0 < lo <= hi or (name != "target_aspect" and hi > 1.0):
                raise ValueError(f"I-JEPA: {name} must be (low, high) with 0 < low <= high"
                                 f"{'' if name == 'target_aspect' else ' <= 1'}, got "
                                 f"{(lo, hi)}")
        if (weight_decay is None) != (weight_decay_end is None):
            raise ValueError("I-JEPA: give both weight_decay and weight_decay_end (the cosine "
                             "schedule), or neither")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        check_vit(self.encoder, "I-JEPA")
        vit: Any = self.encoder  # a timm VisionTransformer (checked), duck-typed
        if int(vit.num_prefix_tokens):
            raise ValueError("I-JEPA: the encoder must have no class or register token (the "
                             "code's ViT has none): build the timm ViT with class_token=False, "
                             "global_pool='avg', fc_norm=False")
        grid = tuple(vit.patch_embed.grid_size)
        if grid[0] != grid[1]:
            raise ValueError(f"I-JEPA: the patch grid must be square, got {grid}")
        self.grid = grid[0]
        try:
            check_multiblock(self.grid, self.grid, target_scale=target_scale,
                             target_aspect=target_aspect, context_scale=context_scale,
                             min_keep=min_keep)
        except ValueError as err:
            raise ValueError(f"I-JEPA: {err}") from None
        heads = predictor_heads or int(vit.blocks[0].attn.num_heads)
        if predictor_dim % heads:
            raise ValueError(f"I-JEPA: predictor_dim {predictor_dim} must be a multiple of the "
                             f"predictor's {heads} heads")
        if ijepa_init:
            ijepa_init_(self.encoder)
            fix_sincos_pos_embed(self.encoder)
        self.predictor = IJEPAPredictor(width(self.encoder), self.grid, predictor_dim,
                                        predictor_depth, heads)
        self.target = build_teacher(self.encoder)
        self.masking: dict[str, Any] = dict(
            num_targets=num_targets, target_scale=tuple(target_scale),
            target_aspect=tuple(target_aspect), context_scale=tuple(context_scale),
            min_keep=min_keep)
        self.base_momentum = momentum
        self.weight_decays = (None if weight_decay is None or weight_decay_end is None
                              else (weight_decay, weight_decay_end))
        self.criterion = get_loss("ijepa", distance=distance)
        self.register_buffer("mask_step", torch.zeros((), dtype=torch.long))
        self.register_buffer("mask_seed", torch.randint(2**62, ()))

    def schedules(self) -> dict[str, Schedule]:
        out: dict[str, Schedule] = {
            "momentum": functools.partial(linear_momentum, m0=self.base_momentum)}
        if self.weight_decays is not None:
            out["weight_decay"] = functools.partial(_weight_decay, start=self.weight_decays[0],
                                                    end=self.weight_decays[1])
        return out

    def draw_masks(self, n: int) -> MultiBlock:
        """This step's masks of ``n`` images (on the host); advances ``mask_step``. A test may
        replace the method."""
        step = int(self.mask_step)
        sizes = torch.Generator().manual_seed(step)  # the code's g.manual_seed(self.step())
        positions = torch.Generator().manual_seed(mix_seed(int(self.mask_seed), step))
        self.mask_step.add_(1)
        return multiblock_masks(n, self.grid, self.grid, sizes=sizes, positions=positions,
                                **self.masking)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        (x,) = views_of(batch, "I-JEPA", n=1)
        m = read(batch, "momentum", "I-JEPA")
        masks = self.draw_masks(x.shape[0])
        ctx, tgt = masks.context.to(x.device), masks.targets.to(x.device)
        with torch.no_grad():
            self.target.update(self.encoder, m)  # the update after the previous step
            tokens = masked_tokens(self.target.module, x)  # (N, L, D)
            h = F.layer_norm(tokens, tokens.shape[-1:])
            d = h.shape[-1]
            h = torch.stack([torch.gather(h, 1, t.unsqueeze(-1).expand(-1, -1, d)) for t in tgt])
        z = masked_tokens(self.encoder, x, keep=ctx)  # (N, Kc, D)
        pred = self.predictor(z, ctx, tgt)  # (M N, Kt, D)
        loss = self.criterion(pred, h.flatten(0, 1))
        return {"loss": loss, "context_patches": torch.tensor(float(ctx.shape[1]), device=x.device),
                "embeddings": F.normalize(tokens.mean(1).float(), dim=1)}
