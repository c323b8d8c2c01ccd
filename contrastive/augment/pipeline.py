"""A view pipeline: a list of view configs + normalisation, runnable per image or batched."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from contrastive.augment.batched import DeviceAugment, WorkerCrops, WorkerCropsWithBoxes
from contrastive.augment.config import IMAGENET_MEAN, IMAGENET_STD, ViewConfig
from contrastive.augment.device_decode import EncodedCrops
from contrastive.augment.per_image import ImageLike, PerImageView, prepare


class Pipeline:
    """The views of one image, each drawn with independent random parameters.

    ``pipeline(img)`` (PIL image or uint8 (3, H, W) tensor) -> list of ``num_views`` float32
    normalised (3, S_v, S_v) tensors: the per-image path, for loader workers.

    ``worker_fn, device_fn = pipeline.split()``: the batched path. ``worker_fn(img)`` -> list of
    uint8 (3, S_v, S_v) tensors (decoded, random-resized-cropped, resized); after collation each
    view is a uint8 batch (B, 3, S_v, S_v); ``device_fn(views, generator=None)`` -> list of float32
    normalised batches, every sample with its own colour/blur/solarize/flip parameters. Both paths
    draw from the same distribution (tests/augment check per-operation statistics).

    Args:
        views: one :class:`ViewConfig` per output view (asymmetric pipelines give different ones).
        mean, std: per-channel normalisation (ImageNet statistics by default).
        name: preset name, for ``repr`` and logs.

    :meth:`with_crop_boxes` gives a pipeline whose worker half also returns each view's crop box
    (:class:`~contrastive.augment.batched.WorkerCropsWithBoxes`; VICRegL's location matching);
    its per-image path and ``decode="device"`` refuse.
    """

    accepts_encoded = True  # takes contrastive.data.decode.EncodedImage (decoded for its crops)

    def __init__(
        self,
        views: Sequence[ViewConfig],
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        name: str | None = None,
    ) -> None:
        views = tuple(views)
        if not views or not all(isinstance(v, ViewConfig) for v in views):
            raise ValueError(f"views must be a non-empty sequence of ViewConfig; got {views!r}")
        if len(mean) != 3 or len(std) != 3 or any(float(s) <= 0 for s in std):
            raise ValueError(f"mean and std must have 3 entries with std > 0; got mean={mean}, std={std}")
        self.views = views
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.name = name
        self.crop_boxes = False  # with_crop_boxes(): the worker half returns them
        self._views_per_image: list[PerImageView] | None = None

    @property
    def _per_image(self) -> list[PerImageView]:
        """The per-image path's views, built on first use (a run on the batched path then never
        imports torchvision: see :mod:`contrastive.augment.per_image`)."""
        if self._views_per_image is None:
            self._views_per_image = [PerImageView(v, self.mean, self.std) for v in self.views]
        return self._views_per_image

    @property
    def num_views(self) -> int:
        return len(self.views)

    @property
    def view_sizes(self) -> list[int]:
        return [v.size for v in self.views]

    def with_normalisation(self, mean: Sequence[float], std: Sequence[float]) -> Pipeline:
        """The same views normalised with ``mean`` / ``std`` (the statistics pretrained weights
        were trained with: ``--init``)."""
        out = Pipeline(self.views, mean, std, name=self.name)
        out.crop_boxes = self.crop_boxes
        return out

    def with_crop_boxes(self) -> Pipeline:
        """The same views, the batched path returning each view's crop box beside it."""
        out = Pipeline(self.views, self.mean, self.std, name=self.name)
        out.crop_boxes = True
        return out

    def __call__(self, img: ImageLike) -> list[Tensor]:
        if self.crop_boxes:
            raise ValueError("this pipeline returns crop boxes, which only its batched path "
                             "does: use --batched-augment on (or auto)")
        t = prepare(img)  # one conversion (or one encoded image) for all views
        return [view(t) for view in self._per_image]

    def split(self, decode: str = "worker") -> tuple[WorkerCrops | EncodedCrops, DeviceAugment]:
        """(worker_fn, device_fn) of the batched path; both picklable.

        ``decode="device"``: the worker half only reads the JPEG header and draws the crop boxes
        (:class:`~contrastive.augment.device_decode.EncodedCrops`); the training process decodes
        and crops with :func:`~contrastive.augment.device_decode.decode_and_crop` before
        ``device_fn``. Needs random-resized-crop views (``ValueError`` otherwise).
        """
        if decode not in ("worker", "device"):
            raise ValueError(f"decode must be 'worker' or 'device'; got {decode!r}")
        if decode == "device" and self.crop_boxes:
            raise ValueError("--decode device does not return crop boxes (VICRegL needs them): "
                             "use --decode worker")
        worker = (EncodedCrops(self.views) if decode == "device"
                  else WorkerCropsWithBoxes(self.views) if self.crop_boxes
                  else WorkerCrops(self.views))
        return worker, DeviceAugment(self.views, self.mean, self.std)

    def __repr__(self) -> str:
        views = ",\n  ".join(repr(v) for v in self.views)
        return f"Pipeline(name={self.name!r}, mean={self.mean}, std={self.std}, views=[\n  {views}])"


class MultiView:
    """Apply ``transform`` ``num_views`` times to one image (independent random draws each).

    Works with any callable, e.g. a torchvision transform: ``MultiView(t, 2)(img) == [t(img), t(img)]``.
    A :class:`Pipeline` is returned as the concatenation of its views, so
    ``MultiView(get_pipeline("eval"), 3)`` gives three tensors.
    """

    def __init__(self, transform: Callable[[Any], Any], num_views: int = 2) -> None:
        if isinstance(num_views, bool) or not isinstance(num_views, int) or num_views < 1:
            raise ValueError(f"num_views must be a positive int; got {num_views!r}")
        self.transform = transform
        self.num_views = num_views

    def __call__(self, img: Any) -> list[Any]:
        out: list[Any] = []
        for _ in range(self.num_views):
            view = self.transform(img)
            if isinstance(self.transform, Pipeline):
                out.extend(view)
            else:
                out.append(view)
        return out

    def __repr__(self) -> str:
        return f"MultiView({self.transform!r}, num_views={self.num_views})"
