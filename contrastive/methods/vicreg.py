"""VICReg: variance-invariance-covariance regularisation of two views' embeddings.

Bardes, Ponce, LeCun, "VICReg: Variance-Invariance-Covariance Regularization for
Self-Supervised Learning", ICLR 2022 (arXiv 2105.04906); the authors' code is
facebookresearch/vicreg (``main_vicreg.py``).

One step::

    z1, z2 = expander(encoder(x1 | x2))                      # local N x D
    z1_all, z2_all = gather_with_grad(z1), gather_with_grad(z2)   # the GLOBAL batch
    loss = 25 MSE + 25 (v(z1) + v(z2)) / 2 + 1 (c(z1) + c(z2))     # the registry's vicreg

Variance and covariance over the global batch (the code's ``FullGatherLayer``); the invariance
term over the global batch equals the mean of the processes' local MSEs (equal batches). Every
process computes the loss of the whole batch; the gather sums gradients over processes, so with
DDP's averaging two processes equal one. Defaults: expander ``8192-8192-8192`` (3 Linear, BN +
ReLU between, the code's ``--mlp 8192-8192-8192``), weights (25, 25, 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, cast

from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.losses.decorrelation import VICRegLoss, vicreg_terms
from contrastive.methods._common import unit, width
from contrastive.methods.base import Method, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import build_mlp, resolve_encoder
from contrastive.nn.distributed import gather_with_grad, world_size

__all__ = ["VICReg"]


@register_method("vicreg")
class VICReg(Method):
    """VICReg for any backbone.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim, mlp_hidden, proj_layers: expander widths and depth (8192, 8192, 3).
        sim_coeff, std_coeff, cov_coeff: lambda, mu, nu (25, 25, 1).
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs: tuple[str, ...] = ("views",)
    couples_samples = True  # variance and covariance are batch statistics
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": dict(encoder="torchvision:resnet50", dim=8192, mlp_hidden=8192),
        # solo-learn scripts/pretrain/cifar/vicreg.yaml: 2048-2048-2048, weights 25 / 25 / 1
        "cifar": dict(encoder="cifar_resnet18", dim=2048, mlp_hidden=2048),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 8192,
                 mlp_hidden: int = 8192, proj_layers: int = 3, sim_coeff: float = 25.0,
                 std_coeff: float = 25.0, cov_coeff: float = 1.0,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.projector: nn.Module = build_mlp(width(self.encoder), mlp_hidden, dim, proj_layers)
        self.criterion = get_loss("vicreg", sim_coeff=sim_coeff, std_coeff=std_coeff,
                                  cov_coeff=cov_coeff)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x1, x2 = views_of(batch, "VICReg", n=2)
        z1, z2 = self.projector(self.encoder(x1)), self.projector(self.encoder(x2))
        a, b = (gather_with_grad(z1), gather_with_grad(z2)) if world_size() > 1 else (z1, z2)
        loss = self.criterion(a, b)
        eps = cast(VICRegLoss, self.criterion).eps  # get_loss("vicreg") builds a VICRegLoss
        inv, var, cov = vicreg_terms(a.detach(), b.detach(), eps=eps)
        return {"loss": loss, "invariance": inv, "variance": var, "covariance": cov,
                "embeddings": unit(z1).detach()}
