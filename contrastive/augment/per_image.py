"""Per-image execution path: one image in, one view out, in a loader worker.

Built on ``torchvision.transforms.v2`` over tensors: the crop produces a uint8 CHW tensor
(straight from PIL with one resize, or from a uint8 tensor), the colour operations then run on
float32 in [0, 1] (torchvision's uint8 kernels convert to float inside every operation and
truncate back after it; staying in float avoids that repeated rounding), and the view ends
normalised. Grayscale, solarize, flip, normalisation and the random-apply logic are
torchvision's; colour jitter and blur use our kernels (equal results, several times faster).

Random parameters come from torch's global generator, like every torchvision transform; the
loader of :mod:`contrastive.data` seeds it per sample, which makes views reproducible across
runs and worker counts.

torchvision is imported only when a view with colour operations is built for this path: the
crops, the centre crop and the normalisation that the batched path and the evaluation views use
are written here with torchvision's draws and pixels. Importing torchvision loads
``torch._dynamo`` (through ``torchvision.ops``): about 2.5 s of CPU on a 2-core AVX2 box in a
process that builds no optimiser (``--help``, a bad flag's one-line error, an evaluation),
0.3 s in a training run (``torch.optim`` loads ``torch._dynamo`` anyway).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from PIL import Image
from torch import Tensor

from contrastive.augment import functional as AF
from contrastive.augment.config import ViewConfig
from contrastive.data.decode import EncodedImage, fast_resized_crop, resize_uint8
from contrastive.data.io import as_uint8_chw

ImageLike = Image.Image | Tensor | EncodedImage


def _uniform(lo: float, hi: float) -> float:
    return float(torch.empty(1).uniform_(lo, hi).item())


def random_resized_crop_box(height: int, width: int, scale: Sequence[float],
                            ratio: Sequence[float]) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random resized crop of an image of ``height x width``, drawn from
    torch's global generator exactly as torchvision's ``RandomResizedCrop.get_params`` draws it
    (the Inception crop: area fraction ~ U[scale], log aspect ratio ~ U[log ratio] in float32,
    up to 10 tries, then the whole image clamped to the ratio range, centred), so views do not
    change with the implementation (tests/augment/test_functional.py compares the two)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(list(ratio)))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(float(log_ratio[0]), float(log_ratio[1]))).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    return centred_box(height, width, ratio)


def centred_box(height: int, width: int, ratio: Sequence[float]) -> tuple[int, int, int, int]:
    """The random resized crop's fallback when no try fits: the whole image clamped to the
    ratio range, centred, as (top, left, h, w)."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def prepare(img: ImageLike) -> Tensor | EncodedImage:
    """What the crops of several views share: an :class:`EncodedImage` as it is (each crop
    decodes what it needs, see :mod:`contrastive.data.decode`), anything else as uint8 CHW."""
    return img if isinstance(img, EncodedImage) else as_uint8_chw(img)


class RandomResizedCropUint8:
    """Random resized crop to ``size x size``, returning a uint8 (3, size, size) tensor.

    Crop box sampled as torchvision's ``RandomResizedCrop.get_params`` (area fraction ~ U[scale],
    log aspect ratio ~ U[log ratio], 10 tries, then a centre crop); bilinear, antialiased, with
    torch's uint8 resampling kernel (about 3x faster than PIL's ``resize`` at 224 px).
    An :class:`EncodedImage` gets the same box, drawn on its size read from the header, and is
    decoded for it (at a reduced scale where the box allows, :meth:`EncodedImage.resized_crop`).
    """

    def __init__(self, size: int, scale: Sequence[float], ratio: Sequence[float]) -> None:
        self.size = int(size)
        self.scale = list(scale)
        self.ratio = list(ratio)

    def sample_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, h, w) drawn from torch's global generator for an image of that size
        (:func:`random_resized_crop_box`: its draws depend on the size only)."""
        return random_resized_crop_box(height, width, self.scale, self.ratio)

    def __call__(self, img: ImageLike) -> Tensor:
        if isinstance(img, EncodedImage):
            return img.resized_crop(*self.sample_box(*img.size), self.size)
        t = as_uint8_chw(img)
        top, left, h, w = self.sample_box(t.shape[-2], t.shape[-1])
        return resized_crop_uint8(t, top, left, h, w, self.size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio})"


def resized_crop_uint8(img: ImageLike, top: int, left: int, h: int, w: int, size: int) -> Tensor:
    """Crop the box (top, left, h, w) and resize it to (size, size), bilinear + antialias -> uint8 CHW
    (torchvision's ``resized_crop`` pixels, faster: :func:`~contrastive.data.decode.fast_resized_crop`)."""
    return fast_resized_crop(as_uint8_chw(img), top, left, h, w, size)


class CenterCropUint8:
    """Resize the shorter side to ``resize`` (bilinear, antialiased), centre crop ``size`` -> uint8 CHW
    (torchvision's ``resize`` + ``center_crop`` pixels: the same torch kernel and crop anchor)."""

    def __init__(self, size: int, resize: int) -> None:
        self.size = int(size)
        self.resize = int(resize)

    def __call__(self, img: ImageLike) -> Tensor:
        t = img.full() if isinstance(img, EncodedImage) else as_uint8_chw(img)
        h, w = t.shape[-2:]
        scale = self.resize / min(h, w)
        new = [max(self.size, round(h * scale)), max(self.size, round(w * scale))]
        t = resize_uint8(t, new[0], new[1])
        top = int(round((new[0] - self.size) / 2.0))
        left = int(round((new[1] - self.size) / 2.0))
        return t[:, top:top + self.size, left:left + self.size].contiguous()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, resize={self.resize})"


class ColorJitter:
    """Colour jitter on one float (3, H, W) image, parameters drawn like torchvision's.

    Factors: brightness, contrast, saturation ~ U[max(0, 1 - s), 1 + s], hue ~ U[-h, h], drawn
    from torch's global generator in torchvision's ``ColorJitter`` order; ``order="random"``
    applies the four operations in a random order (``torch.randperm(4)``, as torchvision),
    ``"fixed"`` in the order brightness, contrast, saturation, hue. The kernels are those of
    :mod:`contrastive.augment.functional` (the batched path's), equal to torchvision's
    ``adjust_*`` to 1e-6 and several times faster on the CPU (tests/augment check both).
    """

    def __init__(self, brightness: float, contrast: float, saturation: float, hue: float,
                 order: str = "random") -> None:
        self.brightness, self.contrast, self.saturation, self.hue = brightness, contrast, saturation, hue
        self.order = order

    def __call__(self, x: Tensor) -> Tensor:
        perm = torch.randperm(4).tolist() if self.order == "random" else [0, 1, 2, 3]
        strengths = (self.brightness, self.contrast, self.saturation)
        factors = [_uniform(max(0.0, 1 - s), 1 + s) if s > 0 else None for s in strengths]
        factors.append(_uniform(-self.hue, self.hue) if self.hue > 0 else None)
        y = x.unsqueeze(0).clone(memory_format=torch.contiguous_format)  # kernels work in place
        for op in perm:
            if factors[op] is not None:
                _KERNELS[op](y, torch.tensor([factors[op]], dtype=x.dtype))
        return y.squeeze(0)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(brightness={self.brightness}, contrast={self.contrast}, "
                f"saturation={self.saturation}, hue={self.hue}, order={self.order!r})")


_KERNELS = (AF.adjust_brightness_, AF.adjust_contrast_, AF.adjust_saturation_, AF.adjust_hue_)


class SeparableGaussianBlur:
    """Gaussian blur with sigma ~ U[sigma], as ``v2.GaussianBlur`` but separable.

    torchvision convolves with the full K x K kernel (K^2 multiply-adds per pixel, 529 at
    224 px); two 1-D passes give the same result for 2 K. Taps beyond 4 sigma (total weight
    below 1e-4) are dropped, as in the batched path (:func:`~contrastive.augment.functional.blur_radius`).
    """

    def __init__(self, kernel_size: int, sigma: Sequence[float]) -> None:
        self.kernel_size = int(kernel_size)
        self.sigma = (float(sigma[0]), float(sigma[1]))

    def __call__(self, x: Tensor) -> Tensor:
        sigma = torch.tensor([_uniform(*self.sigma)])
        return AF.gaussian_blur(x.unsqueeze(0), sigma, self.kernel_size).squeeze(0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kernel_size={self.kernel_size}, sigma={self.sigma})"


def build_crop(cfg: ViewConfig):
    """The geometric part of a view (runs in the worker in both paths): image -> uint8 CHW."""
    if cfg.crop == "center":
        return CenterCropUint8(cfg.size, cfg.resize_size())
    return RandomResizedCropUint8(cfg.size, cfg.scale, cfg.ratio)


def _transforms_v2():
    """``torchvision.transforms.v2``, imported on first use (see the module's docstring)."""
    from torchvision.transforms import v2

    return v2


def build_colour_ops(cfg: ViewConfig) -> list:
    """The photometric part of a view, float CHW in [0, 1] -> float CHW in [0, 1]; torchvision's
    random-apply, grayscale, solarize and flip around our jitter and blur kernels."""
    if not (cfg.jitters or cfg.grayscale_p > 0 or cfg.blur_p > 0 or cfg.solarize_p > 0
            or cfg.flip_p > 0):
        return []
    v2 = _transforms_v2()
    ops: list = []
    jitter: list = []
    if cfg.jitters:
        j = ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue, cfg.jitter_order)
        jitter = [v2.RandomApply([j], p=cfg.jitter_p)]
    gray = [v2.RandomGrayscale(p=cfg.grayscale_p)] if cfg.grayscale_p > 0 else []
    ops += gray + jitter if cfg.grayscale_first else jitter + gray
    if cfg.blur_p > 0:
        ops.append(v2.RandomApply([SeparableGaussianBlur(cfg.kernel_size, cfg.blur_sigma)], p=cfg.blur_p))
    if cfg.solarize_p > 0:
        ops.append(v2.RandomSolarize(threshold=cfg.solarize_threshold, p=cfg.solarize_p))
    if cfg.flip_p > 0:
        ops.append(v2.RandomHorizontalFlip(p=cfg.flip_p))
    return ops


class PerImageView:
    """One view on the per-image path: crop (uint8) -> float -> colour ops -> normalise."""

    def __init__(self, cfg: ViewConfig, mean: Sequence[float], std: Sequence[float]) -> None:
        self.cfg = cfg
        self.crop = build_crop(cfg)
        ops = build_colour_ops(cfg)
        self.colour = _transforms_v2().Compose(ops) if ops else None
        self.mean = list(mean)
        self.std = list(std)
        self._mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, img: ImageLike) -> Tensor:
        """``img``: PIL image or uint8 (3, H, W) tensor (:func:`~contrastive.data.io.as_uint8_chw` it once for several views)."""
        x = self.crop(img).to(torch.float32).mul_(1.0 / 255.0)
        if self.colour is not None:
            x = self.colour(x)
        # torchvision's normalize: out of place first (a grayscale view may share its memory)
        return x.sub(self._mean).div_(self._std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(crop={self.crop!r}, colour={self.colour!r})"
