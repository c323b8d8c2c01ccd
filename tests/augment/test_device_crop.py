"""Crops cut on the device from a resident data set (``--resident``,
:mod:`contrastive.augment.device_crop`): the boxes follow torchvision's RandomResizedCrop rule
for the numbers drawn, the crops are the workers' pixels where the box is enlarged."""

from __future__ import annotations

import math

import pytest
import torch

from contrastive.augment.config import ViewConfig
from contrastive.augment.device_crop import (
    TRIES,
    ResidentViews,
    random_resized_boxes,
    resized_crops,
)
from contrastive.augment.per_image import random_resized_crop_box, resized_crop_uint8


def _reference_box(u: torch.Tensor, height: int, width: int, scale, ratio) -> tuple[int, ...]:
    """torchvision's ``RandomResizedCrop.get_params``, written as a loop over the tries, fed
    the numbers ``u`` (TRIES, 4) instead of drawing them."""
    area = height * width
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(TRIES):
        target = area * (scale[0] + (scale[1] - scale[0]) * float(u[t, 0]))
        aspect = math.exp(lo + (hi - lo) * float(u[t, 1]))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return (int(float(u[t, 2]) * (height - h + 1)), int(float(u[t, 3]) * (width - w + 1)),
                    h, w)
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@pytest.mark.parametrize("size,scale,ratio", [
    ((32, 32), (0.08, 1.0), (3 / 4, 4 / 3)),  # MoCo's CIFAR views
    ((24, 40), (0.2, 1.0), (3 / 4, 4 / 3)),
    ((32, 32), (0.9, 1.0), (0.2, 5.0)),  # many tries miss: later tries and the fallback
    ((20, 50), (1.5, 2.0), (3 / 4, 4 / 3)),  # no try fits: the centred fallback, ratio-clamped
])
def test_boxes_follow_the_rule_for_the_numbers_drawn(size, scale, ratio) -> None:
    height, width = size
    boxes = random_resized_boxes(300, height, width, scale, ratio, torch.Generator().manual_seed(3))
    u = torch.rand((300, TRIES, 4), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = [_reference_box(u[i], height, width, scale, ratio) for i in range(300)]
    assert boxes.dtype == torch.int64 and boxes.shape == (300, 4)
    assert [tuple(b) for b in boxes.tolist()] == expected
    top, left, h, w = boxes.unbind(1)
    assert bool(((top >= 0) & (left >= 0) & (top + h <= height) & (left + w <= width)).all())


def test_box_areas_have_the_per_image_draws_distribution() -> None:
    n = 8000
    boxes = random_resized_boxes(n, 32, 32, (0.08, 1.0), (3 / 4, 4 / 3),
                                 torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    per_image = torch.tensor([random_resized_crop_box(32, 32, (0.08, 1.0), (3 / 4, 4 / 3))
                              for _ in range(n)])
    ours, theirs = [(b[:, 2] * b[:, 3]).double() / 1024 for b in (boxes, per_image)]
    # two samples of one distribution (mean ~0.49: large boxes of extreme aspect are refused):
    # the standard error of a mean of 8,000 is ~0.003, of a decile's about the same
    q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    assert abs(ours.mean().item() - theirs.mean().item()) < 0.01
    assert (ours.quantile(q) - theirs.quantile(q)).abs().max().item() < 0.02
    aspect = [(b[:, 3] / b[:, 2]).log().mean().item() for b in (boxes, per_image)]
    assert abs(aspect[0] - aspect[1]) < 0.01


def _bilinear_reference(image: torch.Tensor, box: list[int], size: int) -> torch.Tensor:
    """Output pixel (i, j) of the box (top, left, h, w) enlarged to ``size``: the bilinear value
    of the WHOLE image at y = top + (i + 0.5) h / size - 0.5 (x alike), edges clamped; as
    ``--decode device``'s roi_align, samples near the box's edge read the pixels beyond it."""
    top, left, h, w = box
    _, height, width = image.shape
    y = top + (torch.arange(size, dtype=torch.float64) + 0.5) * h / size - 0.5
    x = left + (torch.arange(size, dtype=torch.float64) + 0.5) * w / size - 0.5
    gy = (y + 0.5) / height * 2 - 1  # grid_sample's coordinates, align_corners=False
    gx = (x + 0.5) / width * 2 - 1
    grid = torch.stack(torch.meshgrid(gx, gy, indexing="xy"), dim=-1)[None]  # (1, S, S, 2)
    out = torch.nn.functional.grid_sample(image[None].double(), grid, mode="bilinear",
                                          padding_mode="border", align_corners=False)
    return out[0].round().clamp(0, 255).to(torch.uint8)


def test_crops_are_bilinear_enlargements_and_exact_when_whole() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=g)
    whole = torch.tensor([[0, 0, 32, 32]] * 40)
    assert torch.equal(resized_crops(images, whole, 32), images)
    boxes = random_resized_boxes(40, 32, 32, (0.08, 1.0), (3 / 4, 4 / 3), g)
    ours = resized_crops(images, boxes, 32)
    reference = torch.stack([_bilinear_reference(images[i], boxes[i].tolist(), 32)
                             for i in range(40)])
    # float32 against float64 arithmetic: a value within rounding of .5 may round either way
    assert (ours.int() - reference.int()).abs().max().item() <= 1
    assert (ours != reference).float().mean().item() < 0.01
    # the workers' crop (resize of the cut-out box) agrees away from the box's edges
    inner = slice(4, 28)
    workers = torch.stack([resized_crop_uint8(images[i], *boxes[i].tolist(), 32)
                           for i in range(40)])
    near = (ours.int() - workers.int()).abs()[..., inner, inner]
    assert (near <= 1).float().mean().item() > 0.9


def test_resident_views_draw_from_the_generator_and_refuse_centre_crops() -> None:
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    views = [ViewConfig(size=32, scale=(0.08, 1.0)), ViewConfig(size=16, scale=(0.2, 1.0))]
    fn = ResidentViews(images, views)
    idx = torch.tensor([3, 3, 7])
    a = fn(idx, torch.Generator().manual_seed(1))
    b = fn(idx, torch.Generator().manual_seed(1))
    assert [v.shape for v in a] == [(3, 3, 32, 32), (3, 3, 16, 16)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0][0], a[0][1])  # the same image, two draws
    with pytest.raises(ValueError, match="drop --resident"):
        ResidentViews(images, [ViewConfig(size=32, crop="center")])
    with pytest.raises(ValueError, match="uint8"):
        ResidentViews(images.float(), views)
