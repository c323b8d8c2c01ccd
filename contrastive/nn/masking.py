"""Patch masks for masked image modelling, and images <-> patch sequences.

- :func:`random_masking`: MAE's per-sample uniform masking (He et al., "Masked Autoencoders Are
  Scalable Vision Learners", CVPR 2022, sec. 3; the authors' facebookresearch/mae
  ``models_mae.py``, ``random_masking``): argsort of uniform noise per sample, the first
  ``int(L * (1 - ratio))`` indices are kept; ``restore`` (the argsort of that order) puts a
  sequence of [kept, removed] tokens back in place.
- :func:`block_mask` / :func:`block_masks`: iBOT's block-wise masks (Zhou et al., "iBOT: Image
  BERT Pre-Training with Online Tokenizer", ICLR 2022, sec. 3.3 / appendix; the authors'
  bytedance/ibot ``loader.py``, ``ImageFolderMask.__getitem__`` with ``pred_shape='block'``,
  which follows BEiT's ``MaskingGenerator``): rectangles of random area and log-uniform aspect
  ratio are added until the target count is reached or ten tries in a row add nothing.
- :func:`patchify` / :func:`unpatchify`: (N, C, H, W) <-> (N, L, p * p * C), patches in
  row-major order and pixels as (row, column, channel) inside a patch, the MAE code's layout
  (its targets) and the order of timm's patch embedding.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["Masking", "block_mask", "block_masks", "patchify", "random_masking", "unpatchify"]


class Masking(NamedTuple):
    """One per-sample masking of sequences of length L.

    keep: (N, K) long, the kept positions (in the noise order, as MAE's code keeps them);
    restore: (N, L) long, ``gather(cat([kept, removed]), 1, restore)`` is the sequence in its
    original order; mask: (N, L) bool, True where a position is removed (MAE's ``mask == 1``).
    """

    keep: Tensor
    restore: Tensor
    mask: Tensor


def random_masking(n: int, length: int, ratio: float, *, noise: Tensor | None = None,
                   kept: int | None = None, device: torch.device | str | None = None,
                   generator: torch.Generator | None = None) -> Masking:
    """MAE's per-sample random masking of ``n`` sequences of ``length`` tokens.

    Args:
        ratio: fraction removed, in [0, 1); ``int(length * (1 - ratio))`` are kept (at least 1).
        noise: (n, length) scores to sort instead of fresh uniform noise (tests, and processes
            that must draw the masks of a global batch); small scores are kept.
        kept: how many are kept, instead of MAE's ``int(length * (1 - ratio))`` (SimMIM counts
            the removed ones, ``ceil(length * ratio)``: the same number but for float rounding).
    """
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"random_masking: ratio must be in [0, 1) (the fraction of patches "
                         f"removed; MAE: 0.75), got {ratio}")
    if noise is None:
        noise = torch.rand(n, length, device=device, generator=generator)
    elif noise.shape != (n, length):
        raise ValueError(f"random_masking: noise must be ({n}, {length}), got "
                         f"{tuple(noise.shape)}")
    if kept is None:
        kept = max(1, int(length * (1 - ratio)))
    elif not 0 <= kept <= length:
        raise ValueError(f"random_masking: kept must be in [0, {length}], got {kept}")
    shuffle = torch.argsort(noise, dim=1)  # ascending: small noise is kept
    restore = torch.argsort(shuffle, dim=1)
    mask = torch.ones(n, length, dtype=torch.bool, device=noise.device)
    mask[:, :kept] = False
    return Masking(shuffle[:, :kept], restore, torch.gather(mask, 1, restore))


def block_mask(height: int, width: int, count: float, *, min_aspect: float = 0.3,
               max_aspect: float | None = None, rng: random.Random | None = None) -> Tensor:
    """iBOT's block-wise mask of a ``height`` x ``width`` patch grid: (height, width) bool.

    Rectangles are added while fewer than ``count`` patches are masked: each try draws an area
    uniformly in [(min(height, width) // 3) ** 2, count - masked] and an aspect ratio h / w
    log-uniformly in [min_aspect, max_aspect] (default 1 / min_aspect), and is accepted when it
    fits in the grid and adds between 1 and ``count - masked`` new patches; after ten failed
    tries in a row the mask is returned as it is. So at most ``count`` patches are masked.
    """
    if height <= 0 or width <= 0 or count < 0 or not min_aspect > 0:
        raise ValueError(f"block_mask: the grid must be positive, count >= 0 and min_aspect > 0, "
                         f"got {height} x {width}, {count}, {min_aspect}")
    rng = rng or random.Random()
    log_aspect = (math.log(min_aspect), math.log(max_aspect or 1 / min_aspect))
    low = (min(height, width) // 3) ** 2
    mask = torch.zeros(height, width, dtype=torch.bool)
    masked = 0
    while masked < count:
        room = count - masked
        added = 0
        for _ in range(10):
            area = rng.uniform(low, room)
            aspect = math.exp(rng.uniform(*log_aspect))
            h, w = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if w < width and h < height:
                top, left = rng.randint(0, height - h), rng.randint(0, width - w)
                new = h * w - int(mask[top:top + h, left:left + w].sum())
                if 0 < new <= room:
                    mask[top:top + h, left:left + w] = True
                    added = new
            if added:
                break
        if not added:
            break
        masked += added
    return mask


def block_masks(n: int, height: int, width: int, *, ratio: float = 0.3, ratio_var: float = 0.2,
                min_aspect: float = 0.3, rng: random.Random | None = None) -> Tensor:
    """(n, height * width) bool: one :func:`block_mask` per image, each with its ratio drawn
    uniformly in [ratio - ratio_var, ratio + ratio_var] (iBOT's ``--pred_ratio 0.3
    --pred_ratio_var 0.2``, its ``get_pred_ratio``), ``ratio * height * width`` patches at most."""
    if not 0.0 <= ratio_var <= ratio < 1.0:
        raise ValueError(f"block_masks: need 0 <= ratio_var <= ratio < 1, got ratio {ratio}, "
                         f"ratio_var {ratio_var}")
    rng = rng or random.Random()
    masks = []
    for _ in range(n):
        r = rng.uniform(ratio - ratio_var, ratio + ratio_var) if ratio_var > 0 else ratio
        masks.append(block_mask(height, width, r * height * width, min_aspect=min_aspect,
                                rng=rng).flatten())
    return torch.stack(masks) if masks else torch.zeros(0, height * width, dtype=torch.bool)


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """(N, C, H, W) -> (N, (H / p) (W / p), p * p * C), the MAE code's ``patchify`` layout."""
    n, c, h, w = images.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"patchify: the image side ({h} x {w}) must be a multiple of the patch "
                         f"size {p}")
    x = images.reshape(n, c, h // p, p, w // p, p)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(n, (h // p) * (w // p), p * p * c)


def unpatchify(patches: Tensor, patch_size: int, height: int, width: int) -> Tensor:
    """The inverse of :func:`patchify`: (N, L, p * p * C) -> (N, C, height, width)."""
    n, length, dim = patches.shape
    p = patch_size
    gh, gw = height // p, width // p
    if gh * gw != length or dim % (p * p):
        raise ValueError(f"unpatchify: {length} patches of {dim} values do not make a "
                         f"{height} x {width} image with {p}-pixel patches")
    c = dim // (p * p)
    x = patches.reshape(n, gh, gw, p, p, c)
    return torch.einsum("nhwpqc->nchpwq", x).reshape(n, c, gh * p, gw * p)
