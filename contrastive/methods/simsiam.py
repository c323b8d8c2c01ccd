"""SimSiam: a siamese network with a predictor and a stop-gradient, no negatives, no momentum.

Chen & He, "Exploring Simple Siamese Representation Learning", CVPR 2021 (arXiv 2011.10566);
the authors' code is facebookresearch/simsiam (``simsiam/builder.py``, ``main_simsiam.py``).

One step (paper Algorithm 1)::

    z1, z2 = projector(encoder(x1 | x2)); p1, p2 = predictor(z1 | z2)
    loss = D(p1, stopgrad(z2)) / 2 + D(p2, stopgrad(z1)) / 2,   D = -cos (the registry's simsiam)

Defaults (paper Sec. 4 and the code): projector of 3 layers ``Linear-BN-ReLU-Linear-BN-ReLU-
Linear-BN`` at the encoder's width (2048 for ResNet-50) to ``dim`` 2048, the last BN without
affine (the code's ``BatchNorm1d(dim, affine=False)``, bias-free Linears before BNs); predictor
``Linear(512, no bias)-BN-ReLU-Linear(dim)``; the predictor's learning rate FIXED at the base
lr (the code's ``fix_lr``: "predictor with a constant lr", paper Sec. 4.2 and Table 1), a
parameter group of the contract. ``stop_gradient=False`` removes the stop-gradient: the method
then collapses (paper Fig. 2), visible in the engine's ``embedding_std`` metric; kept for that negative control.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import unit, width
from contrastive.methods.base import Method, ParamGroup, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import build_mlp, resolve_encoder

__all__ = ["SimSiam"]


@register_method("simsiam")
class SimSiam(Method):
    """SimSiam for any backbone.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: projection dimension (2048).
        proj_hidden: projector hidden width; None = the encoder's ``num_features``.
        pred_hidden: predictor bottleneck (512).
        proj_layers: projector Linear layers (3 for ImageNet; 2 in the paper's CIFAR setup).
        predictor_lr: the predictor's fixed learning rate (its parameter group); None = the
            run's schedule (not fixed). Recipes pass the run's peak lr, as the code does.
        stop_gradient: False only for the collapse control.
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs = ("views",)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": dict(encoder="torchvision:resnet50", dim=2048, pred_hidden=512),
        # solo-learn scripts/pretrain/cifar/simsiam.yaml: 2048 -> 2048, predictor 512, with the
        # 2-layer projector of the paper's CIFAR setup (Appendix D)
        "cifar": dict(encoder="cifar_resnet18", dim=2048, proj_hidden=2048, pred_hidden=512,
                      proj_layers=2),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 2048,
                 proj_hidden: int | None = None, pred_hidden: int = 512, proj_layers: int = 3,
                 predictor_lr: float | None = None, stop_gradient: bool = True,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        nf = width(self.encoder)
        self.projector: nn.Module = build_mlp(nf, proj_hidden or nf, dim, proj_layers, last_bn=True)
        self.predictor: nn.Module = build_mlp(dim, pred_hidden, dim, 2)
        self.predictor_lr, self.stop_gradient = predictor_lr, stop_gradient
        self.criterion = get_loss("simsiam")

    def param_groups(self) -> list[ParamGroup]:
        """The predictor at a fixed lr (when ``predictor_lr`` is set)."""
        if self.predictor_lr is None:
            return []
        return [ParamGroup("predictor", list(self.predictor.parameters()), lr=self.predictor_lr)]

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x1, x2 = views_of(batch, "SimSiam", n=2)
        z1, z2 = self.projector(self.encoder(x1)), self.projector(self.encoder(x2))
        p1, p2 = self.predictor(z1), self.predictor(z2)
        t1, t2 = (z1.detach(), z2.detach()) if self.stop_gradient else (z1, z2)
        loss = self.criterion(p1, t2) / 2 + self.criterion(p2, t1) / 2
        return {"loss": loss, "pos_sim": -loss.detach(), "embeddings": unit(z1).detach()}
