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
- :func:`multiblock_masks`: I-JEPA's multi-block masks (Assran et al., "Self-Supervised Learning
  from Images with a Joint-Embedding Predictive Architecture", CVPR 2023, sec. 3; the authors'
  facebookresearch/ijepa ``src/masks/multiblock.py``, ``MaskCollator``): see its docstring.
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

__all__ = ["Masking", "MultiBlock", "block_mask", "block_masks", "block_size", "multiblock_masks",
           "patchify", "random_masking", "unpatchify"]


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


class MultiBlock(NamedTuple):
    """One batch's I-JEPA masks as patch indices (row-major on the grid, ascending).

    context: (N, Kc) long, the context block's patches less the targets', each image's first
    Kc (Kc: the batch's smallest count); targets: (M, N, Kt) long, the M target blocks' patches
    (all of one size, Kt = h x w)."""

    context: Tensor
    targets: Tensor


def block_size(generator: torch.Generator, scale: tuple[float, float],
               aspect: tuple[float, float], height: int, width: int) -> tuple[int, int]:
    """I-JEPA's ``_sample_block_size`` (multiblock.py lines 55-72): ONE uniform draw ``r`` sets
    both the scale ``s = s0 + r (s1 - s0)`` and the aspect ``a = a0 + r (a1 - a0)`` (coupled,
    as the code); ``area = int(height x width x s)``, ``h = round(sqrt(area a))``,
    ``w = round(sqrt(area / a))``, each at most the grid's side - 1."""
    return _block_shape(torch.rand(1, generator=generator).item(), scale, aspect, height, width)


def _block_shape(r: float, scale: tuple[float, float], aspect: tuple[float, float],
                 height: int, width: int) -> tuple[int, int]:
    """The block of the uniform draw ``r`` (:func:`block_size`'s arithmetic)."""
    area = int(height * width * (scale[0] + r * (scale[1] - scale[0])))
    a = aspect[0] + r * (aspect[1] - aspect[0])
    h, w = int(round(math.sqrt(area * a))), int(round(math.sqrt(area / a)))
    return min(h, height - 1), min(w, width - 1)


def check_multiblock(height: int, width: int, *, target_scale: tuple[float, float],
                     target_aspect: tuple[float, float], context_scale: tuple[float, float],
                     min_keep: int, resolution: int = 1000) -> None:
    """Refuse, before any step, a grid and scales on which some draw of :func:`block_size`
    gives a target or context block of at most ``min_keep`` patches (the draw
    :func:`multiblock_masks` would refuse at a random later step): ``r`` is scanned on a
    ``resolution``-point grid of [0, 1]."""
    for what, scale, aspect in (("target", target_scale, target_aspect),
                                ("context", context_scale, (1.0, 1.0))):
        h, w = min((_block_shape(i / resolution, scale, aspect, height, width)
                    for i in range(resolution + 1)), key=lambda hw: hw[0] * hw[1])
        if h * w <= min_keep:
            raise ValueError(f"a {h} x {w} {what} block on the {height} x {width} patch grid "
                             f"keeps at most {h * w} patches, not more than min_keep={min_keep}: "
                             f"lower min_keep or raise the {what} scale")


def _blocks(n: int, m: int, size: tuple[int, int], grid: tuple[int, int],
            generator: torch.Generator | None) -> Tensor:
    """(n, m, H, W) bool rectangles of ``size``, top-left corners drawn as the code's
    ``_sample_block_mask`` (``randint(0, H - h)``: a block never touches the last row or column)."""
    (h, w), (height, width) = size, grid
    top = torch.randint(0, height - h, (n, m, 1, 1), generator=generator)
    left = torch.randint(0, width - w, (n, m, 1, 1), generator=generator)
    rows = torch.arange(height).view(1, 1, height, 1)
    cols = torch.arange(width).view(1, 1, 1, width)
    return (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)


def _indices(masks: Tensor, count: int) -> Tensor:
    """(..., L) bool -> (..., count) long: each row's first ``count`` True positions."""
    return torch.sort(masks.to(torch.uint8), dim=-1, descending=True, stable=True).indices[
        ..., :count]


def multiblock_masks(n: int, height: int, width: int, *, sizes: torch.Generator,
                     positions: torch.Generator | None = None, num_targets: int = 4,
                     target_scale: tuple[float, float] = (0.15, 0.2),
                     target_aspect: tuple[float, float] = (0.75, 1.5),
                     context_scale: tuple[float, float] = (0.85, 1.0), min_keep: int = 10,
                     patience: int = 20) -> MultiBlock:
    """I-JEPA's masks of ``n`` images on a ``height`` x ``width`` patch grid (the code's
    ``MaskCollator.__call__``, multiblock.py lines 112-170, with ``nenc=1``,
    ``allow_overlap=False``).

    One target size and one context size per batch from ``sizes`` (:func:`block_size`, target
    first; the code seeds that generator with its call counter); per image, from
    ``positions``: ``num_targets`` target blocks, then one square context block without the
    targets' patches, redrawn until it keeps more than ``min_keep`` patches; after ``patience``
    failed draws in a row the last target stops constraining it, and so on (the code's
    ``constrain_mask`` with ``tries``). Every image keeps the first Kc of its context patches,
    Kc the batch's smallest count (the code's ``min_keep_enc`` truncation).
    """
    if n <= 0 or num_targets < 1 or min_keep < 0 or patience < 1:
        raise ValueError(f"multiblock_masks: need n >= 1, num_targets >= 1, min_keep >= 0 and "
                         f"patience >= 1, got {n}, {num_targets}, {min_keep}, {patience}")
    grid = (height, width)
    t_size = block_size(sizes, target_scale, target_aspect, height, width)
    c_size = block_size(sizes, context_scale, (1.0, 1.0), height, width)
    for what, (h, w) in (("target", t_size), ("context", c_size)):
        if h * w <= min_keep:
            raise ValueError(f"multiblock_masks: a {h} x {w} {what} block on the {height} x "
                             f"{width} patch grid never keeps more than min_keep={min_keep} "
                             f"patches; lower min_keep or raise the {what} scale")
    targets = _blocks(n, num_targets, t_size, grid, positions)  # (n, M, H, W)
    context = torch.zeros(n, height, width, dtype=torch.bool)
    pending = torch.arange(n)
    relaxed = torch.zeros(n, dtype=torch.long)  # targets no longer constraining, from the last
    failed = torch.zeros(n, dtype=torch.long)
    while pending.numel():
        block = _blocks(pending.numel(), 1, c_size, grid, positions)[:, 0]
        active = torch.arange(num_targets) < (num_targets - relaxed[pending]).unsqueeze(1)
        barred = (targets[pending] & active.view(-1, num_targets, 1, 1)).any(1)
        drawn = block & ~barred
        ok = drawn.flatten(1).sum(1) > min_keep
        context[pending[ok]] = drawn[ok]
        missed = pending[~ok]
        failed[missed] += 1
        give_up = missed[failed[missed] >= patience]
        relaxed[give_up] += 1
        failed[give_up] = 0
        pending = missed
    kept = int(context.flatten(1).sum(1).min())
    t = targets.transpose(0, 1).flatten(2)  # (M, n, L)
    return MultiBlock(_indices(context.flatten(1), kept), _indices(t, t_size[0] * t_size[1]))


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
