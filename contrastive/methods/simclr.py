"""SimCLR: in-batch contrastive learning with NT-Xent.

Chen, Kornblith, Norouzi, Hinton, "A Simple Framework for Contrastive Learning of Visual
Representations", ICML 2020.

One step::

    z1, z2 = normalize(head(encoder(x1 | x2)))                 # N x D each, local
    z1_all, z2_all = gather_with_grad(z1), gather_with_grad(z2) # M = N * world_size rows
    loss = ntxent(z1, z2, z1_all=z1_all, z2_all=z2_all, positive_offset=N * rank)

Each process scores its 2N local anchors against all 2M views; the gather keeps the gradient
(and sums it over processes in backward), so that with DDP's averaging the update equals the
one of a single process with the whole batch: every anchor has 2M - 2 negatives. A gather
without gradient (or no gather) silently weakens multi-GPU training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import PresetMixin, check_views, in_batch_metrics, unit
from contrastive.nn import build_mlp, convert_to_sync_bn, resolve_encoder
from contrastive.nn.distributed import gather_with_grad, rank, world_size

__all__ = ["SimCLR"]


class SimCLR(PresetMixin, nn.Module):
    """SimCLR with the paper's projection head.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: projection output dimension (128).
        mlp_hidden: hidden width; None = the encoder's ``num_features`` (2048 for ResNet-50,
            as in the paper).
        num_layers: Linear layers of the head (2 in SimCLR v1, 3 in v2).
        last_bn: BN on the head output as in the official code (without affine here).
        temperature: tau (0.1 for ImageNet in the paper; 0.5 for CIFAR-10).
        sync_bn: convert every BN to SyncBatchNorm (the paper uses global BN; GPU only).
        loss: registry name, called as ``loss(z1, z2, z1_all=..., z2_all=..., positive_offset=...)``.
        encoder_kwargs: keyword arguments for ``create_encoder``.

    ``forward(views, momentum=None)``: ``momentum`` is accepted and ignored (no momentum
    encoder), so the engine can treat all methods alike.
    """

    uses_in_batch_negatives = True
    momentum_schedule = None
    presets: dict[str, dict[str, Any]] = {
        # ImageNet: ResNet-50, 2048-2048-128 head, tau 0.1, LARS, batch 4096.
        "imagenet": dict(encoder="torchvision:resnet50", dim=128, temperature=0.1),
        # CIFAR-10 (paper appendix B.9): ResNet-50 with 3x3 stem and no max-pool, tau 0.5.
        "cifar": dict(encoder="cifar_resnet50", dim=128, temperature=0.5),
    }

    def __init__(
        self,
        encoder: str | nn.Module = "cifar_resnet18",
        dim: int = 128,
        mlp_hidden: int | None = None,
        num_layers: int = 2,
        last_bn: bool = True,
        temperature: float = 0.1,
        sync_bn: bool = False,
        loss: str = "ntxent",
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        nf = self.encoder.num_features
        self.head = build_mlp(
            nf, mlp_hidden or nf, dim, num_layers, hidden_bn=True, last_bn=last_bn
        )
        if sync_bn:
            self.encoder = convert_to_sync_bn(self.encoder)
            self.head = convert_to_sync_bn(self.head)
        self.temperature = temperature
        self.criterion = get_loss(loss, temperature=temperature, normalize=False)

    def forward(self, views: Sequence[Tensor], momentum: float | None = None) -> dict[str, Tensor]:
        x1, x2 = check_views(views, "SimCLR")
        z1 = unit(self.head(self.encoder(x1)))
        z2 = unit(self.head(self.encoder(x2)))
        n = z1.shape[0]
        if world_size() > 1:
            z1_all, z2_all, offset = gather_with_grad(z1), gather_with_grad(z2), n * rank()
        else:
            z1_all, z2_all, offset = None, None, 0
        loss = self.criterion(z1, z2, z1_all=z1_all, z2_all=z2_all, positive_offset=offset)

        c1 = z1 if z1_all is None else z1_all
        c2 = z2 if z2_all is None else z2_all
        m = c1.shape[0]
        local = torch.arange(n, device=z1.device) + offset
        metrics = in_batch_metrics(
            torch.cat([z1, z2]).detach(),
            torch.cat([c1, c2]).detach(),
            pos_col=torch.cat([local + m, local]),
            self_col=torch.cat([local, local + m]),
        )
        return {"loss": loss, **metrics, "embeddings": z1.detach()}
