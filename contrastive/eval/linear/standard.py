"""The standard linear probe (MoCo, He et al. CVPR 2020, section 4.1; ``main_lincls.py`` of the
official code): the backbone is frozen and kept in eval mode (BN uses its running statistics, no
gradient), a linear classifier ``y = W f + b`` on the pooled features is trained with SGD, lr 30,
momentum 0.9, weight decay 0, batch 256, 100 epochs, lr x0.1 at epochs 60 and 80, on augmented
crops (RandomResizedCrop + flip) drawn anew every epoch; evaluation on centre crops.

Safety as in MoCo v3's linear evaluation: :func:`snapshot_state` / :func:`assert_unchanged` check
that the backbone is bit-identical after training.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.eval.features import extract_features, unwrap_views
from contrastive.eval.linear.common import evaluate_head

log = logging.getLogger(__name__)

__all__ = ["train_linear_standard", "evaluate_standard", "snapshot_state", "assert_unchanged"]


def snapshot_state(module: nn.Module) -> dict[str, Tensor]:
    """A detached copy of every parameter and buffer, for :func:`assert_unchanged`."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_unchanged(module: nn.Module, snapshot: dict[str, Tensor]) -> None:
    """Raise RuntimeError naming the entries of ``module`` that differ from ``snapshot``.

    MoCo v3's sanity check: a linear probe must not change the frozen backbone (not even BN
    running statistics, which change when the backbone is left in train mode).
    """
    current = module.state_dict()
    changed = [
        k
        for k, v in snapshot.items()
        if k not in current or current[k].shape != v.shape or not torch.equal(current[k].cpu(), v.cpu())
    ]
    if changed:
        raise RuntimeError(
            f"the frozen backbone changed during the linear probe ({len(changed)} entries, e.g. "
            f"{changed[:5]}); it must stay in eval mode with requires_grad=False"
        )


def train_linear_standard(
    encoder: nn.Module,
    train_loader: Iterable,
    *,
    num_classes: int,
    num_features: int | None = None,
    epochs: int = 100,
    lr: float = 30.0,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    milestones: Sequence[float] = (0.6, 0.8),
    accelerator: Any | None = None,
    device: torch.device | str | None = None,
    device_transform: Any | None = None,
    autocast_dtype: torch.dtype | None = None,
    seed: int = 0,
    progress: bool = False,
) -> nn.Linear:
    """Train a linear classifier on a frozen backbone with the MoCo protocol.

    Args:
        encoder: backbone (B, 3, H, W) -> (B, D); frozen here (eval mode, requires_grad False)
            and checked bit-identical afterwards.
        train_loader: yields (augmented images, labels), augmentation drawn anew every epoch;
            prepare it with the accelerator for several processes.
        num_classes: outputs C of the classifier; a label >= C raises ValueError.
        num_features: D; default ``encoder.num_features``.
        epochs, lr, momentum, weight_decay: 100, 30, 0.9, 0 as in MoCo (batch 256 in the loader).
        milestones: lr x0.1 at these fractions of ``epochs`` (60 and 80 of 100).
        accelerator: an ``accelerate.Accelerator`` (the classifier is prepared with it: DDP on
            several processes).
        seed: initialisation of the classifier (weights N(0, 0.01), bias 0, as in MoCo).

    Returns:
        the trained ``nn.Linear(D, C)`` (unwrapped).
    """
    d = num_features or getattr(encoder, "num_features", None)
    if d is None:
        raise ValueError("num_features: the encoder has no .num_features; pass num_features=D")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes}: a linear probe needs at least 2 classes to mean anything")
    device = torch.device(accelerator.device if accelerator is not None else (device or "cpu"))
    encoder.to(device).eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    before = snapshot_state(encoder)
    head = nn.Linear(d, num_classes)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_(0.0, 0.01, generator=gen)
        head.bias.zero_()
    head.to(device)
    optimizer = torch.optim.SGD(head.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    steps = sorted({int(round(m * epochs)) for m in milestones})
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=steps, gamma=0.1)
    if accelerator is not None:
        head, optimizer = accelerator.prepare(head, optimizer)
    main = accelerator is None or accelerator.is_main_process
    for epoch in range(epochs):
        encoder.eval()  # the MoCo protocol: BN keeps its running statistics
        seen = 0
        iterator: Iterable = train_loader
        if progress and main:
            from tqdm.auto import tqdm

            iterator = tqdm(train_loader, desc=f"linear epoch {epoch + 1}/{epochs}", leave=False)
        for images, targets in iterator:
            x = unwrap_views(images).to(device, non_blocking=True)
            if device_transform is not None:
                x = device_transform(x)
            y = torch.as_tensor(targets).to(device).long()
            if y.numel() and (int(y.max()) >= num_classes or int(y.min()) < 0):
                bad = int(y.max()) if int(y.max()) >= num_classes else int(y.min())
                raise ValueError(
                    f"training labels: found label {bad} but the head has num_classes="
                    f"{num_classes} outputs (labels must lie in [0, {num_classes}))"
                )
            with torch.no_grad():
                if autocast_dtype is not None:
                    with torch.autocast(device.type, dtype=autocast_dtype):
                        f = encoder(x)
                else:
                    f = encoder(x)
            loss = F.cross_entropy(head(f.float()), y)
            optimizer.zero_grad(set_to_none=True)
            if accelerator is not None:
                accelerator.backward(loss)
            else:
                loss.backward()
            optimizer.step()
            seen += y.numel()
        if seen == 0:
            raise ValueError("the training loader yielded no batch: the training split is empty")
        scheduler.step()
        if main:
            log.info("linear epoch %d/%d: loss %.4f lr %g", epoch + 1, epochs, loss.item(),
                     optimizer.param_groups[0]["lr"])
    assert_unchanged(encoder, before)
    if accelerator is not None:
        head = accelerator.unwrap_model(head)
    return head


def evaluate_standard(
    encoder: nn.Module,
    head: nn.Module,
    loader: Iterable,
    *,
    accelerator: Any | None = None,
    device: torch.device | str | None = None,
    device_transform: Any | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """Top-1 / top-5 (percent) of ``head(encoder(x))`` over ``loader`` (centre crops)."""
    feats, labels = extract_features(
        encoder,
        loader,
        accelerator=accelerator,
        device=device,
        device_transform=device_transform,
        autocast_dtype=autocast_dtype,
    )
    return evaluate_head(head, feats, labels)
