"""DCL: SimCLR with the decoupled contrastive loss (the positive out of the denominator).

Yeh, Hong, Hsu, Liu, Chen, LeCun, "Decoupled Contrastive Learning", ECCV 2022, arXiv 2110.06848.
The method is SimCLR (same encoder, projection head, views, gather with gradient) with the loss
of eq. 6 (:func:`contrastive.losses.functional.dcl`)::

    z1, z2 = normalize(head(encoder(x1 | x2)))
    loss = dcl(z1, z2, z1_all=gather(z1), z2_all=gather(z2), positive_offset=N * rank)

Two views only: the paper defines the loss on view pairs (no multi-crop form).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from contrastive.methods.base import views_of
from contrastive.methods.registry import register_method
from contrastive.methods.simclr import SimCLR

__all__ = ["DCL"]


@register_method("dcl")
class DCL(SimCLR):
    """SimCLR's network trained with DCL's loss.

    Args:
        encoder: backbone name or module with ``num_features``.
        dim: projection output dimension (128).
        mlp_hidden: hidden width; None = the encoder's ``num_features``.
        num_layers: Linear layers of the head (2).
        last_bn: BN on the head output (SimCLR's head).
        temperature: tau (0.1, the paper's and lightly's default).
        encoder_kwargs: keyword arguments for ``create_encoder``.

    ``forward(batch)`` reads ``batch["views"]``: exactly two (N, C, H, W) views.
    """

    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # SimCLR's networks with tau 0.1 (lightly's DCLLoss default); the paper's own tau per
        # data set is not checked yet (see recipes/dcl_cifar.py for the sources and the gaps)
        "imagenet": dict(encoder="torchvision:resnet50", dim=128, temperature=0.1),
        "cifar": dict(encoder="cifar_resnet18", dim=128, temperature=0.1),
    }
    loss_name: ClassVar[str] = "dcl"

    def __init__(
        self,
        encoder: str | nn.Module = "cifar_resnet18",
        dim: int = 128,
        mlp_hidden: int | None = None,
        num_layers: int = 2,
        last_bn: bool = True,
        temperature: float = 0.1,
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(encoder, dim=dim, mlp_hidden=mlp_hidden, num_layers=num_layers,
                         last_bn=last_bn, temperature=temperature, loss=self.loss_name,
                         encoder_kwargs=encoder_kwargs)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, type(self).__name__, min_n=2)
        if len(views) != 2:
            raise ValueError(
                f"{type(self).__name__} takes exactly two views (the paper's loss is defined on "
                f"view pairs), got {len(views)}: drop --local-crops or use SimCLR for multi-crop"
            )
        return super().forward(batch)
