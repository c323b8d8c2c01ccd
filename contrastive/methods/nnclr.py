"""NNCLR: nearest-neighbour contrastive learning with a support set of past embeddings.

Dwibedi et al., "With a Little Help from My Friends: Nearest-Neighbor Contrastive Learning of
Visual Representations", ICCV 2021 (arXiv 2104.14548). The authors released no code; solo-learn
(``solo/methods/nnclr.py``) and lightly (``NNMemoryBankModule``) are the public
implementations; we follow the paper and fix solo-learn's bug #229 (a support set holding one
process's embeddings only).

One step (paper eq. 2, symmetric as Sec. 3.1)::

    z1, z2 = normalize(projector(encoder(x1 | x2)));  p1, p2 = predictor(z1 | z2)
    nn1, nn2 = nearest neighbour of z1 | z2 in the support set Q (cosine), no gradient
    loss = [ infonce(nn1, p2_all, offset) + infonce(nn2, p1_all, offset) ] / 2   # in-batch
    Q.enqueue(z1 of EVERY process)

``p_all`` are the predictions of the whole batch of M images (gathered with gradient), so each
nearest neighbour has M - 1 negatives, as in one process with the global batch. Defaults
(paper Sec. 4.1): projector 3 layers 2048-2048-256 with BN, predictor 4096 hidden, support
set 98,304, temperature 0.1.
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
from contrastive.nn import KeyQueue, build_mlp, resolve_encoder
from contrastive.nn.distributed import gather_with_grad, rank, world_size

__all__ = ["NNCLR"]


@register_method("nnclr")
class NNCLR(Method):
    """NNCLR for any backbone.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: embedding dimension (256); proj_hidden (2048), pred_hidden (4096).
        support_size: size of the support set (98,304).
        temperature: tau (0.1).
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs = ("views",)
    uses_in_batch_negatives = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": dict(encoder="torchvision:resnet50", dim=256, proj_hidden=2048,
                         pred_hidden=4096, support_size=98304, temperature=0.1),
        # solo-learn scripts/pretrain/cifar/nnclr.yaml: 2048 -> 256, predictor 4096,
        # queue 65536, temperature 0.2
        "cifar": dict(encoder="cifar_resnet18", dim=256, proj_hidden=2048, pred_hidden=4096,
                      support_size=65536, temperature=0.2),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 256,
                 proj_hidden: int = 2048, pred_hidden: int = 4096, support_size: int = 98304,
                 temperature: float = 0.1,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.projector: nn.Module = build_mlp(width(self.encoder), proj_hidden, dim, 3, last_bn=True)
        self.predictor: nn.Module = build_mlp(dim, pred_hidden, dim, 2)
        self.support = KeyQueue(dim, support_size)
        self.temperature = temperature
        self.criterion = get_loss("infonce", temperature=temperature, normalize=False)

    @torch.no_grad()
    def nearest(self, z: Tensor) -> Tensor:
        """The nearest support-set embedding (cosine) of each row of unit ``z``: (N, D)."""
        bank = self.support.keys.to(z.dtype)
        return bank.index_select(0, (z @ bank.T).argmax(dim=1))

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x1, x2 = views_of(batch, "NNCLR", n=2)
        z1, z2 = unit(self.projector(self.encoder(x1))), unit(self.projector(self.encoder(x2)))
        p1, p2 = unit(self.predictor(z1)), unit(self.predictor(z2))
        nn1, nn2 = self.nearest(z1.detach()), self.nearest(z2.detach())
        n = z1.shape[0]
        if world_size() > 1:
            p1_all, p2_all, offset = gather_with_grad(p1), gather_with_grad(p2), n * rank()
        else:
            p1_all, p2_all, offset = p1, p2, 0
        loss = (self.criterion(nn1, p2_all, positive_offset=offset)
                + self.criterion(nn2, p1_all, positive_offset=offset)) / 2
        self.support.enqueue(z1.detach())  # gathered from every process inside
        pos_col = torch.arange(n, device=z1.device) + offset
        metrics = in_batch_metrics(nn1, p2_all.detach(), pos_col)
        return {"loss": loss, **metrics, "nn_match": (nn1 * z1.detach()).sum(1).mean(),
                "embeddings": z1.detach()}
