"""MoCo v1 / v2: momentum contrast with a queue of negative keys.

He et al., "Momentum Contrast for Unsupervised Visual Representation Learning", CVPR 2020;
Chen et al., "Improved Baselines with Momentum Contrastive Learning" (MoCo v2), 2020.

One step (paper Algorithm 1)::

    q = normalize(head(encoder(x_q)))                      # N x D, with gradient
    key_net <- m * key_net + (1 - m) * (encoder, head)      # EMA, parameters only
    k = normalize(key_net(shuffle(x_k))), unshuffled         # N x D, no gradient (shuffle BN)
    loss = infonce(q, k, negatives=queue, temperature=tau)   # logits N x (1 + K), target 0
    queue.enqueue(k of all processes)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import queue_metrics, unit, width
from contrastive.methods.base import Method, Schedule, read, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import (
    KeyQueue,
    MomentumEncoder,
    build_head,
    constant_momentum,
    convert_to_split_bn,
    resolve_encoder,
)
from contrastive.nn.distributed import batch_shuffle, batch_unshuffle, world_size

__all__ = ["MoCo"]


@register_method("moco")
class MoCo(Method):
    """MoCo v1 (linear head, tau 0.07) and v2 (2-layer MLP head, tau 0.2).

    Args:
        encoder: backbone name for :func:`contrastive.nn.create_encoder`, or a module with
            ``num_features``. Available as ``self.encoder`` (the query backbone, no head).
        version: 1 (``Linear(F, dim)`` head) or 2 (``Linear(F, mlp_hidden)-ReLU-Linear``).
        dim: output (key) dimension D (128 in both papers).
        queue_size: number of negative keys K (65536).
        momentum: EMA coefficient m of the key encoder (0.999): the parameter of the constant
            ``"momentum"`` schedule; ``forward`` uses ``batch["momentum"]``.
        temperature: tau; None = the paper's (0.07 for v1, 0.2 for v2).
        symmetric: the MoCo CIFAR demo's symmetric loss ``L(q1, k2) + L(q2, k1)`` (a sum),
            enqueueing both key batches.
        mlp_hidden: hidden width of the v2 head (2048 = ResNet-50's feature width in the paper).
        split_bn: > 1 replaces the BN layers of both encoders by split BN with that many groups
            (the CIFAR demo's single-GPU emulation of shuffle BN; 8 there).
        shuffle_bn: shuffle the key batch across processes before the key encoder (no-op in
            one process unless ``split_bn`` > 1, where the batch is permuted locally).
        loss: registry name of the loss, called as ``loss(q, k, queue)``.
        queue_labels: also store each key's data-set index beside it (``batch["indices"]``
            becomes a need).
        encoder_kwargs: keyword arguments for ``create_encoder``.

    ``forward(batch)`` reads ``batch["views"] = [x_q, x_k]``, ``batch["momentum"]`` (and
    ``batch["indices"]`` with ``queue_labels``); returns ``loss``, ``pos_acc``, ``pos_sim``,
    ``neg_sim`` and ``embeddings`` (detached unit q, (N, D)).
    """

    uses_in_batch_negatives = False
    # He et al. 2020: ResNet-50, K 65536, m 0.999, tau 0.07, 128-d linear head.
    _V1: ClassVar[dict[str, Any]] = dict(encoder="torchvision:resnet50", version=1, dim=128,
                                         queue_size=65536, momentum=0.999, temperature=0.07)
    # MoCo CIFAR-10 demo: ResNet-18 (CIFAR stem), linear 512->128, K 4096, m 0.99, tau 0.1,
    # split BN 8.
    _CIFAR: ClassVar[dict[str, Any]] = {**_V1, "encoder": "cifar_resnet18", "queue_size": 4096,
                                        "momentum": 0.99, "temperature": 0.1, "split_bn": 8}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "v1": _V1,
        # Chen et al. 2020: 2048-2048-128 MLP head, tau 0.2.
        "v2": {**_V1, "version": 2, "temperature": 0.2, "mlp_hidden": 2048},
        "cifar": _CIFAR,
        "cifar_symmetric": {**_CIFAR, "symmetric": True},
    }

    def __init__(
        self,
        encoder: str | nn.Module = "cifar_resnet18",
        version: int = 2,
        dim: int = 128,
        queue_size: int = 65536,
        momentum: float = 0.999,
        temperature: float | None = None,
        symmetric: bool = False,
        mlp_hidden: int = 2048,
        split_bn: int = 0,
        shuffle_bn: bool = True,
        loss: str = "infonce",
        queue_labels: bool = False,
        encoder_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if version not in (1, 2):
            raise ValueError(f"MoCo: version must be 1 or 2, got {version!r}")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"MoCo: momentum must be in [0, 1], got {momentum}")
        self.version, self.symmetric, self.base_momentum = version, symmetric, momentum
        self.needs = ("views", "indices") if queue_labels else ("views",)
        self.temperature = (
            temperature if temperature is not None else (0.07 if version == 1 else 0.2)
        )
        self.split_bn, self.shuffle_bn = split_bn, shuffle_bn

        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        self.encoder = convert_to_split_bn(self.encoder, split_bn)
        kind = "linear" if version == 1 else "mocov2"
        self.head = build_head(kind, width(self.encoder), mlp_hidden, dim)
        self.key_net = MomentumEncoder(nn.Sequential(self.encoder, self.head))
        self.queue = KeyQueue(
            dim, queue_size, store_labels=queue_labels, normalize=False
        )  # k is unit
        self.criterion = get_loss(loss, temperature=self.temperature, normalize=False)

    def schedules(self) -> dict[str, Schedule]:
        """``momentum``: constant ``m`` (MoCo v1/v2)."""
        return {"momentum": functools.partial(constant_momentum, m0=self.base_momentum)}

    def _query_params(self) -> list[Tensor]:
        return [*self.encoder.parameters(), *self.head.parameters()]

    def _key_rows(self, x: Tensor) -> Tensor:
        """The key network's rows for ``x``: unit keys (N, D)."""
        return unit(self.key_net(x))

    @torch.no_grad()
    def _keys(self, x: Tensor) -> Tensor:
        """:meth:`_key_rows` of ``x`` with shuffle BN (across processes) or a local permutation
        (one process with split BN), order restored."""
        if self.shuffle_bn and world_size() > 1:
            xs, idx_unshuffle = batch_shuffle(x)
            return batch_unshuffle(self._key_rows(xs), idx_unshuffle)
        if self.shuffle_bn and self.split_bn > 1:
            perm = torch.randperm(x.shape[0], device=x.device)
            return self._key_rows(x[perm])[torch.argsort(perm)]
        return self._key_rows(x)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x1, x2 = views_of(batch, "MoCo", n=2)
        if x1.shape != x2.shape:
            raise ValueError(f"MoCo: both views must have the same shape (N, C, H, W), got "
                             f"{tuple(x1.shape)} and {tuple(x2.shape)}")
        m = read(batch, "momentum", "MoCo")
        labels = read(batch, "indices", "MoCo") if self.queue.store_labels else None
        q1 = unit(self.head(self.encoder(x1)))
        q2 = unit(self.head(self.encoder(x2))) if self.symmetric else None
        with torch.no_grad():
            self.key_net.update(self._query_params(), m)
            k2 = self._keys(x2)
            k1 = self._keys(x1) if self.symmetric else None

        queue = self.queue.keys  # K x D, the buffer itself (see KeyQueue: no copy needed)
        loss = self.criterion(q1, k2, queue)
        metrics = queue_metrics(q1, k2, queue)
        if self.symmetric:
            loss = loss + self.criterion(q2, k1, queue)
            other = queue_metrics(q2, k1, queue)
            metrics = {name: (v + other[name]) / 2 for name, v in metrics.items()}

        keys = k2 if k1 is None else torch.cat([k1, k2])  # k1 is None unless symmetric
        if labels is not None and self.symmetric:
            labels = torch.cat([labels, labels])
        self.queue.enqueue(keys, labels)
        return {"loss": loss, **metrics, "embeddings": q1.detach()}
