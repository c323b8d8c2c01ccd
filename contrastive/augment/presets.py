"""The papers' augmentation pipelines, with their parameters as typed keyword arguments.

Image size conventions: 224 for ImageNet, 96 for STL-10, 32 for CIFAR. "Small" images
(``image_size <= 64``) get no Gaussian blur by default (the MoCo CIFAR demo, the SimCLR CIFAR
setup) and, where the CIFAR reference says so, a different crop scale or colour strength; each
default that depends on the size is ``None`` in the signature and resolved as documented.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from contrastive.augment.config import IMAGENET_MEAN, IMAGENET_STD, ViewConfig
from contrastive.augment.pipeline import Pipeline
from contrastive.augment.registry import register_pipeline

Pair = tuple[float, float]


def _small(image_size: int) -> bool:
    return image_size <= 64


def _check_size(image_size: int) -> int:
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
        raise ValueError(f"image_size must be an int >= 8 (pixels); got {image_size!r}")
    return image_size


def _num_views(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_views must be a positive int; got {n!r}")
    return n


@register_pipeline("mocov1", "moco_v1")
def mocov1(
    image_size: int = 224,
    *,
    num_views: int = 2,
    scale: Pair = (0.2, 1.0),
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.4,
    hue: float = 0.4,
    jitter_p: float = 1.0,
    grayscale_p: float = 0.2,
    flip_p: float = 0.5,
    jitter_order: str = "random",
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """MoCo v1 (He et al. 2020; the InstDisc augmentation): RandomResizedCrop (0.2-1), grayscale
    p 0.2 applied *before* an always-on ColorJitter(0.4, 0.4, 0.4, 0.4), horizontal flip."""
    view = ViewConfig(
        size=_check_size(image_size), scale=scale, brightness=brightness, contrast=contrast,
        saturation=saturation, hue=hue, jitter_p=jitter_p, jitter_order=jitter_order,
        grayscale_p=grayscale_p, grayscale_first=True, flip_p=flip_p,
    )
    return Pipeline([view] * _num_views(num_views), mean, std)


@register_pipeline("mocov2", "moco_v2")
def mocov2(
    image_size: int = 224,
    *,
    num_views: int = 2,
    scale: Pair | None = None,
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.4,
    hue: float = 0.1,
    jitter_p: float = 0.8,
    grayscale_p: float = 0.2,
    blur_p: float | None = None,
    blur_sigma: Pair = (0.1, 2.0),
    blur_kernel_size: int | None = None,
    flip_p: float = 0.5,
    jitter_order: str = "random",
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """MoCo v2 (Chen et al. 2020, "aug+"): RandomResizedCrop, ColorJitter(0.4, 0.4, 0.4, 0.1)
    p 0.8, grayscale p 0.2, Gaussian blur sigma 0.1-2 p 0.5, horizontal flip.

    ``scale`` None: (0.2, 1) (ImageNet), (0.08, 1) for small images (the MoCo CIFAR-10 demo).
    ``blur_p`` None: 0.5, or 0 for small images (the CIFAR demo has no blur).
    """
    small = _small(_check_size(image_size))
    view = ViewConfig(
        size=image_size, scale=scale or ((0.08, 1.0) if small else (0.2, 1.0)),
        brightness=brightness, contrast=contrast, saturation=saturation, hue=hue,
        jitter_p=jitter_p, jitter_order=jitter_order, grayscale_p=grayscale_p,
        blur_p=(0.0 if small else 0.5) if blur_p is None else blur_p, blur_sigma=blur_sigma,
        blur_kernel_size=blur_kernel_size, flip_p=flip_p,
    )
    return Pipeline([view] * _num_views(num_views), mean, std)


@register_pipeline("simclr")
def simclr(
    image_size: int = 224,
    *,
    num_views: int = 2,
    s: float | None = None,
    scale: Pair = (0.08, 1.0),
    jitter_p: float = 0.8,
    grayscale_p: float = 0.2,
    blur_p: float | None = None,
    blur_sigma: Pair = (0.1, 2.0),
    blur_kernel_size: int | None = None,
    flip_p: float = 0.5,
    jitter_order: str = "random",
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """SimCLR (Chen et al. 2020, appendix A): RandomResizedCrop (0.08-1), flip, colour distortion
    of strength ``s``: ColorJitter(0.8 s, 0.8 s, 0.8 s, 0.2 s) p 0.8 + grayscale p 0.2, Gaussian
    blur (kernel 10 % of the side, sigma 0.1-2) p 0.5.

    ``s`` None: 1.0, or 0.5 for small images (the paper's CIFAR-10 setting, which also drops
    the blur: ``blur_p`` None -> 0 for small images, 0.5 otherwise).
    """
    small = _small(_check_size(image_size))
    s = (0.5 if small else 1.0) if s is None else float(s)
    if s < 0:
        raise ValueError(f"s (colour distortion strength) must be >= 0; got {s}")
    view = ViewConfig(
        size=image_size, scale=scale, brightness=0.8 * s, contrast=0.8 * s, saturation=0.8 * s,
        hue=min(0.5, 0.2 * s), jitter_p=jitter_p, jitter_order=jitter_order, grayscale_p=grayscale_p,
        blur_p=(0.0 if small else 0.5) if blur_p is None else blur_p, blur_sigma=blur_sigma,
        blur_kernel_size=blur_kernel_size, flip_p=flip_p,
    )
    return Pipeline([view] * _num_views(num_views), mean, std)


def _asymmetric(
    image_size: int, scale: Pair, brightness: float, contrast: float, saturation: float,
    hue: float, jitter_p: float, grayscale_p: float, blur_p: Sequence[float] | None,
    solarize_p: Sequence[float], blur_sigma: Pair, blur_kernel_size: int | None, flip_p: float,
    jitter_order: str,
) -> list[ViewConfig]:
    small = _small(_check_size(image_size))
    blur = ((0.0, 0.0) if small else (1.0, 0.1)) if blur_p is None else tuple(blur_p)
    solar = tuple(solarize_p)
    if len(blur) != 2 or len(solar) != 2:
        raise ValueError(
            f"blur_p and solarize_p take one probability per view (2 views); got {blur}, {solar}"
        )
    return [
        ViewConfig(
            size=image_size, scale=scale, brightness=brightness, contrast=contrast,
            saturation=saturation, hue=hue, jitter_p=jitter_p, jitter_order=jitter_order,
            grayscale_p=grayscale_p, blur_p=blur[i], blur_sigma=blur_sigma,
            blur_kernel_size=blur_kernel_size, solarize_p=solar[i], flip_p=flip_p,
        )
        for i in range(2)
    ]


@register_pipeline("mocov3", "moco_v3")  # the same views
@register_pipeline("byol")
def byol(
    image_size: int = 224,
    *,
    scale: Pair = (0.08, 1.0),
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.2,
    hue: float = 0.1,
    jitter_p: float = 0.8,
    grayscale_p: float = 0.2,
    blur_p: tuple[float, float] | None = None,
    solarize_p: tuple[float, float] = (0.0, 0.2),
    blur_sigma: Pair = (0.1, 2.0),
    blur_kernel_size: int | None = None,
    flip_p: float = 0.5,
    jitter_order: str = "random",
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """BYOL (Grill et al. 2020, table 6): two asymmetric views. Both: RandomResizedCrop
    (0.08-1), flip, ColorJitter(0.4, 0.4, 0.2, 0.1) p 0.8, grayscale p 0.2; blur p 1.0 / 0.1,
    solarize p 0.0 / 0.2 for view 1 / view 2. ``blur_p`` None: (1.0, 0.1), or (0, 0) for small
    images. Registered as ``mocov3`` too: MoCo v3 (Chen, Xie, He 2021) takes BYOL's views, with
    the crop minimum scale 0.08 (its recipes' ``--crop-min``)."""
    views = _asymmetric(image_size, scale, brightness, contrast, saturation, hue, jitter_p,
                        grayscale_p, blur_p, solarize_p, blur_sigma, blur_kernel_size, flip_p,
                        jitter_order)
    return Pipeline(views, mean, std)


@register_pipeline("multicrop", "swav")
def multicrop(
    image_size: int = 224,
    *,
    num_global: int = 2,
    num_local: int = 6,
    local_size: int | None = None,
    global_scale: Pair = (0.14, 1.0),
    local_scale: Pair = (0.05, 0.14),
    s: float = 1.0,
    jitter_p: float = 0.8,
    grayscale_p: float = 0.2,
    blur_p: float | None = None,
    blur_sigma: Pair = (0.1, 2.0),
    flip_p: float = 0.5,
    jitter_order: str = "random",
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """Multi-crop (SwAV, Caron et al. 2020): ``num_global`` crops of ``image_size`` (scale
    0.14-1) then ``num_local`` crops of ``local_size`` (scale 0.05-0.14), all with the SimCLR
    colour distortion of strength ``s`` and blur p 0.5 (None: 0 for small images).
    ``local_size`` None: ``round(image_size * 96 / 224)`` (96 at 224)."""
    small = _small(_check_size(image_size))
    if local_size is None:
        local_size = max(8, round(image_size * 96 / 224))
    if isinstance(num_local, bool) or not isinstance(num_local, int) or num_local < 0:
        raise ValueError(f"num_local must be an int >= 0; got {num_local!r}")
    blur = (0.0 if small else 0.5) if blur_p is None else blur_p
    common = ViewConfig(  # what every crop shares; size and scale set below
        brightness=0.8 * s, contrast=0.8 * s, saturation=0.8 * s, hue=min(0.5, 0.2 * s),
        jitter_p=jitter_p, jitter_order=jitter_order, grayscale_p=grayscale_p, blur_p=blur,
        blur_sigma=blur_sigma, flip_p=flip_p,
    )
    glob = replace(common, size=image_size, scale=global_scale)
    loc = replace(common, size=int(local_size), scale=local_scale)
    return Pipeline([glob] * _num_views(num_global) + [loc] * num_local, mean, std)


@register_pipeline("dino")
def dino(
    image_size: int = 224,
    *,
    num_local: int = 8,
    local_size: int | None = None,
    global_scale: Pair = (0.4, 1.0),
    local_scale: Pair = (0.05, 0.4),
    blur_sigma: Pair = (0.1, 2.0),
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """DINO's multi-crop (Caron et al. 2021; official ``main_dino.py``,
    ``DataAugmentationDINO``): every crop flips (p 0.5), jitters colour (0.4, 0.4, 0.2, 0.1;
    p 0.8) and turns grey (p 0.2); global view 1 (``image_size``, scale 0.4-1) is always blurred;
    global view 2 is blurred with p 0.1 and solarised with p 0.2; the ``num_local`` local views
    (``local_size``, 96 at 224, scale 0.05-0.4) are blurred with p 0.5. Blur sigma 0.1-2 (the
    code's radius). Small images (<= 64 px) get no blur, as the other presets."""
    small = _small(_check_size(image_size))
    if local_size is None:
        local_size = max(8, round(image_size * 96 / 224))
    if isinstance(num_local, bool) or not isinstance(num_local, int) or num_local < 0:
        raise ValueError(f"num_local must be an int >= 0; got {num_local!r}")
    common = ViewConfig(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, jitter_p=0.8,
                        grayscale_p=0.2, blur_sigma=blur_sigma, flip_p=0.5)  # + size, scale, blur
    blur = (lambda p: 0.0) if small else (lambda p: p)  # noqa: E731
    g1 = replace(common, size=image_size, scale=global_scale, blur_p=blur(1.0))
    g2 = replace(common, size=image_size, scale=global_scale, blur_p=blur(0.1), solarize_p=0.2)
    loc = replace(common, size=int(local_size), scale=local_scale, blur_p=blur(0.5))
    return Pipeline([g1, g2] + [loc] * num_local, mean, std)


@register_pipeline("mae")
def mae(
    image_size: int = 224,
    *,
    scale: Pair = (0.2, 1.0),
    flip_p: float = 0.5,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """MAE (He et al. 2022; facebookresearch/mae ``main_pretrain.py``): one view,
    RandomResizedCrop (0.2-1) and a horizontal flip, no colour augmentation. The code resizes
    the crop bicubically; ours resizes as every other pipeline here does."""
    return Pipeline([ViewConfig(size=_check_size(image_size), scale=scale, flip_p=flip_p)],
                    mean, std)


@register_pipeline("eval", "val", "test")
def eval_(
    image_size: int = 224,
    *,
    crop_pct: float | None = None,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Pipeline:
    """Evaluation transform: resize the shorter side to ``round(image_size / crop_pct)``, centre
    crop ``image_size``, normalise; one view. ``crop_pct`` None: 0.875 (256 -> 224, the linear
    probe protocol) for image_size >= 128, else 1.0 (CIFAR / STL-10 images are used whole)."""
    size = _check_size(image_size)
    pct = (0.875 if size >= 128 else 1.0) if crop_pct is None else crop_pct
    return Pipeline([ViewConfig(size=size, crop="center", crop_pct=pct)], mean, std)
