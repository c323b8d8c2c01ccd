"""Per-pixel linear segmentation (contrastive.eval.segmentation) on planted encoders whose answer
is known: one whose map encodes the mask exactly, one whose map is constant."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.data import generate_shape_masks
from contrastive.eval.segmentation import linear_segmentation, segmentation_scores

K = 11  # background + the ten shapes


class MaskInChannelZero(nn.Module):
    """Reads the class id planted in channel 0 and returns its one-hot map: a perfect encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(()))  # a module with a parameter, as encoders

    def forward_stages(self, x: Tensor) -> list[Tensor]:
        return [F.one_hot(x[:, 0].round().long(), K).permute(0, 3, 1, 2).float() + self.anchor]


class Constant(nn.Module):
    """A 2 x 2 map of ones whatever the image: nothing to segment with."""

    def forward_stages(self, x: Tensor) -> list[Tensor]:
        return [torch.ones(x.shape[0], 8, 2, 2)]


def planted(split: str, n: int) -> tuple[Tensor, Tensor]:
    masks = generate_shape_masks(n, 16, seed=0, split=split)
    images = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(n))
    images[:, 0] = masks.float()
    return images, masks


def test_scores_on_a_hand_computed_case():
    target = torch.tensor([[[0, 0, 1], [1, 2, 2]]])
    pred = torch.tensor([[[0, 1, 1], [1, 2, 0]]])
    s = segmentation_scores(pred, target, num_classes=4)
    # IoU: class 0 1/3 (hit (0,0); union adds (0,1) and (1,2)), class 1 2/3, class 2 1/2, 3 absent
    assert s["iou"][:3] == pytest.approx([100 / 3, 200 / 3, 50]) and s["iou"][3] is None
    assert s["miou"] == pytest.approx((100 / 3 + 200 / 3 + 50) / 3)
    assert s["pixel_accuracy"] == pytest.approx(400 / 6)


def test_an_encoder_that_encodes_the_mask_reaches_miou_100():
    (xtr, ytr), (xte, yte) = planted("train", 40), planted("test", 20)
    s = linear_segmentation(MaskInChannelZero(), xtr, ytr, xte, yte, K, epochs=30, lr=0.1)
    assert s["miou"] == 100 and s["pixel_accuracy"] == 100
    assert s["feature_map"] == [K, 16, 16]


def test_a_constant_encoder_scores_background_everywhere():
    """Only the bias can learn: it predicts the commonest class, background, at every pixel, so
    pixel accuracy is the test split's background share and mIoU that share over the classes
    present (every shape's IoU is 0)."""
    (xtr, ytr), (xte, yte) = planted("train", 40), planted("test", 20)
    s = linear_segmentation(Constant(), xtr, ytr, xte, yte, K, epochs=30, lr=0.1)
    background = (yte == 0).double().mean().item()
    assert s["pixel_accuracy"] == pytest.approx(100 * background)
    assert s["miou"] == pytest.approx(100 * background / len(yte.unique()))


def test_bad_masks_are_named():
    (xtr, ytr), (xte, yte) = planted("train", 4), planted("test", 2)
    with pytest.raises(ValueError, match="test masks must be"):
        linear_segmentation(Constant(), xtr, ytr, xte, yte[:, :8], K)
    with pytest.raises(ValueError, match=r"mask values must be in \[0, 3\)"):
        linear_segmentation(Constant(), xtr, ytr, xte, yte, 3)
