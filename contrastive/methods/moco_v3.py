"""MoCo v3: momentum contrast without a queue, with a predictor and a symmetrised loss.

Chen, Xie, He, "An Empirical Study of Training Self-Supervised Vision Transformers", ICCV 2021.

One step::

    q1, q2 = normalize(predictor(projector(encoder(x1 | x2))))      # local, with gradient
    key_net <- m * key_net + (1 - m) * (encoder, projector)           # m on a cosine schedule
    k1, k2 = normalize(key_net(x1 | x2)), gathered from all processes # no gradient
    loss = 2 tau * [ CE(q1 k2_all^T / tau, arange(N) + N rank) + CE(q2 k1_all^T / tau, ...) ]

The two terms are summed (not averaged) and scaled by 2 tau, as in the paper's code.

Multi-crop (``num_global`` global views first, then local views of any size): queries from all
views, keys from the global views only; each query's positive is the key of each OTHER global view
of its image (a local view: every global view), the pairing of DINO's loss (Caron et al. 2021,
facebookresearch/dino ``main_dino.py``, ``DINOLoss.forward``: every student crop against every
teacher crop but itself, averaged over the pairs). The mean over the P pairs is multiplied by 2
so that with two views (P = 2) it is exactly the paper's sum above.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import in_batch_metrics, unit, width
from contrastive.methods.base import Method, Schedule, read, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import (
    MomentumEncoder,
    build_head,
    constant_momentum,
    cosine_momentum,
    resolve_encoder,
)
from contrastive.nn.distributed import gather, rank

__all__ = ["MoCoV3"]


@register_method("mocov3")
class MoCoV3(Method):
    """MoCo v3 for ResNets and ViTs.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: output dimension (256).
        mlp_hidden: hidden width of projector and predictor (4096).
        temperature: tau; None = the paper's (0.2 for ViT, 1.0 for ResNet).
        momentum: m0 of the ``"momentum"`` schedule (0.99); ``forward`` uses
            ``batch["momentum"]``.
        momentum_schedule: ``"cosine"`` (the paper: m0 -> 1, :func:`contrastive.nn.cosine_momentum`)
            or ``"constant"``.
        num_global: the first ``num_global`` views are global (keys); more views are local
            crops (queries only).
        vit: heads of the ViT variant (3-layer projector, BN at the predictor output); None =
            auto (the encoder has a ``patch_embed``).
        freeze_patch_embed: the paper's "random patch projection" for ViTs (no gradient to the
            patch embedding, ``--stop-grad-conv1``).
        loss: registry name, called as ``loss(q, k_all, positive_offset=N * rank)``.
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs = ("views",)
    uses_in_batch_negatives = True
    # Paper + CONFIG.md: ResNet-50, tau 1.0, 2-layer projector 2048-4096-256 (the code),
    # predictor 256-4096-256, m0 0.99 (0.996 for 1000 epochs), LARS lr 0.3 x bs/256.
    _R50: ClassVar[dict[str, Any]] = dict(encoder="torchvision:resnet50", dim=256,
                                          mlp_hidden=4096, temperature=1.0, momentum=0.99,
                                          vit=False)
    # ViT-S/B: tau 0.2, 3-layer projector, frozen random patch projection, AdamW.
    _VIT_S: ClassVar[dict[str, Any]] = {**_R50, "encoder": "timm:vit_small_patch16_224",
                                        "temperature": 0.2, "vit": True,
                                        "freeze_patch_embed": True}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": _R50,
        "resnet50_1000ep": {**_R50, "momentum": 0.996},
        "vit_small": _VIT_S,
        "vit_base": {**_VIT_S, "encoder": "timm:vit_base_patch16_224"},
    }

    def __init__(
        self,
        encoder: str | nn.Module = "cifar_resnet18",
        dim: int = 256,
        mlp_hidden: int = 4096,
        temperature: float | None = None,
        momentum: float = 0.99,
        momentum_schedule: str = "cosine",
        num_global: int = 2,
        vit: bool | None = None,
        freeze_patch_embed: bool = False,
        loss: str = "infonce",
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"MoCoV3: momentum must be in [0, 1], got {momentum}")
        if momentum_schedule not in ("cosine", "constant"):
            raise ValueError(f"MoCoV3: momentum_schedule must be 'cosine' or 'constant', got "
                             f"{momentum_schedule!r}")
        if num_global < 2:
            raise ValueError(f"MoCoV3: num_global must be >= 2 (keys of the other global view), "
                             f"got {num_global}")
        self.momentum_schedule, self.num_global = momentum_schedule, num_global
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.vit = hasattr(self.encoder, "patch_embed") if vit is None else vit
        self.temperature = temperature if temperature is not None else (0.2 if self.vit else 1.0)
        self.base_momentum = momentum
        if freeze_patch_embed:
            patch = getattr(self.encoder, "patch_embed", None)
            if patch is None:
                raise ValueError(
                    "MoCoV3: freeze_patch_embed=True needs an encoder with patch_embed"
                )
            for p in patch.parameters():
                p.requires_grad_(False)

        suffix = "_vit" if self.vit else ""
        nf = width(self.encoder)
        self.projector: nn.Module = build_head("mocov3_projector" + suffix, nf, mlp_hidden, dim)
        self.predictor: nn.Module = build_head("mocov3_predictor" + suffix, dim, mlp_hidden, dim)
        self.key_net = MomentumEncoder(nn.Sequential(self.encoder, self.projector))
        self.criterion = get_loss(loss, temperature=self.temperature, normalize=False)

    def schedules(self) -> dict[str, Schedule]:
        """``momentum``: m0 -> 1 on a half cosine over the run (or constant m0)."""
        fn = cosine_momentum if self.momentum_schedule == "cosine" else constant_momentum
        return {"momentum": functools.partial(fn, m0=self.base_momentum)}

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "MoCoV3", min_n=self.num_global)
        glob = views[: self.num_global]
        if len({tuple(x.shape) for x in glob}) != 1:
            raise ValueError(f"MoCoV3: the {self.num_global} global views must have the same "
                             f"shape, got {[tuple(x.shape) for x in glob]}")
        m = read(batch, "momentum", "MoCoV3")
        qs = [unit(self.predictor(self.projector(self.encoder(x)))) for x in views]
        with torch.no_grad():
            self.key_net.update([*self.encoder.parameters(), *self.projector.parameters()], m)
            ks = [gather(unit(self.key_net(x))) for x in glob]  # (N * world_size) x D each

        n = qs[0].shape[0]
        offset = n * rank()
        scale = 2.0 * self.temperature
        pairs = [(v, g) for v in range(len(qs)) for g in range(len(ks)) if g != v]
        total = self.criterion(qs[pairs[0][0]], ks[pairs[0][1]], positive_offset=offset)
        for v, g in pairs[1:]:
            total = total + self.criterion(qs[v], ks[g], positive_offset=offset)
        loss = scale * total
        if len(pairs) != 2:  # the mean over pairs, x 2 (the two-view sum)
            loss = loss * (2.0 / len(pairs))
        pos_col = torch.arange(n, device=qs[0].device) + offset
        m12 = in_batch_metrics(qs[0], ks[1], pos_col)
        m21 = in_batch_metrics(qs[1], ks[0], pos_col)
        metrics = {name: (v + m21[name]) / 2 for name, v in m12.items()}
        return {"loss": loss, **metrics, "embeddings": qs[0].detach()}
