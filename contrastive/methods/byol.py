"""BYOL: bootstrap your own latent, a momentum target and a predictor, no negatives.

Grill et al., "Bootstrap Your Own Latent", NeurIPS 2020 (arXiv 2006.07733); the authors' code is
deepmind-research ``byol/`` (JAX).

One step::

    target <- tau * target + (1 - tau) * (encoder, projector)     # tau on a cosine schedule to 1
    p1, p2 = predictor(projector(encoder(x1 | x2)))                 # online, with gradient
    z1, z2 = target(x1 | x2)                                        # no gradient
    loss = mean_b [2 - 2 cos(p1, z2)] + mean_b [2 - 2 cos(p2, z1)]  # the registry's ``byol``

Defaults (paper Sec. 3.3 and Appendix J, and the code's ``byol_config``): projector and
predictor ``Linear(4096)-BN-ReLU-Linear(256)``, tau_base 0.996 with
``tau = 1 - (1 - tau_base)(cos(pi k / K) + 1) / 2`` (:func:`contrastive.nn.cosine_momentum`),
the symmetric sum of the two terms. The target update runs at the start of each step (before
the target forward), which equals the paper's end-of-previous-step update.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import unit, width
from contrastive.methods.base import Method, Schedule, read, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import (
    MomentumEncoder,
    build_mlp,
    cosine_momentum,
    resolve_encoder,
)

__all__ = ["BYOL"]


@register_method("byol")
class BYOL(Method):
    """BYOL for any backbone.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: projection dimension (256).
        mlp_hidden: hidden width of projector and predictor (4096).
        momentum: tau_base of the ``"momentum"`` schedule (0.996; 0.99 in solo-learn's CIFAR).
        encoder_kwargs: keyword arguments for ``create_encoder``.

    ``forward(batch)``: ``batch["views"]`` two views, ``batch["momentum"]`` the schedule value.
    """

    needs = ("views",)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": dict(encoder="torchvision:resnet50", dim=256, mlp_hidden=4096, momentum=0.996),
        # solo-learn scripts/pretrain/cifar/byol.yaml: 4096 -> 256, tau 0.99 -> 1.0
        "cifar": dict(encoder="cifar_resnet18", dim=256, mlp_hidden=4096, momentum=0.99),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 256,
                 mlp_hidden: int = 4096, momentum: float = 0.996,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"BYOL: momentum must be in [0, 1], got {momentum}")
        self.base_momentum = momentum
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.projector: nn.Module = build_mlp(width(self.encoder), mlp_hidden, dim, 2)
        self.predictor: nn.Module = build_mlp(dim, mlp_hidden, dim, 2)
        self.target = MomentumEncoder(nn.Sequential(self.encoder, self.projector))
        self.criterion = get_loss("byol")

    def schedules(self) -> dict[str, Schedule]:
        """``momentum``: tau_base -> 1 on a half cosine over the run (paper eq. in Sec. 3.2)."""
        return {"momentum": functools.partial(cosine_momentum, m0=self.base_momentum)}

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x1, x2 = views_of(batch, "BYOL", n=2)
        m = read(batch, "momentum", "BYOL")
        z1, z2 = self.projector(self.encoder(x1)), self.projector(self.encoder(x2))
        p1, p2 = self.predictor(z1), self.predictor(z2)
        with torch.no_grad():
            self.target.update([*self.encoder.parameters(), *self.projector.parameters()], m)
            t1, t2 = self.target(x1), self.target(x2)
        loss = self.criterion(p1, t2) + self.criterion(p2, t1)
        with torch.no_grad():
            cos = (unit(p1) * unit(t2)).sum(1).mean() / 2 + (unit(p2) * unit(t1)).sum(1).mean() / 2
        return {"loss": loss, "pos_sim": cos, "embeddings": unit(z1).detach()}
