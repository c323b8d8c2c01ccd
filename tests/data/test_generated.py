"""The generated ``shapes`` and ``synthetic`` data sets."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from contrastive.data import (
    MASK_BACKGROUND,
    SHAPE_CLASSES,
    ShapesDataset,
    SyntheticDataset,
    generate_shape_masks,
    generate_shapes,
)
from contrastive.data.generated import render_shapes


def test_ten_balanced_classes():
    assert len(SHAPE_CLASSES) == 10 and len(set(SHAPE_CLASSES)) == 10
    images, labels = generate_shapes(50, 32, seed=0)
    assert images.shape == (50, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.tolist() == [i % 10 for i in range(50)]


def test_deterministic_from_the_seed_and_a_prefix_of_larger_sets():
    a, _ = generate_shapes(40, 24, seed=3)
    b, _ = generate_shapes(40, 24, seed=3)
    assert torch.equal(a, b)
    big, _ = generate_shapes(200, 24, seed=3)
    assert torch.equal(big[:40], a)  # n only says how many
    tail, _ = generate_shapes(10, 24, seed=3, start=30)
    assert torch.equal(tail, a[30:])
    assert not torch.equal(generate_shapes(40, 24, seed=4)[0], a)
    test, _ = generate_shapes(40, 24, seed=3, split="test")
    assert not any(torch.equal(test[i], a[j]) for i in range(40) for j in range(40))


def test_any_size_and_the_dataset_surface():
    for size in (8, 17, 96):
        ds = ShapesDataset(n=12, size=size, seed=0)
        img, label = ds[11]
        assert img.shape == (3, size, size) and label == 1
    ds = ShapesDataset(n=5, transform=lambda x: x.sum())
    assert ds[0][0] == ds.images[0].sum()
    assert ds.classes == list(SHAPE_CLASSES) and ds.num_classes == 10
    with pytest.raises(ValueError, match="split"):
        ShapesDataset(n=5, split="val")
    with pytest.raises(ValueError, match="clutter"):
        ShapesDataset(n=5, clutter=20)


def test_each_image_is_a_two_colour_shape_inside_the_frame():
    """Without clutter an image holds its background colour plus the shape colour (and the
    anti-aliased blend between them); the shape covers a reasonable part of the image."""
    images, labels = generate_shapes(100, 48, seed=0)
    for img in images:
        px = img.flatten(1).T.float()
        bg = img[:, 0, 0].float()  # corners are background (the shape stays inside the frame)
        far = (px - bg).norm(dim=1) > 40
        cover = far.float().mean()
        assert 0.03 < cover < 0.7
        border = torch.cat([img[:, 0], img[:, -1], img[:, :, 0], img[:, :, -1]], dim=1).float()
        assert (border - bg[:, None]).norm(dim=0).max() < 40


def test_classes_differ_in_shape_not_only_colour():
    """Same parameters, different class: the masks differ (the class is in the shape)."""
    params = np.random.default_rng(0).random((1, 80))
    masks = []
    for c in range(10):
        img = render_shapes(params, np.array([c]), 40)[0].float()
        masks.append(((img - img[:, :1, :1]).norm(dim=0) > 40).flatten().float())
    masks = torch.stack(masks)
    overlap = masks @ masks.T
    union = masks.sum(1, keepdim=True) + masks.sum(1) - overlap
    iou = overlap / union
    assert (iou - torch.eye(10)).max() < 0.9


def test_clutter_adds_lines():
    clean, _ = generate_shapes(20, 32, seed=0)
    busy, _ = generate_shapes(20, 32, seed=0, clutter=5)
    colours = lambda x: len(torch.unique(x.flatten(1).T, dim=0))  # noqa: E731
    assert sum(colours(b) for b in busy) > sum(colours(c) for c in clean)


def test_generation_is_fast():
    t0 = time.perf_counter()
    generate_shapes(3000, 32, seed=7)
    assert time.perf_counter() - t0 < 5.0  # about 0.1 s on one core; generous for a busy machine


def test_synthetic_noise():
    ds = SyntheticDataset(n=7, size=5, seed=1, num_classes=3)
    assert [ds[i][1] for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert torch.equal(ds[4][0], SyntheticDataset(n=100, size=5, seed=1, num_classes=3)[4][0])
    assert not torch.equal(ds[4][0], SyntheticDataset(n=7, size=5, seed=1, split="test")[4][0])
    assert ds[2][0].dtype == torch.uint8


def _colour_counts(img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    colours, counts = torch.unique(img.flatten(1).T, dim=0, return_counts=True)
    return colours, counts


def test_the_mask_is_the_drawn_shape():
    """Seeded, every class drawn twice: the mask is label + 1 where the image shows the shape and
    0 elsewhere. Pixels of the pure foreground colour are all in the mask, pixels of the pure
    background colour all outside, and each anti-aliased edge pixel is on the side of the colour
    it is nearer to (the mask takes pixel centres inside the outline: cover >= 1/2)."""
    images, labels = generate_shapes(20, 32, seed=5)
    masks = generate_shape_masks(20, 32, seed=5)
    assert masks.shape == (20, 32, 32) and masks.dtype == torch.uint8
    assert sorted(set(labels.tolist())) == list(range(10))
    for img, label, mask in zip(images, labels, masks):
        assert set(mask.unique().tolist()) == {MASK_BACKGROUND, int(label) + 1}
        inside = mask == int(label) + 1
        bg = img[:, 0, 0]  # a corner: the shape stays inside the frame
        colours, counts = _colour_counts(img[:, inside])
        fg = colours[counts.argmax()]  # the shape's interior, most of the mask
        is_fg = (img == fg.view(3, 1, 1)).all(0)
        is_bg = (img == bg.view(3, 1, 1)).all(0)
        assert is_fg.sum() > 0.25 * inside.sum() and is_bg.sum() > 0.3 * (~inside).sum()
        assert (is_fg <= inside).all() and (is_bg <= ~inside).all()
        x = img.float()
        nearer_fg = (x - fg.float().view(3, 1, 1)).norm(dim=0) <= (x - bg.float().view(3, 1, 1)).norm(dim=0) + 2
        nearer_bg = (x - bg.float().view(3, 1, 1)).norm(dim=0) <= (x - fg.float().view(3, 1, 1)).norm(dim=0) + 2
        assert (nearer_fg[inside]).all() and (nearer_bg[~inside]).all()


def test_masks_match_the_dataset_and_clutter_lies_behind_them():
    """The dataset's masks are the generator's; with clutter the images change only outside the
    mask's pure-shape pixels (the lines are drawn behind the shape and labelled background)."""
    ds = ShapesDataset(n=30, size=24, seed=2, split="test", clutter=4)
    masks = ds.masks()
    assert torch.equal(masks, generate_shape_masks(30, 24, seed=2, split="test"))
    assert torch.equal(generate_shape_masks(10, 24, seed=2, split="test", start=20), masks[20:])
    clean, _ = generate_shapes(30, 24, seed=2, split="test")
    for c, busy, mask in zip(clean, ds.images, masks):
        colours, counts = _colour_counts(c[:, mask > 0])
        shape_px = (c == colours[counts.argmax()].view(3, 1, 1)).all(0)
        assert torch.equal(busy[:, shape_px], c[:, shape_px])
    assert not torch.equal(clean, ds.images)
    with pytest.raises(ValueError, match="size"):
        generate_shape_masks(3, 4)
