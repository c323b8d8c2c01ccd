"""Per-pixel linear segmentation on a frozen encoder's feature map: the probe of dense methods.

Any encoder whose last stage is a feature map (``stage_features(encoder, x)[-1]``, the map
DenseCL's dense head reads) is scored by a linear classifier of its locations: the map is
extracted once, standardised per channel with the training split's statistics (a frozen
BatchNorm), a 1 x 1 convolution is trained on it with cross-entropy, and mIoU and pixel accuracy
are read on a held-out split.

The protocol is VICRegL's (Bardes, Ponce, LeCun, NeurIPS 2022; facebookresearch/VICRegL
``segmentation/models/linear_head.py``: ``LinearHead`` = BatchNorm then mmsegmentation's 1 x 1
``cls_seg`` on the last stage of the frozen backbone, ``segmentation/configs/linear_r50_*``).
mmsegmentation's decode head resizes the LOGITS bilinearly to the label's size before the loss
and at test, and so does this module, rather than downsampling the masks to the map: at 24-32 px
a small CNN's map is 3 x 3 or 4 x 4, where one location spans a whole shape's edge, so downsampled
masks would score a coarser task than the pixels and hide what the map locates between
locations. DenseCL (Wang et al., CVPR 2021) fine-tunes an FCN for its segmentation figures
(VOC, Cityscapes); it reports no frozen linear probe.

mIoU is the mean over the classes that occur in the target or the prediction (mmsegmentation's
nan-mean), background included, as Pascal VOC's 21 classes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.nn import stage_features

log = logging.getLogger(__name__)

__all__ = ["feature_maps", "segmentation_scores", "linear_segmentation"]


@torch.no_grad()
def feature_maps(encoder: nn.Module, images: Tensor, batch_size: int = 256) -> Tensor:
    """The encoder's last-stage map of each image, in eval mode (its mode is put back).

    Shape: images (N, 3, H, W), ready for the encoder -> float32 (N, C, h, w).
    """
    was_training = encoder.training
    encoder.eval()
    try:
        maps = [stage_features(encoder, images[i:i + batch_size])[-1].float()
                for i in range(0, images.shape[0], batch_size)]
    finally:
        encoder.train(was_training)
    fmap = torch.cat(maps)
    if fmap.dim() != 4:
        raise ValueError(f"linear segmentation: the encoder's last stage must be a feature map "
                         f"(N, C, h, w), got shape {tuple(fmap.shape)}")
    return fmap


def segmentation_scores(pred: Tensor, target: Tensor, num_classes: int) -> dict[str, Any]:
    """mIoU and pixel accuracy (percent) of predicted against true class maps.

    IoU_c = |pred = c and target = c| / |pred = c or target = c|; mIoU is their mean over the
    classes whose union is not empty. ``iou`` lists every class (None where its union is empty).

    Shape: pred, target (N, H, W) integer class ids in [0, num_classes).
    """
    if pred.shape != target.shape:
        raise ValueError(f"segmentation_scores: pred and target must have one shape, got "
                         f"{tuple(pred.shape)} and {tuple(target.shape)}")
    pair = target.flatten().long() * num_classes + pred.flatten().long()
    confusion = torch.bincount(pair, minlength=num_classes ** 2).view(num_classes, num_classes)
    hits = confusion.diag().double()
    union = confusion.sum(0).double() + confusion.sum(1).double() - hits
    present = union > 0
    iou = hits / union.clamp(min=1)
    return {"miou": 100 * iou[present].mean().item(),
            "pixel_accuracy": 100 * hits.sum().item() / max(1, target.numel()),
            "iou": [100 * v if p else None for v, p in zip(iou.tolist(), present.tolist())]}


def _predict(classifier: nn.Module, fmap: Tensor, size: torch.Size, batch_size: int) -> Tensor:
    with torch.no_grad():
        return torch.cat([
            F.interpolate(classifier(fmap[i:i + batch_size]), size=size, mode="bilinear",
                          align_corners=False).argmax(1)
            for i in range(0, fmap.shape[0], batch_size)])


def linear_segmentation(
    encoder: nn.Module,
    train_images: Tensor,
    train_masks: Tensor,
    test_images: Tensor,
    test_masks: Tensor,
    num_classes: int,
    *,
    epochs: int = 100,
    lr: float = 0.01,
    batch_size: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Train a 1 x 1 linear classifier on the frozen encoder's map, score it on the test split.

    Adam (``lr``) on the cross-entropy of the bilinearly upsampled logits against every pixel,
    ``epochs`` passes over the training maps in seeded random batches of ``batch_size`` images;
    the classifier starts at zero, so the result depends on ``seed`` only through the batches.

    Shape: images (N, 3, H, W), ready for the encoder; masks (N, H, W) class ids in
    [0, num_classes). Returns :func:`segmentation_scores` of the test split plus the map's
    ``feature_map`` shape (C, h, w) and the final training ``loss``.
    """
    for name, images, masks in (("train", train_images, train_masks),
                                ("test", test_images, test_masks)):
        if masks.shape != (images.shape[0], *images.shape[2:]):
            raise ValueError(f"linear segmentation: {name} masks must be (N, H, W) of the images "
                             f"{tuple(images.shape)}, got {tuple(masks.shape)}")
        if masks.numel() and not 0 <= int(masks.min()) <= int(masks.max()) < num_classes:
            raise ValueError(f"linear segmentation: {name} mask values must be in "
                             f"[0, {num_classes}); got {int(masks.min())}..{int(masks.max())}")
    train_map, test_map = feature_maps(encoder, train_images), feature_maps(encoder, test_images)
    mean = train_map.mean(dim=(0, 2, 3), keepdim=True)
    std = train_map.std(dim=(0, 2, 3), keepdim=True)
    train_map, test_map = (train_map - mean) / (std + 1e-6), (test_map - mean) / (std + 1e-6)

    classifier = nn.Conv2d(train_map.shape[1], num_classes, 1)
    with torch.no_grad():
        for param in classifier.parameters():
            param.zero_()
    opt = torch.optim.Adam(classifier.parameters(), lr=lr)
    targets, size = train_masks.long(), train_masks.shape[1:]
    g = torch.Generator().manual_seed(seed)
    loss = torch.zeros(())
    with torch.enable_grad():
        for _ in range(epochs):
            for rows in torch.randperm(train_map.shape[0], generator=g).split(batch_size):
                logits = F.interpolate(classifier(train_map[rows]), size=size, mode="bilinear",
                                       align_corners=False)  # (B, K, H, W)
                loss = F.cross_entropy(logits, targets[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
    pred = _predict(classifier, test_map, test_masks.shape[1:], batch_size)
    scores = segmentation_scores(pred, test_masks, num_classes)
    log.info("linear segmentation: mIoU %.1f, pixel accuracy %.1f (%d test images, map %s)",
             scores["miou"], scores["pixel_accuracy"], test_map.shape[0],
             tuple(train_map.shape[1:]))
    return {**scores, "feature_map": list(train_map.shape[1:]), "loss": loss.item()}
