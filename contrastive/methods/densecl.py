"""DenseCL: MoCo v2 plus a dense contrastive loss between corresponding feature-map locations.

Wang, Zhang, Shen, Kong, Li, "Dense Contrastive Learning for Self-Supervised Visual
Pre-Training", CVPR 2021 (arXiv 2011.09157); the authors' code is WXinlong/DenseCL
(``openselfsup/models/densecl.py``: ``DenseCL``; ``openselfsup/models/necks.py``:
``DenseCLNeck``; ``configs/selfsup/densecl/densecl_imagenet_200ep.py``).

One step (``forward_train`` of the code)::

    F_q = backbone(x_q)  (N, C, S, S), the last stage's map      F_k the same by the key network
    q  = unit(mlp(avgpool(F_q)))                      # global, MoCo v2's head
    Q  = unit(conv1x1-ReLU-conv1x1(F_q))  (N, S^2, D) # dense head, one vector per location
    K2 = unit(mean over locations of the key's dense head output)   (N, D), the dense queue's key
    match = argmax_t cos(F_q[s], F_k[t])              # correspondence on BACKBONE features
    loss = (1 - lambda) * infonce(q, k, queue) + lambda * dense_infonce(Q, K, match, queue2)
    queue <- k;  queue2 <- K2

The code's ImageNet setting (``densecl_imagenet_200ep.py``): ResNet-50, ``num_grid=None`` (the
dense head runs on ResNet-50's own 7 x 7 map at 224 px; the paper's "S x S", S = 7), 128-d
outputs, 2048 hidden, queues of 65536, key momentum 0.999, lambda 0.5, temperature 0.2
(``ContrastiveHead``). ``grid`` > 0 pools the map to grid x grid first (the code's
``num_grid``); the correspondence is then computed on the pooled map, of the same size (the
code matches on the unpooled map, which only fits its ``num_grid=None``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.losses.dense import dense_correspondence
from contrastive.methods._common import queue_metrics, unit, width
from contrastive.methods.base import read, views_of
from contrastive.methods.moco import MoCo
from contrastive.methods.registry import register_method
from contrastive.nn import KeyQueue, MomentumEncoder, stage_features

__all__ = ["DenseCL"]


@register_method("densecl")
class DenseCL(MoCo):
    """DenseCL: MoCo v2's global loss and queue, plus a dense head, a dense queue and their loss.

    Args:
        encoder: backbone name or module with ``num_features``; its last stage
            (:func:`contrastive.nn.stage_features`) is the feature map.
        dim, queue_size, momentum, mlp_hidden, split_bn, shuffle_bn, encoder_kwargs: as
            :class:`MoCo` (version 2); both queues have ``queue_size`` keys.
        temperature: tau of both losses (0.2).
        dense_weight: lambda, the dense loss's share: ``(1 - lambda) * global + lambda * dense``
            (0.5; 0 is MoCo v2 with an idle dense head, the negative control).
        grid: > 0 pools the feature map to grid x grid before the dense head (the code's
            ``num_grid``); 0 = the map as it is (the code's ImageNet setting).

    ``forward(batch)`` reads ``batch["views"] = [x_q, x_k]`` and ``batch["momentum"]``; returns
    ``loss``, ``loss_global``, ``loss_dense``, ``pos_acc``, ``pos_sim``, ``neg_sim`` (global)
    and ``embeddings`` (detached unit global q, (N, D)).
    """

    #: the loss reads the backbone's last feature map (not its pooled output), so gradient
    #: caching has nothing to cache
    backbones = ()
    #: why the engine refuses --grad-accum-steps (see contrastive.engine.grad_cache)
    no_accumulation = ("each micro-batch would update the key encoder and both queues, and the "
                       "dense loss reads feature maps that cannot be cached: another experiment")
    # the code's densecl_imagenet_200ep.py (see the module docstring)
    _R50: ClassVar[dict[str, Any]] = dict(encoder="torchvision:resnet50", dim=128,
                                          mlp_hidden=2048, queue_size=65536, momentum=0.999,
                                          temperature=0.2, dense_weight=0.5, grid=0)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "r50": _R50,
        # ours (the authors give no CIFAR setting): the MoCo CIFAR demo's ResNet-18, queue,
        # momentum and split BN (MoCo.presets["cifar"]), DenseCL's head shape, tau and lambda;
        # 32 px gives a 4 x 4 map
        "cifar": {**_R50, "encoder": "cifar_resnet18", "mlp_hidden": 512, "queue_size": 4096,
                  "momentum": 0.99, "split_bn": 8},
    }

    def __init__(
        self,
        encoder: str | nn.Module = "cifar_resnet18",
        dim: int = 128,
        queue_size: int = 65536,
        momentum: float = 0.999,
        temperature: float = 0.2,
        dense_weight: float = 0.5,
        grid: int = 0,
        mlp_hidden: int = 2048,
        split_bn: int = 0,
        shuffle_bn: bool = True,
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not 0.0 <= dense_weight <= 1.0:
            raise ValueError(f"DenseCL: dense_weight must be in [0, 1] (the paper: 0.5), got "
                             f"{dense_weight}")
        if grid < 0:
            raise ValueError(f"DenseCL: grid must be >= 0 (0 = the map as it is), got {grid}")
        super().__init__(encoder, version=2, dim=dim, queue_size=queue_size, momentum=momentum,
                         temperature=temperature, mlp_hidden=mlp_hidden, split_bn=split_bn,
                         shuffle_bn=shuffle_bn, encoder_kwargs=encoder_kwargs)
        self.dense_weight, self.grid, self.dim = dense_weight, grid, dim
        channels = width(self.encoder)
        self.dense_head = nn.Sequential(nn.Conv2d(channels, mlp_hidden, 1), nn.ReLU(),
                                        nn.Conv2d(mlp_hidden, dim, 1))
        self.key_net = MomentumEncoder(nn.ModuleList([self.encoder, self.head, self.dense_head]))
        self.dense_queue = KeyQueue(dim, queue_size, normalize=False)  # its keys are unit
        self.dense_criterion = get_loss("densecl", temperature=self.temperature, normalize=False)

    def _query_params(self) -> list[Tensor]:
        return [*super()._query_params(), *self.dense_head.parameters()]

    def _outputs(self, parts: Any, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(global (N, D), dense (N, S, D), backbone features (N, S, C)), none normalised, of
        ``parts`` = (encoder, head, dense head): the query's or the key network's copy."""
        encoder, head, dense_head = parts
        fmap = stage_features(encoder, x)[-1]
        if fmap.dim() != 4:
            raise ValueError(f"DenseCL: the encoder's last stage must be a feature map "
                             f"(N, C, H, W), got shape {tuple(fmap.shape)}")
        g = head(fmap.mean(dim=(2, 3)))
        if self.grid:
            fmap = F.adaptive_avg_pool2d(fmap, self.grid)
        dense = dense_head(fmap).flatten(2).transpose(1, 2)
        return g, dense, fmap.flatten(2).transpose(1, 2)

    def _key_rows(self, x: Tensor) -> Tensor:
        """One row per image: unit k (D), unit pooled dense key (D), unit dense keys (S * D),
        unit backbone features (S * C), packed so that shuffle BN moves them together."""
        g, dense, feats = self._outputs(self.key_net.module, x)
        n = x.shape[0]
        return torch.cat([unit(g), unit(dense.mean(dim=1)), unit(dense.flatten(0, 1)).view(n, -1),
                          unit(feats.flatten(0, 1)).view(n, -1)], dim=1)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x1, x2 = views_of(batch, "DenseCL", n=2)
        if x1.shape != x2.shape:
            raise ValueError(f"DenseCL: both views must have the same shape (N, C, H, W), got "
                             f"{tuple(x1.shape)} and {tuple(x2.shape)}")
        m = read(batch, "momentum", "DenseCL")
        g, dense, feats = self._outputs([self.encoder, self.head, self.dense_head], x1)
        n, s, c = feats.shape
        q, q_dense = unit(g), unit(dense.flatten(0, 1)).view(n, s, self.dim)
        with torch.no_grad():
            self.key_net.update(self._query_params(), m)
            k, k_pooled, k_dense, k_feats = self._keys(x2).split(
                [self.dim, self.dim, s * self.dim, s * c], dim=1)
        k_dense, k_feats = k_dense.view(n, s, self.dim), k_feats.view(n, s, c)
        match = dense_correspondence(feats, k_feats)

        queue = self.queue.keys
        loss_global = self.criterion(q, k, queue)
        loss_dense = self.dense_criterion(q_dense, k_dense, match, self.dense_queue.keys)
        loss = (1 - self.dense_weight) * loss_global + self.dense_weight * loss_dense
        metrics = queue_metrics(q, k, queue)
        self.queue.enqueue(k)
        self.dense_queue.enqueue(k_pooled)
        return {"loss": loss, "loss_global": loss_global.detach(),
                "loss_dense": loss_dense.detach(), **metrics, "embeddings": q.detach()}
