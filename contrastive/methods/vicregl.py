"""VICRegL: VICReg on pooled embeddings plus VICReg on matched feature-map vectors.

Bardes, Ponce, LeCun, "VICRegL: Self-Supervised Learning of Local Visual Features", NeurIPS
2022 (arXiv 2210.01571); the authors' code is facebookresearch/VICRegL (``main_vicregl.py``,
``utils.py``, ``transforms.py``; line numbers of commit 803ae4c).

One step (the code's ``VICRegL.forward``, main_vicregl.py 503-537)::

    F_v = backbone(x_v)                   (N, C, H, W) the last stage's map, per view v
    z_v = expander(avgpool(F_v))          (N, D)       the global embedding
    m_v = maps_expander(F_v per location) (N, HW, D')  one local embedding per location
    g_v = crop_grid(box_v)                (N, HW, 2)   where each location sits in the image
    global = VICReg terms of z (MSE over pairs (i < 2, j != i); var, cov averaged over views)
    local  = mean over those pairs of vicregl_local(m_i, m_j, matches by location g_i <-> g_j
             (keep 20 / 4), matches by L2 in embedding space (all))
    loss   = alpha * global + (1 - alpha) * local          alpha 0.75 (the code's --alpha)

Crop boxes: the views' boxes in the original image come from the pipeline
(``Pipeline(crop_boxes=True)``, ``batch["crop_boxes"]`` (N, V, 4)). A horizontal flip is not
reflected in the grid, as the code's default ``--no-flip-grid 1`` (main_vicregl.py 44,
transforms.py 327-330). Every term is a statistic of the GLOBAL batch: embeddings, maps and
grids are gathered (with gradient) before the loss, as VICReg's; every process computes the
whole batch's loss. The code's online linear classifier on the detached representation is the
engine's ``--online-probe``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.losses.decorrelation import crop_grid, location_matches, vicregl_global_terms
from contrastive.methods._common import unit, width
from contrastive.methods.base import read, views_of
from contrastive.methods.registry import register_method
from contrastive.methods.vicreg import VICReg
from contrastive.nn import build_mlp, stage_features
from contrastive.nn.distributed import gather, gather_with_grad, world_size

__all__ = ["VICRegL"]


@register_method("vicregl")
class VICRegL(VICReg):
    """VICRegL for any backbone with a last-stage feature map.

    Args:
        encoder, dim, mlp_hidden, proj_layers, encoder_kwargs: as :class:`VICReg` (the global
            expander; the code's ``--mlp 8192-8192-8192``).
        maps_dim, maps_hidden, maps_layers: the local expander applied to every location (the
            code's ``--maps-mlp 512-512-512``: 3 Linear, BN + ReLU between).
        alpha: the global loss's share (0.75, the code's ``--alpha``); 1 = VICReg on the pooled
            map with no local loss (the negative control).
        num_matches: location matches kept (view i -> j, j -> i) (20, 4), the code's
            ``--num_matches``.
        feature_top: feature matches kept each way; None = all (the code's default
            ``--l2_all_matches 1``).
        inv_coeff, var_coeff, cov_coeff: lambda, mu, nu of both losses (25, 25, 1).
    """

    needs = ("views", "crop_boxes")
    couples_samples = True  # variance and covariance are batch statistics
    #: the local loss reads the backbone's feature map (not its pooled output): no caching
    backbones = ()
    _R50: ClassVar[dict[str, Any]] = dict(
        encoder="torchvision:resnet50", dim=8192, mlp_hidden=8192, maps_dim=512,
        maps_hidden=512, alpha=0.75, num_matches=(20, 4))
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "resnet50": _R50,
        # ours (the authors give no CIFAR setting): VICReg's CIFAR expander (solo-learn), the
        # code's local expander and alpha; ResNet-18's 4 x 4 map at 32 px keeps the code's
        # fractions of a 7 x 7 map (20 / 49, 4 / 49) of its 16 locations, rounded up
        "cifar": {**_R50, "encoder": "cifar_resnet18", "dim": 2048, "mlp_hidden": 2048,
                  "num_matches": (7, 2)},
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 8192,
                 mlp_hidden: int = 8192, proj_layers: int = 3, maps_dim: int = 512,
                 maps_hidden: int = 512, maps_layers: int = 3, alpha: float = 0.75,
                 num_matches: tuple[int, int] = (20, 4),
                 feature_top: tuple[int, int] | None = None, inv_coeff: float = 25.0,
                 var_coeff: float = 25.0, cov_coeff: float = 1.0,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"VICRegL: alpha must be in (0, 1] (the code: 0.75; 1 = no local "
                             f"loss), got {alpha}")
        if len(num_matches) != 2 or min(num_matches) < 1:
            raise ValueError(f"VICRegL: num_matches must be two positive ints (the code: 20 4), "
                             f"got {num_matches}")
        super().__init__(encoder, dim=dim, mlp_hidden=mlp_hidden, proj_layers=proj_layers,
                         sim_coeff=inv_coeff, std_coeff=var_coeff, cov_coeff=cov_coeff,
                         encoder_kwargs=encoder_kwargs)
        self.alpha, self.num_matches = float(alpha), (int(num_matches[0]), int(num_matches[1]))
        self.coeffs = (float(inv_coeff), float(var_coeff), float(cov_coeff))
        self.maps_projector: nn.Module | None = None
        if alpha < 1:
            self.maps_projector = build_mlp(width(self.encoder), maps_hidden, maps_dim,
                                            maps_layers)
        self.criterion = get_loss("vicregl_local", inv_coeff=inv_coeff, var_coeff=var_coeff,
                                  cov_coeff=cov_coeff, feature_top=feature_top)

    def _feature_map(self, x: Tensor) -> Tensor:
        """The encoder's last stage (N, C, H, W)."""
        fmap = stage_features(self.encoder, x)[-1]
        if fmap.dim() != 4:
            raise ValueError(f"VICRegL: the encoder's last stage must be a feature map "
                             f"(N, C, H, W), got shape {tuple(fmap.shape)}")
        return fmap

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "VICRegL", min_n=2)
        fmaps = [self._feature_map(x) for x in views]
        zs = [self.projector(f.mean(dim=(2, 3))) for f in fmaps]  # V x (N, D)
        first = zs[0]
        local = self._local_loss(fmaps, batch)
        if world_size() > 1:  # the global batch, as VICReg
            zs = [gather_with_grad(z) for z in zs]
        inv, var, cov = vicregl_global_terms(zs)
        lam, mu, nu = self.coeffs
        loss_global = lam * inv + mu * var + nu * cov
        loss, out = loss_global, {}
        if local is not None:
            loss = self.alpha * loss_global + (1 - self.alpha) * local
            out["loss_local"] = local.detach()
        return {"loss": loss, "loss_global": loss_global.detach(), **out,
                "invariance": inv.detach(), "variance": var.detach(),
                "covariance": cov.detach(), "embeddings": unit(first).detach()}

    def _local_loss(self, fmaps: list[Tensor], batch: Mapping[str, Any]) -> Tensor | None:
        """The local loss averaged over the view pairs (i < 2, j != i); None when alpha = 1."""
        if self.maps_projector is None:
            return None
        boxes = read(batch, "crop_boxes", "VICRegL")
        if boxes.dim() != 3 or boxes.shape[1] != len(fmaps) or boxes.shape[2] != 4:
            raise ValueError(f"VICRegL: batch['crop_boxes'] must be (N, {len(fmaps)}, 4), one "
                             f"box per view, got {tuple(boxes.shape)}")
        maps, grids = [], []
        for v, f in enumerate(fmaps):
            n, _, h, w = f.shape
            # the first two views are matched from with num_matches[0] (and to with [1])
            if (max(self.num_matches) if v < 2 else self.num_matches[1]) > h * w:
                raise ValueError(f"VICRegL: num_matches {self.num_matches} exceed the {h * w} "
                                 f"locations of view {v}'s {h} x {w} feature map: lower "
                                 f"--num-matches (or use larger views)")
            maps.append(self.maps_projector(f.flatten(2).transpose(1, 2).flatten(0, 1))
                        .view(n, h * w, -1))  # N x HW x D'
            grids.append(crop_grid(boxes[:, v].to(torch.float32), h, w))  # N x HW x 2
        if world_size() > 1:
            maps, grids = [gather_with_grad(m) for m in maps], [gather(g) for g in grids]
        pairs = [(i, j) for i in range(2) for j in range(len(fmaps)) if j != i]
        k_ij, k_ji = self.num_matches
        return torch.stack([self.criterion(maps[i], maps[j],
                                           location_matches(grids[i], grids[j], k_ij),
                                           location_matches(grids[j], grids[i], k_ji))
                            for i, j in pairs]).mean()
