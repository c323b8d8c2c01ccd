"""Crop boxes beside the views (VICRegL's location matching): the batched path's worker half
returns each view's box in the original image with the same draws and pixels as without; the
per-image path and the device decoder refuse."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from contrastive.augment import get_pipeline
from contrastive.augment.per_image import resized_crop_uint8


def test_worker_half_returns_the_boxes_of_its_crops():
    img = torch.randint(0, 256, (3, 40, 30), generator=torch.Generator().manual_seed(0),
                        dtype=torch.uint8)
    plain, _ = get_pipeline("byol", image_size=16).split()
    boxed, _ = get_pipeline("byol", image_size=16).with_crop_boxes().split()
    torch.manual_seed(1)
    views = plain(img)
    torch.manual_seed(1)
    out = boxed(img)
    assert out["crop_boxes"].shape == (2, 4) and out["crop_boxes"].dtype == torch.float32
    for v, w, box in zip(views, out["views"], out["crop_boxes"].long().tolist()):
        assert torch.equal(v, w)  # the same draws: boxes change no view
        assert torch.equal(w, resized_crop_uint8(img, *box, 16))  # the box is that crop's
        top, left, h, w_ = box
        assert 0 <= top and top + h <= 40 and 0 <= left and left + w_ <= 30
    batch = default_collate([boxed(img), boxed(img)])
    assert batch["crop_boxes"].shape == (2, 2, 4) and batch["views"][0].shape == (2, 3, 16, 16)


def test_paths_without_boxes_refuse():
    pipeline = get_pipeline("byol", image_size=16).with_crop_boxes()
    assert pipeline.with_normalisation((0.5,) * 3, (0.5,) * 3).crop_boxes
    with pytest.raises(ValueError, match="batched-augment"):
        pipeline(torch.zeros(3, 20, 20, dtype=torch.uint8))
    with pytest.raises(ValueError, match="--decode worker"):
        pipeline.split(decode="device")
    with pytest.raises(ValueError, match="random-resized-crop"):
        get_pipeline("eval", image_size=16).with_crop_boxes().split()
