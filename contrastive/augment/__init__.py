"""View pipelines for contrastive learning, per image or batched on the training device.

Quick use::

    from contrastive.augment import get_pipeline
    pipe = get_pipeline("mocov2", image_size=32)          # paper defaults, CIFAR size
    q, k = pipe(img)                                      # per-image path: 2 float CHW views
    worker_fn, device_fn = pipe.split()                   # batched path
    views = device_fn([v.to(dev) for v in uint8_views], generator=g)

Presets (``list_pipelines()``): mocov1, mocov2, simclr, byol, mocov3, multicrop, dino, eval.
Register your own with ``@register_pipeline("name")`` on a factory returning a :class:`Pipeline`.
"""

from contrastive.augment import presets as _presets  # noqa: F401  (registers the presets)
from contrastive.augment.batched import DeviceAugment, WorkerCrops
from contrastive.augment.config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ViewConfig,
    default_blur_kernel_size,
)
from contrastive.augment.device_decode import EncodedCrops
from contrastive.augment.pipeline import MultiView, Pipeline
from contrastive.augment.registry import (
    UnknownPipelineError,
    get_pipeline,
    list_pipelines,
    register_pipeline,
)

__all__ = [
    "DeviceAugment",
    "EncodedCrops",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MultiView",
    "Pipeline",
    "UnknownPipelineError",
    "ViewConfig",
    "WorkerCrops",
    "default_blur_kernel_size",
    "get_pipeline",
    "list_pipelines",
    "register_pipeline",
]
