"""Random resized crops of a batch of images that already sit on the training device.

The tensor-resident path (``--resident``, :mod:`contrastive.data.resident`) keeps a whole small
data set (CIFAR: 50,000 x 3 x 32 x 32 uint8 = 154 MB) on the device, so the loader hands only
indices and the geometric half of each view runs here, batched:

- :func:`random_resized_boxes` draws every sample's Inception crop box (torchvision's
  ``RandomResizedCrop.get_params`` rule: area fraction ~ U[scale], log aspect ratio ~ U[log
  ratio], the first of 10 tries that fits, else the whole image clamped to the ratio range,
  centred) from the step's host generator, all samples and all tries in one draw;
- :func:`resized_crops` crops and resizes every box with one ``torchvision.ops.roi_align``
  (aligned, adaptive sampling), exactly as ``--decode device`` does
  (:func:`contrastive.augment.device_decode.decode_and_crop`): bilinear with half-pixel centres
  where a box is enlarged (always, for 32 px crops of 32 px images), a box filter where it is
  shrunk (the workers use an antialiased triangle filter there), rounded to uint8.

:class:`ResidentViews` puts the two together for a pipeline's views; the colour half
(:class:`~contrastive.augment.batched.DeviceAugment`) follows with the same generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from contrastive.augment.config import ViewConfig
from contrastive.augment.per_image import centred_box
from contrastive.augment.share import WHOLE, Share, rand_rows

__all__ = ["random_resized_boxes", "resized_crops", "ResidentViews"]

#: tries per box before the centred fallback, as torchvision's RandomResizedCrop
TRIES = 10


def random_resized_boxes(n: int, height: int, width: int, scale: Sequence[float],
                         ratio: Sequence[float], generator: torch.Generator | None = None,
                         share: Share = WHOLE) -> Tensor:
    """(n, 4) int64 crop boxes ``(top, left, h, w)`` in an image of ``height x width``, drawn on
    the host from ``generator``: the rule of :func:`contrastive.augment.per_image.
    random_resized_crop_box` for every sample at once (its numbers drawn as one (n, 10, 4)
    uniform tensor, so the stream differs from the per-image draws, not the distribution), for
    process ``share``'s rows of the global micro-batch (:mod:`~contrastive.augment.share`)."""
    u = rand_rows(n, (TRIES, 4), generator, share, dtype=torch.float64,
                  device=torch.device("cpu"))  # (n, T, 4)
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    target = height * width * (scale[0] + (scale[1] - scale[0]) * u[..., 0])  # (n, T)
    aspect = torch.exp(lo + (hi - lo) * u[..., 1])  # (n, T)
    w = torch.sqrt(target * aspect).round().long()  # (n, T)
    h = torch.sqrt(target / aspect).round().long()  # (n, T)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)  # (n, T)
    first = fits.long().argmax(1, keepdim=True)  # (n, 1): first try that fits (0 if none)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]  # (n,)
    ut, ul = u[..., 2].gather(1, first)[:, 0], u[..., 3].gather(1, first)[:, 0]  # (n,)
    top = (ut * (height - h + 1)).floor().long().clamp_(max=height - h)  # randint(0, H - h + 1)
    left = (ul * (width - w + 1)).floor().long().clamp_(max=width - w)
    boxes = torch.stack([top, left, h, w], dim=1)  # (n, 4)
    missed = ~fits.any(1)  # (n,): no try fits, the centred fallback
    if bool(missed.any()):
        boxes[missed] = torch.tensor(centred_box(height, width, ratio))
    return boxes


def resized_crops(images: Tensor, boxes: Tensor, size: int) -> Tensor:
    """Crop box ``boxes[i]`` = (top, left, h, w) of ``images[i]`` and resize it to ``size``:
    uint8 (B, 3, H, W) on any device -> uint8 (B, 3, size, size) on that device."""
    b = images.shape[0]
    # last row and column repeated once: samples up to half a pixel past an edge read the edge
    padded = F.pad(images.float(), (0, 1, 0, 1), mode="replicate")  # (B, 3, H + 1, W + 1)
    top, left, h, w = boxes.to(images.device, torch.float32).unbind(1)  # (B,) each
    which = torch.arange(b, device=images.device, dtype=torch.float32)  # (B,)
    rois = torch.stack([which, left, top, left + w, top + h], dim=1)  # (B, 5): x1 y1 x2 y2
    from torchvision.ops import roi_align

    crops = roi_align(padded, rois, output_size=size, spatial_scale=1.0, sampling_ratio=-1,
                      aligned=True)  # (B, 3, size, size) float
    return crops.round_().clamp_(0, 255).to(torch.uint8)


class ResidentViews:
    """The geometric half of a pipeline's random views for images held on the device:
    ``views(indices, generator, share)`` -> one uint8 (B, 3, S_v, S_v) tensor per view
    (``indices``: process ``share``'s rows of the global micro-batch).

    Args:
        images: uint8 (N, 3, H, W), the whole data set, on the training device.
        views: the pipeline's views; each must be a random resized crop (``crop="random"``).
    """

    def __init__(self, images: Tensor, views: Sequence[ViewConfig]) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"resident images must be uint8 (N, 3, H, W); got {images.dtype} "
                             f"{tuple(images.shape)}")
        for v in views:
            if v.crop != "random":
                raise ValueError(f"--resident crops on the device only random resized crops; "
                                 f"this pipeline has a {v.crop!r} view: drop --resident")
        self.images, self.views = images, tuple(views)

    def __call__(self, indices: Tensor, generator: torch.Generator | None = None,
                 share: Share = WHOLE) -> list[Tensor]:
        batch = self.images.index_select(0, indices.to(self.images.device))  # (B, 3, H, W)
        n, _, height, width = batch.shape
        return [resized_crops(batch, random_resized_boxes(n, height, width, v.scale, v.ratio,
                                                          generator, share), v.size)
                for v in self.views]
