"""Barlow Twins: redundancy reduction of the cross-correlation of two views' embeddings.

Zbontar, Jing, Misra, LeCun, Deny, "Barlow Twins: Self-Supervised Learning via Redundancy
Reduction", ICML 2021 (arXiv 2103.03230); the authors' code is facebookresearch/barlowtwins
(``main.py``).

One step::

    z1, z2 = projector(encoder(x1 | x2))                   # local N x D
    z1_all, z2_all = gather_with_grad(z1), gather_with_grad(z2)   # the GLOBAL batch, M x D
    loss = barlow_twins(z1_all, z2_all, lambd)              # the registry's batch-level loss

The cross-correlation and its batch standardisation run over the global batch (the official
code all-reduces ``c`` after a SyncBN); every process computes the same loss of the whole batch
and the gather sums the gradient over processes, so with DDP's averaging two processes equal one
with the same global batch. Defaults: projector ``8192-8192-8192`` (3 Linear, BN + ReLU between,
no bias on the last, as the code), lambda 0.0051 (the code; the paper writes 5e-3).

Learning rates: the paper (Sec. 4) and the code (``--learning-rate-weights 0.2
--learning-rate-biases 0.0048``, both times batch/256 and the same warm-up + cosine) train the
biases and BN parameters (every 1-d parameter) at 0.0048 / 0.2 = 0.024 of the weights' lr: the
``bias_lr_scale`` argument, a :class:`ParamGroup` with that ``lr_scale`` (the ``resnet50``
preset). solo-learn's CIFAR setup uses one lr for all (scale 1).
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
from contrastive.nn.distributed import gather_with_grad, world_size

__all__ = ["BarlowTwins"]


@register_method("barlow_twins")
class BarlowTwins(Method):
    """Barlow Twins for any backbone.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: projector output width (8192); mlp_hidden: its hidden width (8192);
        proj_layers: Linear layers (3).
        lambd: weight of the off-diagonal terms (0.0051).
        scale: a factor on the loss (1; solo-learn's CIFAR setup uses 0.1).
        bias_lr_scale: the lr of biases and norm parameters (every 1-d parameter) as a multiple
            of the scheduled lr (1; the official ImageNet setup 0.024 = 0.0048 / 0.2).
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs = ("views",)
    couples_samples = True  # the cross-correlation matrix is a batch statistic
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": dict(encoder="torchvision:resnet50", dim=8192, mlp_hidden=8192, lambd=0.0051,
                         bias_lr_scale=0.024),
        # solo-learn scripts/pretrain/cifar/barlow.yaml: 2048-2048-2048, lambda 0.0051, scale 0.1
        "cifar": dict(encoder="cifar_resnet18", dim=2048, mlp_hidden=2048, lambd=0.0051,
                      scale=0.1),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 8192,
                 mlp_hidden: int = 8192, proj_layers: int = 3, lambd: float = 0.0051,
                 scale: float = 1.0, bias_lr_scale: float = 1.0,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not bias_lr_scale >= 0:
            raise ValueError(f"BarlowTwins: bias_lr_scale must be >= 0, got {bias_lr_scale!r}")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.projector: nn.Module = build_mlp(width(self.encoder), mlp_hidden, dim, proj_layers,
                                   bias=False)
        self.scale, self.bias_lr_scale = scale, bias_lr_scale
        self.criterion = get_loss("barlow_twins", lambd=lambd)

    def param_groups(self) -> list[ParamGroup]:
        """Biases and norm parameters (ndim <= 1, as the code's ``param.ndim == 1``) at
        ``bias_lr_scale`` times the scheduled lr, when it is not 1."""
        if self.bias_lr_scale == 1.0:
            return []
        ones = [p for p in self.parameters() if p.requires_grad and p.ndim <= 1]
        return [ParamGroup("biases_norms", ones, lr_scale=self.bias_lr_scale)]

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x1, x2 = views_of(batch, "BarlowTwins", n=2)
        z1, z2 = self.projector(self.encoder(x1)), self.projector(self.encoder(x2))
        a, b = (gather_with_grad(z1), gather_with_grad(z2)) if world_size() > 1 else (z1, z2)
        loss = self.scale * self.criterion(a, b)
        return {"loss": loss, "embeddings": unit(z1).detach()}
