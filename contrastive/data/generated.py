"""Data sets generated from a seed: ``shapes`` (learnable, offline) and ``synthetic`` (noise).

``shapes`` draws one of ten shape classes per image with random foreground and background
colours, scale, rotation and position (optionally over random clutter lines). Colour, scale,
position and rotation are exactly the nuisances that contrastive augmentations (colour jitter,
grayscale, random resized crop) teach invariance to, so what identifies the class is the shape
alone: a short self-supervised run on the CPU learns it (see BENCHMARKS.md, feasibility probe).
Each image also has a per-pixel mask (:func:`generate_shape_masks`, ``ShapesDataset.masks()``:
0 background and clutter lines, ``label + 1`` inside the shape) for dense probes.

Determinism: image i of a split depends only on (seed, split, i): ``n`` only says how many,
so a smaller data set is a prefix of a larger one; train and test come from independent
streams. Rendering is vectorised (signed distance functions evaluated on the pixel grid, one
pixel of anti-aliasing), a 3,000-image 32-px set takes a fraction of a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from contrastive.data.base import LabelledDataset

SHAPE_CLASSES: tuple[str, ...] = (
    "disc", "square", "triangle", "ring", "cross", "bar", "bars", "diamond", "star", "checker",
)
MAX_CLUTTER = 8
MASK_BACKGROUND = 0
"""Mask value of background pixels (clutter lines included); shape class c is c + 1."""
_SPLITS = {"train": 0, "test": 1}
# parameter columns of one image
_SCALE, _CX, _CY, _ROT, _FG, _BG, _CLUTTER = 0, 1, 2, 3, 4, 7, 10
_CLUTTER_COLS = 8  # x0, y0, x1, y1, r, g, b, width
_NCOL = _CLUTTER + MAX_CLUTTER * _CLUTTER_COLS


def _split_id(split: str) -> int:
    if split not in _SPLITS:
        raise ValueError(f"split must be 'train' or 'test' for a generated data set; got {split!r}")
    return _SPLITS[split]


def _stream(seed: int, split: str, salt: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), _split_id(split), salt])))


# ---- signed distances in the shape's own frame (radius 1); negative inside -------------------

def _box(u: Tensor, v: Tensor, a: float, b: float) -> Tensor:
    qx, qy = u.abs() - a, v.abs() - b
    outside = torch.hypot(qx.clamp(min=0), qy.clamp(min=0))
    return outside + torch.maximum(qx, qy).clamp(max=0)


def _disc(u: Tensor, v: Tensor) -> Tensor:
    return torch.hypot(u, v) - 0.9


def _square(u: Tensor, v: Tensor) -> Tensor:
    return _box(u, v, 0.7, 0.7)


def _triangle(u: Tensor, v: Tensor) -> Tensor:
    """Equilateral triangle of circumradius 1 (exact distance, after I. Quilez)."""
    r = math.sqrt(3.0) / 2.0  # half side
    k = math.sqrt(3.0)
    x = u.abs() - r
    y = v + r / k
    flip = (x + k * y) > 0
    x, y = torch.where(flip, (x - k * y) / 2, x), torch.where(flip, (-k * x - y) / 2, y)
    x = x - x.clamp(-2 * r, 0)
    return -torch.hypot(x, y) * torch.sign(y)


def _ring(u: Tensor, v: Tensor) -> Tensor:
    return (torch.hypot(u, v) - 0.68).abs() - 0.24


def _cross(u: Tensor, v: Tensor) -> Tensor:
    return torch.minimum(_box(u, v, 0.92, 0.27), _box(u, v, 0.27, 0.92))


def _bar(u: Tensor, v: Tensor) -> Tensor:
    return _box(u, v, 0.95, 0.3)


def _bars(u: Tensor, v: Tensor) -> Tensor:
    return torch.minimum(torch.minimum(_box(u, v - 0.55, 0.8, 0.15), _box(u, v, 0.8, 0.15)),
                         _box(u, v + 0.55, 0.8, 0.15))


def _diamond(u: Tensor, v: Tensor) -> Tensor:
    a, b = 0.95, 0.5  # an elongated rhombus, so that rotation does not make it a square
    return (u.abs() * b + v.abs() * a - a * b) / math.hypot(a, b)


def _star(u: Tensor, v: Tensor) -> Tensor:
    """Five-pointed star, outer radius 0.95, inner 0.42 of it (after I. Quilez)."""
    r, rf = 0.95, 0.42
    k1x, k1y = 0.809016994375, -0.587785252292
    k2x, k2y = -k1x, k1y
    x, y = u.abs(), v
    d = (k1x * x + k1y * y).clamp(min=0) * 2
    x, y = x - d * k1x, y - d * k1y
    d = (k2x * x + k2y * y).clamp(min=0) * 2
    x, y = x - d * k2x, y - d * k2y
    x, y = x.abs(), y - r
    bax, bay = rf * -k1y, rf * k1x - 1.0
    h = ((x * bax + y * bay) / (bax * bax + bay * bay)).clamp(0, r)
    return torch.hypot(x - bax * h, y - bay * h) * torch.sign(y * bax - x * bay)


def _checker(u: Tensor, v: Tensor) -> Tensor:
    """A 3 x 3 checkerboard inside a square of half side 0.72 (corner cells filled)."""
    half, cells = 0.72, 3
    c = 2 * half / cells
    fu, fv = (u + half) / c, (v + half) / c
    parity = (torch.floor(fu) + torch.floor(fv)).remainder(2)  # 0 -> filled cell
    edge = torch.minimum(
        torch.minimum(fu - torch.floor(fu), torch.ceil(fu) - fu),
        torch.minimum(fv - torch.floor(fv), torch.ceil(fv) - fv),
    ) * c
    cells_sdf = torch.where(parity < 0.5, -edge, edge)
    return torch.maximum(_box(u, v, half, half), cells_sdf)


_SDF: tuple[Callable[[Tensor, Tensor], Tensor], ...] = (
    _disc, _square, _triangle, _ring, _cross, _bar, _bars, _diamond, _star, _checker,
)


def _segment_distance(px: Tensor, py: Tensor, seg: Tensor) -> Tensor:
    """Distance from pixel centres to segments; seg (m, 4) in pixels -> (m, S, S)."""
    x0, y0, x1, y1 = (seg[:, i].view(-1, 1, 1) for i in range(4))
    dx, dy = x1 - x0, y1 - y0
    t = (((px - x0) * dx + (py - y0) * dy) / (dx * dx + dy * dy).clamp(min=1e-6)).clamp(0, 1)
    return torch.hypot(px - (x0 + t * dx), py - (y0 + t * dy))


def _pixel_grid(size: int) -> tuple[Tensor, Tensor]:
    """Pixel-centre coordinates: x (1, 1, size), y (1, size, 1)."""
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    return coords.view(1, 1, size), coords.view(1, size, 1)


def _shape_distances(p: Tensor, labels: np.ndarray, size: int) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Per drawn class c: (c, its rows, signed distance in pixels from each pixel centre to the
    shape's outline, negative inside: (len(rows), size, size)). The one home of the geometry
    (radius, centre, rotation), shared by the images and the masks."""
    radius = size * (0.2 + 0.17 * p[:, _SCALE])  # shape radius: 20-37 % of the side
    # every shape lies within 1.07 radii of its centre: keep it (and its soft edge) in the frame
    margin = 1.1 * radius + 0.5
    cx = margin + (size - 2 * margin) * p[:, _CX]
    cy = margin + (size - 2 * margin) * p[:, _CY]
    theta = 2 * math.pi * p[:, _ROT]
    px, py = _pixel_grid(size)
    labels_t = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    for c in range(len(SHAPE_CLASSES)):
        rows = (labels_t == c).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        dx = px - cx[rows].view(-1, 1, 1)
        dy = py - cy[rows].view(-1, 1, 1)
        cos, sin = theta[rows].cos().view(-1, 1, 1), theta[rows].sin().view(-1, 1, 1)
        r = radius[rows].view(-1, 1, 1)
        u = (cos * dx + sin * dy) / r
        v = (-sin * dx + cos * dy) / r
        yield c, rows, _SDF[c](u, v) * r


def render_shapes(params: np.ndarray, labels: np.ndarray, size: int, clutter: int = 0) -> Tensor:
    """Render images from their parameter rows (uniform numbers in [0, 1)).

    Shape: params (m, P), labels (m,) -> uint8 (m, 3, size, size).
    """
    m = params.shape[0]
    p = torch.from_numpy(params.astype(np.float32))
    bg = p[:, _BG:_BG + 3]
    fg = p[:, _FG:_FG + 3]
    # keep the shape visible: a foreground too close to the background moves half a range away
    close = (fg - bg).norm(dim=1, keepdim=True) < 0.45
    fg = torch.where(close, (bg + 0.5).remainder(1.0), fg)

    px, py = _pixel_grid(size)
    img = bg.view(m, 3, 1, 1).expand(m, 3, size, size).clone()

    def paint(cover: Tensor, colour: Tensor, rows: Tensor | slice = slice(None)) -> None:
        cover = cover.unsqueeze(1)
        img[rows] = img[rows] * (1 - cover) + colour.view(-1, 3, 1, 1) * cover

    for j in range(min(int(clutter), MAX_CLUTTER)):
        col = _CLUTTER + j * _CLUTTER_COLS
        seg = p[:, col:col + 4] * size
        width = 0.8 + 1.2 * p[:, col + 7] * size / 32
        dist = _segment_distance(px, py, seg)
        paint((width.view(-1, 1, 1) / 2 + 0.5 - dist).clamp(0, 1), p[:, col + 4:col + 7])

    for _, rows, distance in _shape_distances(p, labels, size):
        paint((0.5 - distance).clamp(0, 1), fg[rows], rows)  # one pixel of anti-aliasing
    return img.mul_(255).round_().to(torch.uint8)


def render_shape_masks(params: np.ndarray, labels: np.ndarray, size: int) -> Tensor:
    """Per-pixel masks of the shapes :func:`render_shapes` draws from the same rows.

    A pixel is ``label + 1`` where its centre lies inside the shape's outline (there the
    anti-aliased image is at least half the foreground colour), else :data:`MASK_BACKGROUND`
    (0), clutter lines included: they are drawn behind the shape and belong to no class.

    Shape: params (m, P), labels (m,) -> uint8 (m, size, size), values 0..10.
    """
    p = torch.from_numpy(params.astype(np.float32))
    masks = torch.full((params.shape[0], size, size), MASK_BACKGROUND, dtype=torch.uint8)
    for c, rows, distance in _shape_distances(p, labels, size):
        masks[rows] = torch.where(distance <= 0, c + 1, MASK_BACKGROUND).to(torch.uint8)
    return masks


def _parameter_rows(n: int, size: int, seed: int, split: str, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Parameter rows and labels of images ``start .. start + n - 1`` (label of image i: i % 10)."""
    if n < 0 or size < 8:
        raise ValueError(f"shapes: need n >= 0 and size >= 8; got n={n}, size={size}")
    params = _stream(seed, split, salt=0).random((start + n, _NCOL))[start:]
    labels = (np.arange(start, start + n) % len(SHAPE_CLASSES)).astype(np.int64)
    return params, labels


def _in_chunks(out: Tensor, params: np.ndarray, labels: np.ndarray,
               draw: Callable[[np.ndarray, np.ndarray], Tensor]) -> Tensor:
    """Fill ``out`` (n, ..., size, size) by ``draw`` over chunks of about 0.5M pixels (in cache)."""
    step = max(1, (1 << 19) // (out.shape[-1] * out.shape[-2]))
    for s in range(0, out.shape[0], step):
        out[s:s + step] = draw(params[s:s + step], labels[s:s + step])
    return out


def generate_shapes(
    n: int, size: int = 32, seed: int = 0, split: str = "train", clutter: int = 0, *, start: int = 0
) -> tuple[Tensor, Tensor]:
    """Images ``start .. start + n - 1`` of the shapes data set.

    Returns (uint8 (n, 3, size, size), int64 labels (n,)); label of image i is ``i % 10``.
    """
    params, labels = _parameter_rows(n, size, seed, split, start)
    if not 0 <= int(clutter) <= MAX_CLUTTER:
        raise ValueError(f"shapes: clutter is a number of lines in 0..{MAX_CLUTTER}; got {clutter}")
    images = torch.empty((n, 3, size, size), dtype=torch.uint8)
    _in_chunks(images, params, labels, lambda p, y: render_shapes(p, y, size, clutter))
    return images, torch.from_numpy(labels)


def generate_shape_masks(n: int, size: int = 32, seed: int = 0, split: str = "train", *,
                         start: int = 0) -> Tensor:
    """Per-pixel masks of images ``start .. start + n - 1`` of :func:`generate_shapes` (same
    ``size``, ``seed`` and ``split``; any ``clutter``: the lines are background).

    Returns uint8 (n, size, size): 0 background, ``label + 1`` inside the shape (see
    :func:`render_shape_masks`).
    """
    params, labels = _parameter_rows(n, size, seed, split, start)
    masks = torch.empty((n, size, size), dtype=torch.uint8)
    return _in_chunks(masks, params, labels, lambda p, y: render_shape_masks(p, y, size))


class ShapesDataset(LabelledDataset):
    """The built-in ``shapes`` data set: n images of ten shape classes, generated from ``seed``.

    Items are ``(transform(image), label)`` with ``image`` a uint8 (3, size, size) tensor
    (no PIL round trip; every pipeline of :mod:`contrastive.augment` takes tensors).

    Args:
        n: number of images (train default 5,000; test default ``max(100, n // 5)`` via specs).
        size: side in pixels (any, 32 by default).
        seed: data seed; image i depends only on (seed, split, i).
        split: "train" or "test" (independent streams: the held-out split).
        clutter: number of random lines drawn behind the shape (0..8, harder with more).
    """

    classes = list(SHAPE_CLASSES)

    def __init__(
        self,
        n: int = 5000,
        size: int = 32,
        seed: int = 0,
        split: str = "train",
        clutter: int = 0,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.images, labels = generate_shapes(n, size, seed, split, clutter)
        super().__init__(labels.tolist(), transform, num_classes=len(SHAPE_CLASSES))
        self.size, self.seed, self.split, self.clutter = size, seed, split, clutter

    def load(self, index: int) -> Tensor:
        return self.images[index]

    def masks(self) -> Tensor:
        """Per-pixel masks of the images, uint8 (n, size, size): 0 background (clutter lines
        included), ``label + 1`` inside the shape (:func:`generate_shape_masks`)."""
        return generate_shape_masks(len(self), self.size, self.seed, self.split)

    def __repr__(self) -> str:
        return (f"ShapesDataset(n={len(self)}, size={self.size}, seed={self.seed}, "
                f"split={self.split!r}, clutter={self.clutter})")


class SyntheticDataset(LabelledDataset):
    """Uniform noise images with arbitrary labels, for smoke runs (nothing to learn).

    Image i is generated on access from (seed, split, i): uint8 (3, size, size) tensor;
    label ``i % num_classes``.
    """

    def __init__(
        self,
        n: int = 1000,
        size: int = 32,
        seed: int = 0,
        split: str = "train",
        num_classes: int = 10,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        if n < 0 or size < 1 or num_classes < 1:
            raise ValueError(f"synthetic: need n >= 0, size >= 1, num_classes >= 1; got {n}, {size}, {num_classes}")
        self._base = (int(seed) * 2 + _split_id(split)) * 1_000_003
        super().__init__([i % num_classes for i in range(n)], transform, num_classes=num_classes)
        self.classes = [f"class_{i}" for i in range(num_classes)]
        self.size, self.seed, self.split = size, seed, split

    def load(self, index: int) -> Tensor:
        g = torch.Generator().manual_seed(self._base + index)
        return torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)

    def __repr__(self) -> str:
        return f"SyntheticDataset(n={len(self)}, size={self.size}, seed={self.seed}, split={self.split!r})"


# ---- captions: what was drawn, in words (CLIP on shapes) -------------------------------------

COLOUR_NAMES: dict[str, tuple[float, float, float]] = {
    "black": (0.0, 0.0, 0.0), "white": (1.0, 1.0, 1.0), "grey": (0.5, 0.5, 0.5),
    "red": (0.9, 0.1, 0.1), "green": (0.1, 0.75, 0.1), "blue": (0.1, 0.2, 0.9),
    "yellow": (0.95, 0.9, 0.1), "cyan": (0.1, 0.85, 0.9), "magenta": (0.9, 0.1, 0.85),
    "orange": (0.95, 0.55, 0.1), "purple": (0.5, 0.15, 0.6), "brown": (0.5, 0.3, 0.1),
}
"""Named colours; an image's colour is the nearest name (RGB in [0, 1])."""
SIZE_WORDS = ("small", "medium", "large")
_ROWS, _COLS = ("top", "middle", "bottom"), ("left", "centre", "right")
CAPTION_TEMPLATES: tuple[str, ...] = (
    "a {size} {colour} {shape}",
    "a {colour} {shape} on a {background} background",
    "a picture of a {shape} in the {position}",
    "{size} {shape}, {colour}, {position}",
    "there is a {colour} {shape} at the {position}",
)
"""The phrasings of :func:`shape_captions`, one caption per template and image."""


def _colour_name(rgb: Tensor) -> list[str]:
    names = list(COLOUR_NAMES)
    table = torch.tensor([COLOUR_NAMES[k] for k in names])
    return [names[i] for i in torch.cdist(rgb, table).argmin(dim=1).tolist()]


def _position(cx: float, cy: float) -> str:
    row, col = _ROWS[min(int(cy * 3), 2)], _COLS[min(int(cx * 3), 2)]
    if row == "middle":
        return "centre" if col == "centre" else col
    return row if col == "centre" else f"{row} {col}"


def shape_attributes(n: int, seed: int = 0, split: str = "train", *,
                     start: int = 0) -> list[dict[str, str]]:
    """What image ``start + i`` of :func:`generate_shapes` shows (same seed and split): its
    ``shape`` (class name), ``colour`` / ``background`` (nearest named colour of the drawn
    foreground, after the visibility shift, and of the background), ``size`` (thirds of the
    radius range) and ``position`` (thirds of the centre's range, e.g. "top left", "centre").

    Reads the same parameter rows as the renderer; draws nothing and changes nothing.
    """
    if n < 0:
        raise ValueError(f"shapes: need n >= 0; got n={n}")
    params = _stream(seed, split, salt=0).random((start + n, _NCOL))[start:]
    p = torch.from_numpy(params.astype(np.float32))
    bg, fg = p[:, _BG:_BG + 3], p[:, _FG:_FG + 3]
    close = (fg - bg).norm(dim=1, keepdim=True) < 0.45  # as render_shapes
    fg = torch.where(close, (bg + 0.5).remainder(1.0), fg)
    fg_names, bg_names = _colour_name(fg), _colour_name(bg)
    out = []
    for i in range(n):
        out.append({
            "shape": SHAPE_CLASSES[(start + i) % len(SHAPE_CLASSES)],
            "colour": fg_names[i], "background": bg_names[i],
            "size": SIZE_WORDS[min(int(float(p[i, _SCALE]) * 3), 2)],
            "position": _position(float(p[i, _CX]), float(p[i, _CY])),
        })
    return out


def shape_captions(n: int, seed: int = 0, split: str = "train", *, start: int = 0,
                   templates: tuple[str, ...] = CAPTION_TEMPLATES) -> list[list[str]]:
    """Several captions per image of :func:`generate_shapes` (one per template), e.g.
    "a small red disc", "a picture of a disc in the top left"."""
    return [[t.format(**a) for t in templates]
            for a in shape_attributes(n, seed, split, start=start)]
