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

Multi-crop (V > 2 views of any sizes, e.g. 2 x 224 px + 6 x 96 px): every other view of the same
image is a positive, every view of another image a negative: SupCon's L^sup_out (Khosla et al.
2020, eq. 2) with the image ids as labels over the V * M gathered views, as solo-learn's
multi-crop SimCLR does (``solo/methods/simclr.py`` builds the positive mask from the image
``indexes`` repeated for every crop; its ``solo/losses/simclr.py`` puts the sum over positives
inside the log, L^sup_in, where we average the log-probabilities, L^sup_out). With two views it is
NT-Xent (computed by the ``loss`` as before).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import in_batch_metrics, unit, width
from contrastive.methods.base import Method, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import build_mlp, resolve_encoder
from contrastive.nn.distributed import gather_with_grad, rank, world_size

__all__ = ["SimCLR", "multiview_loss"]


@register_method("simclr")
class SimCLR(Method):
    """SimCLR with the paper's projection head.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: projection output dimension (128).
        mlp_hidden: hidden width; None = the encoder's ``num_features`` (2048 for ResNet-50,
            as in the paper).
        num_layers: Linear layers of the head (2 in SimCLR v1, 3 in v2).
        last_bn: BN on the head output as in the official code (without affine here).
        temperature: tau (0.1 for ImageNet in the paper; 0.5 for CIFAR-10).
        loss: registry name, called as ``loss(z1, z2, z1_all=..., z2_all=..., positive_offset=...)``.
        encoder_kwargs: keyword arguments for ``create_encoder``.

    ``forward(batch)`` reads ``batch["views"]``: two or more (N, C, H_v, W_v) views (multi-crop
    when more, see the module docstring); no schedule.
    """

    needs = ("views",)
    uses_in_batch_negatives = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {
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
        loss: str = "ntxent",
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        nf = width(self.encoder)
        self.head: nn.Module = build_mlp(
            nf, mlp_hidden or nf, dim, num_layers, hidden_bn=True, last_bn=last_bn
        )
        self.temperature = temperature
        self.criterion = get_loss(loss, temperature=temperature, normalize=False)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "SimCLR", min_n=2)
        zs = [unit(self.head(self.encoder(x))) for x in views]
        z1, z2 = zs[0], zs[1]
        n = z1.shape[0]
        if world_size() > 1:
            z_all, offset = [gather_with_grad(z) for z in zs], n * rank()
        else:
            z_all, offset = None, 0
        if len(zs) == 2:
            loss = self.criterion(z1, z2, z1_all=None if z_all is None else z_all[0],
                                  z2_all=None if z_all is None else z_all[1],
                                  positive_offset=offset)
        else:
            loss = multiview_loss(zs, z_all, offset, self.temperature)

        c1 = z1 if z_all is None else z_all[0]
        c2 = z2 if z_all is None else z_all[1]
        m = c1.shape[0]
        local = torch.arange(n, device=z1.device) + offset
        metrics = in_batch_metrics(  # the first two views
            torch.cat([z1, z2]).detach(),
            torch.cat([c1, c2]).detach(),
            pos_col=torch.cat([local + m, local]),
            self_col=torch.cat([local, local + m]),
        )
        return {"loss": loss, **metrics, "embeddings": z1.detach()}


def multiview_loss(zs: list[Tensor], z_all: list[Tensor] | None, offset: int,
                   temperature: float) -> Tensor:
    """SupCon's L^sup_out with image ids as labels over V views (multi-crop SimCLR).

    zs: V local unit embeddings (N, D); z_all: the same gathered from every process (M, D) each
    (None in one process); offset: row of this process's first image in the gathered batch.
    Anchor (v, i) has the V - 1 other views of image i as positives and every other view of the
    V * M as negatives; the loss is the mean over the V * N local anchors.
    """
    v_count, n = len(zs), zs[0].shape[0]
    cands = zs if z_all is None else z_all
    m = cands[0].shape[0]
    with torch.autocast(zs[0].device.type, enabled=False):
        dtype = torch.promote_types(zs[0].dtype, torch.float32)  # fp32 at least, as the loss
        anchors = torch.cat(zs).to(dtype)  # (V N, D), view-major
        cand = torch.cat(cands).to(dtype)  # (V M, D)
        logits = anchors @ cand.T / temperature
        rows = torch.arange(v_count * n, device=anchors.device)
        image = offset + rows % n  # global image id of each anchor
        self_col = (rows // n) * m + image
        cand_image = torch.arange(v_count * m, device=anchors.device) % m
        self_mask = torch.zeros_like(logits, dtype=torch.bool)
        self_mask[rows, self_col] = True
        pos = (image[:, None] == cand_image[None, :]) & ~self_mask
        logits = logits.masked_fill(self_mask, float("-inf"))
        log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
        per_anchor = -log_prob.masked_fill(~pos, 0.0).sum(dim=1) / (v_count - 1)
    return per_anchor.mean()
