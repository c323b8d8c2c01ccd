"""Batched execution path: workers decode and crop, the device does the rest per sample.

``WorkerCrops`` runs in the loader workers: image -> one uint8 (3, S_v, S_v) tensor per view
(crop + resize only, so a batch moves as uint8, 4x fewer bytes than float32).
``DeviceAugment`` runs in the training process on the whole batch of each view: colour jitter,
grayscale, blur, solarize, flip and normalisation with parameters drawn PER SAMPLE from one
generator (a torchvision transform applied to a batch would draw one set for all samples,
which makes every image of the batch share its colour distortion).

How the work is vectorised (no Python loop over samples): all random numbers of a view come
from one ``torch.rand(B, 14)`` call, then one of two strategies (same views for the same draw):
- "dense" (accelerators): each operation runs on the whole batch with per-sample parameters,
  identity parameters where a sample does not draw it; the random order of the four jitter
  operations is realised as four steps in which each sample applies the operation it drew
  for that step (brightness, contrast, saturation fused into one update; the costly hue
  rotation on the samples that draw it). About 150 kernels per view whatever the batch.
- "grouped" (CPU, where arithmetic is the cost): samples are sorted by jitter order (24
  permutations plus "not jittered") so that each group is a contiguous slice; grayscale, blur,
  solarize and flip run only on the samples that draw them; a few samples at a time stay in
  cache; normalisation writes back in the original order.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import Tensor

from contrastive.augment import functional as AF
from contrastive.augment.config import ViewConfig
from contrastive.augment.per_image import (
    ImageLike,
    RandomResizedCropUint8,
    as_uint8_chw,
    build_crop,
    resized_crop_uint8,
)
from contrastive.augment.share import WHOLE, Share, rand_rows
from contrastive.data.decode import EncodedImage

# columns of the per-view random draw
_JIT, _B, _C, _S, _H, _ORD, _GRAY, _BLUR, _SIGMA, _SOL, _FLIP = 0, 1, 2, 3, 4, 5, 9, 10, 11, 12, 13
_NCOL = 14
_PERMS = list(itertools.permutations(range(4)))
_NOT_JITTERED = len(_PERMS)
_OPS = ("brightness", "contrast", "saturation", "hue")


class WorkerCrops:
    """The worker half of :meth:`Pipeline.split`: image -> list of uint8 (3, S_v, S_v) tensors."""

    accepts_encoded = True  # takes contrastive.data.decode.EncodedImage

    def __init__(self, views: Sequence[ViewConfig]) -> None:
        self.views = tuple(views)
        self.crops = [build_crop(v) for v in self.views]

    def __call__(self, img: ImageLike) -> list[Tensor]:
        if isinstance(img, EncodedImage):
            return self._encoded(img)
        t = as_uint8_chw(img)  # one conversion for all views
        return [crop(t) for crop in self.crops]

    def _encoded(self, img: EncodedImage) -> list[Tensor]:
        """All boxes drawn first (in view order: the same draws as above), then ONE decode at the
        coarsest scale fine enough for every view (:mod:`contrastive.data.decode`), then the crops."""
        boxes = [c.sample_box(*img.size) if isinstance(c, RandomResizedCropUint8) else None
                 for c in self.crops]
        img.prepare(min(img.scale_for(b[2], b[3], c.size) if b is not None else 1
                        for b, c in zip(boxes, self.crops)))
        return [img.resized_crop(*b, c.size) if b is not None else c(img)
                for b, c in zip(boxes, self.crops)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.crops!r})"


class WorkerCropsWithBoxes(WorkerCrops):
    """:class:`WorkerCrops` that also returns each view's crop box in the original image:
    image -> ``{"views": [uint8 (3, S_v, S_v)], "crop_boxes": (V, 4) float32}`` (top, left, h,
    w in pixels; collated: (N, V, 4)), for VICRegL's location matching. The same random draws
    and pixels as :class:`WorkerCrops`; random-resized-crop views only."""

    def __init__(self, views: Sequence[ViewConfig]) -> None:
        super().__init__(views)
        if not all(isinstance(c, RandomResizedCropUint8) for c in self.crops):
            raise ValueError("crop boxes need random-resized-crop views (a centre crop has no "
                             "random box to return)")
        self.random_crops = cast(list[RandomResizedCropUint8], self.crops)

    def __call__(self, img: ImageLike) -> dict[str, Any]:  # type: ignore[override]
        if isinstance(img, EncodedImage):
            boxes = [c.sample_box(*img.size) for c in self.random_crops]
            img.prepare(min(img.scale_for(b[2], b[3], c.size)
                            for b, c in zip(boxes, self.random_crops)))
            views = [img.resized_crop(*b, c.size) for b, c in zip(boxes, self.random_crops)]
        else:
            t = as_uint8_chw(img)
            boxes = [c.sample_box(t.shape[-2], t.shape[-1]) for c in self.random_crops]
            views = [resized_crop_uint8(t, *b, c.size) for b, c in zip(boxes, self.random_crops)]
        return {"views": views, "crop_boxes": torch.tensor(boxes, dtype=torch.float32)}


class _Timer:
    """Accumulates wall time per stage into a dict (synchronising CUDA) when asked to."""

    def __init__(self, times: dict[str, float] | None, device: torch.device) -> None:
        self.times = times
        self.cuda = device.type == "cuda"

    @contextmanager
    def __call__(self, stage: str):
        if self.times is None:
            yield
            return
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.times[stage] = self.times.get(stage, 0.0) + time.perf_counter() - t0


def _factor_range(strength: float) -> tuple[float, float]:
    return max(0.0, 1.0 - strength), 1.0 + strength


class DeviceAugment:
    """The device half of :meth:`Pipeline.split`.

    ``device_fn(views, generator=None, share=WHOLE)``: ``views`` is a list (one entry per view
    of the pipeline) of uint8 tensors (B, 3, S_v, S_v) on the training device; returns float32
    normalised tensors of the same shapes. Parameters are drawn per sample from ``generator``
    (a ``torch.Generator`` on any device; None: the global generator of the views' device), for
    the whole global micro-batch of which ``views`` are process ``share``'s rows
    (:mod:`~contrastive.augment.share`: the views do not depend on the number of processes).
    ``stage_times``: optional dict that receives the seconds spent per stage (for benchmarks).

    ``strategy`` (None: by device):
      - ``"dense"`` (accelerators): every operation runs on the whole batch with per-sample
        parameters, identity parameters for the samples that do not draw it (four jitter steps,
        each sample applying the operation its drawn order puts there; hue on the samples that
        draw it). A fixed sequence of kernels whatever the batch, no Python loop over samples.
      - ``"grouped"`` (CPU): samples sorted by jitter order, each operation only on the
        samples that draw it, processed ``chunk_size`` samples at a time (default
        :func:`cpu_chunk`: :data:`CPU_CHUNK` at 224 px, more for smaller images): elementwise work on a few images that stay in cache is several times faster
        than streaming a whole batch through memory once per operation.
    Both give the same views (to float rounding) for the same generator state: the random
    numbers are drawn for the whole batch first, whatever the strategy or chunk size.
    """

    def __init__(
        self,
        views: Sequence[ViewConfig],
        mean: Sequence[float],
        std: Sequence[float],
        chunk_size: int | None = None,
        strategy: str | None = None,
    ) -> None:
        if strategy not in (None, "dense", "grouped"):
            raise ValueError(f"strategy must be None, 'dense' or 'grouped'; got {strategy!r}")
        self.strategy = strategy
        self.views = tuple(views)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if chunk_size is not None and (isinstance(chunk_size, bool) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive int or None; got {chunk_size!r}")
        self.chunk_size = chunk_size
        self._stats: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def _mean_std(self, device: torch.device) -> tuple[Tensor, Tensor]:
        if device not in self._stats:
            self._stats[device] = (
                torch.tensor(self.mean, device=device),
                torch.tensor(self.std, device=device),
            )
        return self._stats[device]

    def __call__(
        self,
        views: Sequence[Tensor],
        generator: torch.Generator | None = None,
        *,
        share: Share = WHOLE,
        stage_times: dict[str, float] | None = None,
    ) -> list[Tensor]:
        if isinstance(views, Tensor):
            views = [views]
        if len(views) != len(self.views):
            raise ValueError(
                f"views: expected a list of {len(self.views)} uint8 batches (one per view of the "
                f"pipeline); got {len(views)}"
            )
        return [
            self.augment_view(x, cfg, generator, share=share, stage_times=stage_times)
            for x, cfg in zip(views, self.views)
        ]

    def augment_view(
        self,
        x: Tensor,
        cfg: ViewConfig,
        generator: torch.Generator | None = None,
        *,
        share: Share = WHOLE,
        stage_times: dict[str, float] | None = None,
    ) -> Tensor:
        """Augment one view's batch: uint8 (B, 3, H, W) -> normalised float32 (B, 3, H, W)."""
        if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(
                f"views: each entry must be a uint8 tensor (B, 3, H, W) as produced by the worker "
                f"half of Pipeline.split(); got dtype {x.dtype}, shape {tuple(x.shape)}"
            )
        dev = x.device
        timer = _Timer(stage_times, dev)
        n = x.shape[0]
        mean, std = self._mean_std(dev)
        if cfg.crop == "center" or n == 0:
            with timer("normalize"):
                return AF.normalize(x.float().mul_(1.0 / 255.0), mean, std)

        strategy = self.strategy or ("grouped" if dev.type == "cpu" else "dense")
        with timer("params"):
            p = _draw(n, cfg, generator, dev, share, sort=strategy == "grouped")
        if strategy == "dense":
            return _augment_dense(x, cfg, p, mean, std, timer)
        chunk = self.chunk_size or (cpu_chunk(x.shape[-2:]) if dev.type == "cpu" else n)
        out = torch.empty(x.shape, dtype=torch.float32, device=dev)
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            with timer("to_float"):
                xs = x.index_select(0, p.order[c0:c1]).float().mul_(1.0 / 255.0)
            if cfg.grayscale_first:
                _subset(xs, p.gray[c0:c1], _to_gray, timer, "grayscale")
            if cfg.jitters:
                with timer("colour"):
                    for code, start, end in p.groups:
                        lo, hi = max(start, c0), min(end, c1)
                        if lo >= hi or code == _NOT_JITTERED:
                            continue
                        sl = slice(lo - c0, hi - c0)
                        for op in _PERMS[code] if cfg.jitter_order == "random" else range(4):
                            name = _OPS[op]
                            if getattr(cfg, name) > 0:
                                _APPLY[name](xs[sl], p.factors[name][lo:hi])
            if not cfg.grayscale_first:
                _subset(xs, p.gray[c0:c1], _to_gray, timer, "grayscale")
            _subset(xs, p.blur[c0:c1], _Blur(p.sigma[c0:c1], cfg.kernel_size), timer, "blur")
            _subset(xs, p.solarize[c0:c1], lambda t, i: AF.solarize_(t, cfg.solarize_threshold),
                    timer, "solarize")
            _subset(xs, p.flip[c0:c1], lambda t, i: t.flip(-1), timer, "flip")
            with timer("normalize"):
                out.index_copy_(0, p.order[c0:c1], AF.normalize_(xs, mean, std))
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(views={len(self.views)}, mean={self.mean}, std={self.std}, "
                f"chunk_size={self.chunk_size}, strategy={self.strategy!r})")


CPU_CHUNK = 2  # samples per chunk at 224 px: two float32 images, 1.2 MB, stay in cache
_CPU_CHUNK_PIXELS = CPU_CHUNK * 224 * 224


def cpu_chunk(size: Sequence[int]) -> int:
    """Samples per chunk on the CPU for images of ``size`` (H, W): as many as fill the cache
    that two 224 px images fill (:data:`CPU_CHUNK`). Small images in chunks of 2 would spend the
    step in Python: at 24 px, 64 chunks per view took 40 % of a ``small_cnn`` MoCo step
    (benchmarks/results/train.md); a whole batch of 128 such images is 0.9 MB."""
    h, w = int(size[0]), int(size[1])
    return max(1, _CPU_CHUNK_PIXELS // max(1, h * w))


class _Params:
    """Per-sample parameters of one view's batch, in the processing (sorted) order."""

    order: Tensor  # processing position -> sample index
    jittered: Tensor
    perm: Tensor  # (B, 4): operation index at each of the four jitter steps
    groups: list[tuple[int, int, int]]  # (jitter order code, start, end) over positions
    factors: dict[str, Tensor]
    gray: Tensor
    blur: Tensor
    sigma: Tensor
    solarize: Tensor
    flip: Tensor
    hue_idx: list[Tensor] | None  # per jitter step, the samples that rotate their hue there


def _draw(
    n: int, cfg: ViewConfig, generator: torch.Generator | None, dev: torch.device,
    share: Share = WHOLE, sort: bool = True
) -> _Params:
    p = _Params()
    p.hue_idx = None
    if generator is not None and generator.device.type == "cpu":
        u_host = rand_rows(n, (_NCOL,), generator, share)  # (n, _NCOL)
        u = u_host.to(dev, non_blocking=True)
        if not sort and cfg.hue > 0:  # drawn on the host: pick the hue subsets there, no sync
            jit_h, perm_h = _jitter_order(u_host, cfg)
            p.hue_idx = [(jit_h & (perm_h[:, k] == 3)).nonzero().squeeze(1)
                         .to(dev, non_blocking=True) for k in range(4)]
    else:
        u = rand_rows(n, (_NCOL,), generator, share, device=dev).to(dev, non_blocking=True)
    jittered, perm = _jitter_order(u, cfg)
    if sort:
        code = perm[:, 0] * 6 + _lehmer_tail(perm) if cfg.jitter_order == "random" else perm[:, 0] * 0
        code = torch.where(jittered, code, torch.full_like(code, _NOT_JITTERED))
        p.order = code.argsort(stable=True)
        u, perm, jittered = u[p.order], perm[p.order], jittered[p.order]
        codes, counts = torch.unique_consecutive(code[p.order], return_counts=True)
        p.groups, start = [], 0
        for c, k in zip(codes.tolist(), counts.tolist()):
            p.groups.append((c, start, start + k))
            start += k
    else:
        p.order, p.groups = torch.arange(n, device=dev), []
    p.jittered, p.perm = jittered, perm
    p.factors = {
        "brightness": _lerp(u[:, _B], *_factor_range(cfg.brightness)),
        "contrast": _lerp(u[:, _C], *_factor_range(cfg.contrast)),
        "saturation": _lerp(u[:, _S], *_factor_range(cfg.saturation)),
        "hue": _lerp(u[:, _H], -cfg.hue, cfg.hue),
    }
    p.gray = u[:, _GRAY] < cfg.grayscale_p
    p.blur = u[:, _BLUR] < cfg.blur_p
    p.sigma = _lerp(u[:, _SIGMA], *cfg.blur_sigma)
    p.solarize = u[:, _SOL] < cfg.solarize_p
    p.flip = u[:, _FLIP] < cfg.flip_p
    return p


def _jitter_order(u: Tensor, cfg: ViewConfig) -> tuple[Tensor, Tensor]:
    """(jittered (B,), perm (B, 4)) from a view's draw ``u``: which samples are jittered and
    the operation index at each of the four jitter steps."""
    jittered = (u[:, _JIT] < cfg.jitter_p) & cfg.jitters
    if cfg.jitter_order == "random":
        perm = u[:, _ORD:_ORD + 4].argsort(dim=1)  # a uniformly random order of the 4 ops
    else:
        perm = torch.arange(4, device=u.device).expand(u.shape[0], 4)
    return jittered, perm


def _augment_dense(x: Tensor, cfg: ViewConfig, p: _Params, mean: Tensor, std: Tensor, timer: _Timer) -> Tensor:
    """The "dense" strategy of :class:`DeviceAugment` (whole batch, masks). No host sync when the
    numbers are drawn by a CPU generator (the engine's :func:`~contrastive.engine.loader.step_generator`):
    the samples that rotate their hue are then picked on the host; else one small sync per
    jitter step picks them."""
    with timer("to_float"):
        xs = x.float().mul_(1.0 / 255.0)

    def gray(xs: Tensor) -> Tensor:
        if cfg.grayscale_p <= 0:
            return xs
        with timer("grayscale"):
            return torch.where(p.gray.view(-1, 1, 1, 1), AF.rgb_to_gray(xs), xs)

    if cfg.grayscale_first:
        xs = gray(xs)
    if cfg.jitters:
        with timer("colour"):
            for step in range(4):
                _jitter_step_dense(xs, cfg, p, step)
    if not cfg.grayscale_first:
        xs = gray(xs)
    if cfg.blur_p > 0:
        with timer("blur"):
            xs = AF.gaussian_blur(xs, p.sigma, cfg.kernel_size, radius=AF.blur_radius(cfg.blur_sigma[1],
                                  cfg.kernel_size), active=p.blur)
    if cfg.solarize_p > 0:
        with timer("solarize"):
            mask = torch.ge(xs, cfg.solarize_threshold).to(xs.dtype) * p.solarize.view(-1, 1, 1, 1)
            xs.addcmul_(mask, 1.0 - 2.0 * xs)
    if cfg.flip_p > 0:
        with timer("flip"):
            xs = torch.where(p.flip.view(-1, 1, 1, 1), xs.flip(-1), xs)
    with timer("normalize"):
        return AF.normalize_(xs, mean, std)


def _jitter_step_dense(xs: Tensor, cfg: ViewConfig, p: _Params, step: int) -> None:
    """One of the four jitter steps on the whole batch: every sample applies the operation
    its order puts at this step. Brightness, contrast and saturation are one update,

        x <- clamp(a x + w_gray gray(x) + w_mean mean(gray(x)), 0, 1)

    with (a, w_gray, w_mean) = (b, 0, 0), (c, 0, 1 - c), (s, 1 - s, 0) or (1, 0, 0) per sample;
    the hue rotation (the costly one) runs only on the samples that draw it at this step."""
    op_here = p.perm[:, step] if cfg.jitter_order == "random" else torch.full_like(p.perm[:, 0], step)
    chosen = [p.jittered & (op_here == op) & (getattr(cfg, _OPS[op]) > 0) for op in range(4)]
    if cfg.brightness > 0 or cfg.contrast > 0 or cfg.saturation > 0:
        one = torch.ones_like(p.factors["brightness"])
        a = torch.where(chosen[0], p.factors["brightness"], one)
        a = torch.where(chosen[1], p.factors["contrast"], a)
        a = torch.where(chosen[2], p.factors["saturation"], a)
        w_gray = torch.where(chosen[2], 1.0 - p.factors["saturation"], 0.0).view(-1, 1, 1, 1)
        w_mean = torch.where(chosen[1], 1.0 - p.factors["contrast"], 0.0).view(-1, 1, 1, 1)
        if cfg.contrast > 0 or cfg.saturation > 0:
            gray = AF.rgb_to_gray(xs)
            mean = gray.mean(dim=(1, 2, 3), keepdim=True)
            xs.mul_(a.view(-1, 1, 1, 1)).add_(gray * w_gray).add_(mean * w_mean)
        else:
            xs.mul_(a.view(-1, 1, 1, 1))
        xs.clamp_(0.0, 1.0)
    if cfg.hue > 0:
        idx = p.hue_idx[step] if p.hue_idx is not None else chosen[3].nonzero().squeeze(1)
        if idx.numel():
            xs.index_copy_(0, idx, AF.adjust_hue_(xs.index_select(0, idx), p.factors["hue"][idx]))


class _Blur:
    def __init__(self, sigma: Tensor, kernel_size: int) -> None:
        self.sigma, self.kernel_size = sigma, kernel_size

    def __call__(self, t: Tensor, idx: Tensor) -> Tensor:
        return AF.gaussian_blur(t, self.sigma[idx], self.kernel_size)


def _to_gray(t: Tensor, idx: Tensor) -> Tensor:
    return AF.rgb_to_gray(t).expand_as(t)


def _subset(xs: Tensor, mask: Tensor, fn, timer: _Timer, stage: str) -> None:
    """Apply ``fn(sub, idx)`` to the samples of ``xs`` where ``mask`` is set, in place."""
    with timer(stage):
        idx = mask.nonzero().squeeze(1)
        if idx.numel() == 0:
            return
        if idx.numel() == xs.shape[0]:
            xs.copy_(fn(xs, torch.arange(xs.shape[0], device=xs.device)))
        else:
            xs.index_copy_(0, idx, fn(xs.index_select(0, idx), idx))


def _lerp(u: Tensor, lo: float, hi: float) -> Tensor:
    return u * (hi - lo) + lo


def _lehmer_tail(perm: Tensor) -> Tensor:
    """Index of a permutation of 4 among ``itertools.permutations`` order, minus the first digit.

    perm (B, 4) -> (B,); together with ``perm[:, 0] * 6`` gives the lexicographic rank 0..23.
    """
    rank = torch.zeros(perm.shape[0], dtype=torch.long, device=perm.device)
    for i, weight in ((1, 2), (2, 1)):
        smaller_after = (perm[:, i + 1:] < perm[:, i:i + 1]).sum(dim=1)
        rank += smaller_after * weight
    return rank


_APPLY = {
    "brightness": AF.adjust_brightness_,
    "contrast": AF.adjust_contrast_,
    "saturation": AF.adjust_saturation_,
    "hue": AF.adjust_hue_,
}
