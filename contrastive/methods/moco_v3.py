"""MoCo v3: momentum contrast without a queue, with a predictor and a symmetrised loss.

Chen, Xie, He, "An Empirical Study of Training Self-Supervised Vision Transformers", ICCV 2021.

One step::

    q1, q2 = normalize(predictor(projector(encoder(x1 | x2))))      # local, with gradient
    key_net <- m * key_net + (1 - m) * (encoder, projector)           # m on a cosine schedule
    k1, k2 = normalize(key_net(x1 | x2)), gathered from all processes # no gradient
    loss = 2 tau * [ CE(q1 k2_all^T / tau, arange(N) + N rank) + CE(q2 k1_all^T / tau, ...) ]

The two terms are summed (not averaged) and scaled by 2 tau, as in the paper's code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import PresetMixin, check_views, in_batch_metrics, unit
from contrastive.nn import MomentumEncoder, build_head, convert_to_sync_bn, resolve_encoder
from contrastive.nn.distributed import gather, rank

__all__ = ["MoCoV3"]


class MoCoV3(PresetMixin, nn.Module):
    """MoCo v3 for ResNets and ViTs.

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: output dimension (256).
        mlp_hidden: hidden width of projector and predictor (4096).
        temperature: tau; None = the paper's (0.2 for ViT, 1.0 for ResNet).
        momentum: m0, the EMA coefficient used when ``forward`` gets no ``momentum`` (0.99).
            The paper anneals it to 1 with :func:`contrastive.nn.cosine_momentum`
            (``momentum_schedule = "cosine"``): the engine passes the value per step.
        vit: heads of the ViT variant (3-layer projector, BN at the predictor output); None =
            auto (the encoder has a ``patch_embed``).
        freeze_patch_embed: the paper's "random patch projection" for ViTs (no gradient to the
            patch embedding, ``--stop-grad-conv1``).
        sync_bn: convert every BN (backbone and heads) to SyncBatchNorm, as the paper's code
            does (GPU only).
        loss: registry name, called as ``loss(q, k_all, positive_offset=N * rank)``.
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    uses_in_batch_negatives = True
    momentum_schedule = "cosine"
    presets: dict[str, dict[str, Any]] = {
        # Paper + CONFIG.md: ResNet-50, tau 1.0, 2-layer projector 2048-4096-256 (the code),
        # predictor 256-4096-256, m0 0.99 (0.996 for 1000 epochs), LARS lr 0.3 x bs/256.
        "resnet50": dict(
            encoder="torchvision:resnet50",
            dim=256,
            mlp_hidden=4096,
            temperature=1.0,
            momentum=0.99,
            vit=False,
        ),
        "resnet50_1000ep": dict(
            encoder="torchvision:resnet50",
            dim=256,
            mlp_hidden=4096,
            temperature=1.0,
            momentum=0.996,
            vit=False,
        ),
        # ViT-S/B: tau 0.2, 3-layer projector, frozen random patch projection, AdamW.
        "vit_small": dict(
            encoder="timm:vit_small_patch16_224",
            dim=256,
            mlp_hidden=4096,
            temperature=0.2,
            momentum=0.99,
            vit=True,
            freeze_patch_embed=True,
        ),
        "vit_base": dict(
            encoder="timm:vit_base_patch16_224",
            dim=256,
            mlp_hidden=4096,
            temperature=0.2,
            momentum=0.99,
            vit=True,
            freeze_patch_embed=True,
        ),
    }

    def __init__(
        self,
        encoder: str | nn.Module = "cifar_resnet18",
        dim: int = 256,
        mlp_hidden: int = 4096,
        temperature: float | None = None,
        momentum: float = 0.99,
        vit: bool | None = None,
        freeze_patch_embed: bool = False,
        sync_bn: bool = False,
        loss: str = "infonce",
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"MoCoV3: momentum must be in [0, 1], got {momentum}")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.vit = hasattr(self.encoder, "patch_embed") if vit is None else vit
        self.temperature = temperature if temperature is not None else (0.2 if self.vit else 1.0)
        self.momentum = momentum
        if freeze_patch_embed:
            patch = getattr(self.encoder, "patch_embed", None)
            if patch is None:
                raise ValueError(
                    "MoCoV3: freeze_patch_embed=True needs an encoder with patch_embed"
                )
            for p in patch.parameters():
                p.requires_grad_(False)

        suffix = "_vit" if self.vit else ""
        nf = self.encoder.num_features
        self.projector = build_head("mocov3_projector" + suffix, nf, mlp_hidden, dim)
        self.predictor = build_head("mocov3_predictor" + suffix, dim, mlp_hidden, dim)
        if sync_bn:
            self.encoder = convert_to_sync_bn(self.encoder)
            self.projector = convert_to_sync_bn(self.projector)
            self.predictor = convert_to_sync_bn(self.predictor)
        self.key_net = MomentumEncoder(nn.Sequential(self.encoder, self.projector))
        self.criterion = get_loss(loss, temperature=self.temperature, normalize=False)

    def forward(self, views: Sequence[Tensor], momentum: float | None = None) -> dict[str, Tensor]:
        x1, x2 = check_views(views, "MoCoV3")
        m = self.momentum if momentum is None else momentum
        q1 = unit(self.predictor(self.projector(self.encoder(x1))))
        q2 = unit(self.predictor(self.projector(self.encoder(x2))))
        with torch.no_grad():
            self.key_net.update([*self.encoder.parameters(), *self.projector.parameters()], m)
            k1_all = gather(unit(self.key_net(x1)))  # (N * world_size) x D
            k2_all = gather(unit(self.key_net(x2)))

        n = q1.shape[0]
        offset = n * rank()
        scale = 2.0 * self.temperature
        loss = scale * (
            self.criterion(q1, k2_all, positive_offset=offset)
            + self.criterion(q2, k1_all, positive_offset=offset)
        )
        pos_col = torch.arange(n, device=q1.device) + offset
        m12 = in_batch_metrics(q1, k2_all, pos_col)
        m21 = in_batch_metrics(q2, k1_all, pos_col)
        metrics = {name: (v + m21[name]) / 2 for name, v in m12.items()}
        return {"loss": loss, **metrics, "embeddings": q1.detach()}
