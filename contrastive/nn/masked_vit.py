"""A timm ``VisionTransformer`` run on a masked patch sequence (MAE, iBOT).

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
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["check_vit", "masked_tokens"]


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
