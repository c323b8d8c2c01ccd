"""What one augmented view is: a frozen, validated description shared by both execution paths.

A :class:`ViewConfig` lists the random operations of one view and their parameters, in the
order the official code applies them:

    random resized crop -> colour jitter (p) -> grayscale (p) -> Gaussian blur (p)
    -> solarize (p) -> horizontal flip (p) -> to float in [0, 1] -> normalise

(MoCo v1 applies grayscale *before* the jitter: ``grayscale_first=True``.) The per-image path
(:mod:`contrastive.augment.per_image`) and the batched path (:mod:`contrastive.augment.batched`)
are both built from the same config, so they draw from the same distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

JITTER_ORDERS = ("random", "fixed")


def default_blur_kernel_size(image_size: int) -> int:
    """Odd kernel side of about 10 % of the image side (SimCLR, appendix A; BYOL): 224 -> 23, 96 -> 9.

    ``2 * (int(0.1 * size) // 2) + 1``, at least 3.
    """
    return max(3, 2 * (int(0.1 * image_size) // 2) + 1)


def _check_range(name: str, value: tuple[float, float], lo: float, hi: float) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (min, max); got {value!r}") from None
    if not (lo <= a <= b <= hi):
        raise ValueError(f"{name} must satisfy {lo} <= min <= max <= {hi}; got {value!r}")
    return a, b


def _check_prob(name: str, p: float) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} is a probability and must be in [0, 1]; got {p}")
    return p


@dataclass(frozen=True)
class ViewConfig:
    """Parameters of one random view (or, with ``crop="center"``, of the evaluation transform).

    Crop
        ``size``: output side in pixels. ``scale``: range of the crop area as a fraction of the
        image area; ``ratio``: range of the crop aspect ratio (sampled log-uniformly), as in
        Inception / torchvision ``RandomResizedCrop``. ``crop="center"`` instead resizes the
        shorter side to ``round(size / crop_pct)`` and takes the central ``size x size`` square.
    Colour jitter (applied with probability ``jitter_p``)
        brightness factor b ~ U[max(0, 1 - brightness), 1 + brightness]:  x <- clamp(b x)
        contrast factor c ~ U[max(0, 1 - contrast), 1 + contrast]:  x <- clamp(c x + (1 - c) mean(gray(x)))
        saturation factor s ~ U[max(0, 1 - saturation), 1 + saturation]:  x <- clamp(s x + (1 - s) gray(x))
        hue shift h ~ U[-hue, hue] (fraction of a turn): HSV hue <- (hue + h) mod 1
        ``jitter_order="random"`` draws the order of the four operations per image, as
        torchvision's ``ColorJitter`` does (and so the official MoCo/SimCLR/BYOL code);
        ``"fixed"`` applies brightness, contrast, saturation, hue in that order.
    Grayscale (p ``grayscale_p``): gray = 0.2989 R + 0.587 G + 0.114 B (ITU-R 601-2, as torchvision).
    Gaussian blur (p ``blur_p``): sigma ~ U[blur_sigma], separable kernel of ``blur_kernel_size``
        taps (None: about 10 % of ``size``), reflect padding.
    Solarize (p ``solarize_p``): x <- 1 - x where x >= ``solarize_threshold`` (128/255 as PIL).
    Flip (p ``flip_p``): horizontal.
    """

    size: int = 224
    crop: str = "random"
    scale: tuple[float, float] = (0.2, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    crop_pct: float = 1.0
    jitter_p: float = 0.0
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0
    jitter_order: str = "random"
    grayscale_p: float = 0.0
    grayscale_first: bool = False
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    blur_kernel_size: int | None = None
    solarize_p: float = 0.0
    solarize_threshold: float = 128.0 / 255.0
    flip_p: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size must be a positive int (pixels); got {self.size!r}")
        if self.crop not in ("random", "center"):
            raise ValueError(f"crop must be 'random' or 'center'; got {self.crop!r}")
        object.__setattr__(self, "scale", _check_range("scale", self.scale, 1e-6, 1.0))
        ratio = _check_range("ratio", self.ratio, 1e-6, math.inf)
        object.__setattr__(self, "ratio", ratio)
        if not 0.0 < self.crop_pct <= 1.0:
            raise ValueError(f"crop_pct must be in (0, 1]; got {self.crop_pct}")
        for name in ("jitter_p", "grayscale_p", "blur_p", "solarize_p", "flip_p"):
            object.__setattr__(self, name, _check_prob(name, getattr(self, name)))
        for name in ("brightness", "contrast", "saturation"):
            if float(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)}")
        if not 0.0 <= self.hue <= 0.5:
            raise ValueError(f"hue must be in [0, 0.5] (a fraction of a turn); got {self.hue}")
        if self.jitter_order not in JITTER_ORDERS:
            raise ValueError(f"jitter_order must be one of {JITTER_ORDERS}; got {self.jitter_order!r}")
        lo, hi = _check_range("blur_sigma", self.blur_sigma, 1e-6, math.inf)
        object.__setattr__(self, "blur_sigma", (lo, hi))
        k = self.blur_kernel_size
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0):
            raise ValueError(f"blur_kernel_size must be an odd positive int or None; got {k!r}")
        if not 0.0 <= self.solarize_threshold <= 1.0:
            raise ValueError(
                f"solarize_threshold is a fraction of the maximum value, in [0, 1]; got "
                f"{self.solarize_threshold} (use 128/255 for PIL's default)"
            )

    @property
    def kernel_size(self) -> int:
        """The blur kernel side actually used."""
        return self.blur_kernel_size or default_blur_kernel_size(self.size)

    @property
    def jitters(self) -> bool:
        return self.jitter_p > 0 and (
            self.brightness > 0 or self.contrast > 0 or self.saturation > 0 or self.hue > 0
        )

    def resize_size(self) -> int:
        """Shorter side before the centre crop (``crop="center"``): ``round(size / crop_pct)``."""
        return int(round(self.size / self.crop_pct))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
