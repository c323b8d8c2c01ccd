"""A timm ``VisionTransformer`` run on a masked patch sequence (MAE, iBOT, SimMIM, I-JEPA), and
the light transformer on mask tokens that MAE's decoder and I-JEPA's predictor share.

:func:`masked_tokens` is timm's ``forward_features`` with one change in the middle, so the
ViT's own parameters, prefix tokens (class, registers) and position embedding are used and its
state dict stays timm's (an encoder trained here exports as it is):

- ``keep`` (N, K): MAE (He et al., CVPR 2022, sec. 3 and facebookresearch/mae
  ``forward_encoder``): the position embedding is added to every patch, then only the kept
  patches (and the prefix tokens) enter the blocks: (N, prefix + K, D) out.
- ``mask`` (N, L) with ``mask_token`` (D,) or (1, D): iBOT (Zhou et al., ICLR 2022; bytedance/ibot
  ``models/vision_transformer.py``, ``prepare_tokens`` / ``mask_model``): masked patch
  embeddings are replaced by the learned token *before* the position embedding: (N, prefix + L,
  D) out.

Without either it equals ``vit.forward_features(images)``. A ``dynamic_img_size`` ViT (timm
resamples its position embedding to the input's grid: iBOT's local crops) is masked the same
way, its (N, H, W, D) patch grid read row-major as the sequence.

:class:`MaskTokenTransformer`: the parts of MAE's decoder (facebookresearch/mae
``models_mae.py``: ``decoder_embed``, ``mask_token``, ``decoder_pos_embed``, ``decoder_blocks``,
``decoder_norm``, ``decoder_pred``) and I-JEPA's predictor (facebookresearch/ijepa
``src/models/vision_transformer.py``, ``VisionTransformerPredictor``: the same parts under
``predictor_*`` names); each method's module places the mask tokens in its own ``forward``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.nn.pos_embed import sincos_pos_embed

__all__ = ["MaskTokenTransformer", "check_vit", "masked_tokens"]


class MaskTokenTransformer(nn.Module):
    """A linear embedding ``embed`` of the encoder's ``in_dim`` tokens to ``dim``, a learned
    ``mask_token`` (1, 1, dim) (zero: the method initialises it), fixed 2-D sin-cos positions of
    the ``grid`` x ``grid`` patches (``pos_embed``, a buffer (1, L, dim)), ``depth`` timm
    ``Block`` s (MLP ratio ``mlp_ratio``, qkv bias, LayerNorm eps 1e-6), a LayerNorm ``norm``
    and a linear ``pred`` to ``out_dim``."""

    pos_embed: Tensor  # buffer (1, L, dim)

    def __init__(self, in_dim: int, grid: int, out_dim: int, dim: int, depth: int, heads: int,
                 mlp_ratio: float = 4.0) -> None:
        super().__init__()
        from timm.models.vision_transformer import Block

        norm: Any = functools.partial(nn.LayerNorm, eps=1e-6)  # timm types it as a class
        self.embed = nn.Linear(in_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        # fixed, a function of the sizes: rebuilt, not checkpointed; a dense copy (a slice keeps
        # the parent's strides, which DDP's buffer broadcast refuses)
        pos = sincos_pos_embed(grid, dim)[:, 1:].clone(memory_format=torch.contiguous_format)
        self.register_buffer("pos_embed", pos, persistent=False)
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp_ratio, qkv_bias=True, norm_layer=norm)
                                      for _ in range(depth)])
        self.norm = norm(dim)
        self.pred = nn.Linear(dim, out_dim)


def check_vit(vit: nn.Module, what: str) -> None:
    """Raise a one-line error unless ``vit`` is a timm ViT this module can mask."""
    needed = ("patch_embed", "_pos_embed", "blocks", "norm", "num_prefix_tokens")
    if not all(hasattr(vit, a) for a in needed):
        raise TypeError(f"{what}: the encoder must be a timm VisionTransformer (e.g. "
                        f"'timm:vit_tiny_patch16_224' with img_size / patch_size), got "
                        f"{type(vit).__name__}")


def masked_tokens(vit: nn.Module, images: Tensor, *, keep: Tensor | None = None,
                  mask: Tensor | None = None, mask_token: Tensor | None = None) -> Tensor:
    """The ViT's normalised output tokens on ``images`` (N, C, H, W), prefix tokens first.

    Args:
        keep: (N, K) long patch positions to keep (MAE); the others are dropped.
        mask: (N, L) bool, True where the patch embedding is replaced by ``mask_token`` (iBOT).
    """
    if keep is not None and mask is not None:
        raise ValueError("masked_tokens: give keep (drop tokens, MAE) or mask (mask tokens, "
                         "iBOT), not both")
    net: Any = vit  # a timm VisionTransformer, duck-typed (check_vit)
    x = net.patch_embed(images)  # (N, L, D), or (N, H, W, D) when dynamic_img_size
    if mask is not None:
        n, length = x.shape[0], x.shape[1:-1].numel()
        if mask_token is None or mask.shape != (n, length):
            raise ValueError(f"masked_tokens: mask must be (N, L) = {(n, length)} with a "
                             f"mask_token, got {tuple(mask.shape)}")
        grid = mask.reshape(x.shape[:-1])  # (N, H, W) on a dynamic-size ViT's patch grid
        x = torch.where(grid.unsqueeze(-1), mask_token.to(x.dtype), x)
    x = net._pos_embed(x)  # prefix tokens + every patch, position embedding added
    if keep is not None:
        prefix = int(net.num_prefix_tokens)
        patches = torch.gather(x[:, prefix:], 1, keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        x = torch.cat([x[:, :prefix], patches], dim=1)
    x = net.patch_drop(x) if hasattr(net, "patch_drop") else x
    x = net.norm_pre(x) if hasattr(net, "norm_pre") else x
    return net.norm(net.blocks(x))
