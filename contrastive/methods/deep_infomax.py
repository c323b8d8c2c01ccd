"""Deep InfoMax (local): maximise the mutual information between an image's global feature and
its local feature-map locations.

Hjelm et al., "Learning deep representations by mutual information estimation and
maximization", ICLR 2019 (arXiv 1808.06670), Sec. 3.2; the authors' code is rdevon/DIM
(``cortex_DIM/models/dim.py``: ``LocalDIM``; ``nn_modules/mi_networks.py``).

One step (single view, no augmentation needed)::

    stages = stage_features(encoder, x);  L = stages[local_stage];  G = pool(stages[-1])
    l = mi_local(L)   (N, U, H, W)     g = mi_global(G as a 1 x 1 map)   (N, U)
    loss = dim(g_all, l_all)            # the registry's ``dim``: JSD (the code's default) or InfoNCE

``mi_local`` / ``mi_global`` are the code's ``MI1x1ConvNet``: ``Conv1x1-BN-ReLU-Conv1x1`` plus a
1x1 linear shortcut initialised near the identity, then LayerNorm over the U = 2048 units (the
code's ``mi_units``; ``models/dim.py``'s ``LocalDIM`` default, which we follow: the older
``scripts/deep_infomax.py`` used 1024 and an MLP for the global side). Negatives are the other
images of the GLOBAL batch (features gathered with gradient; every process computes the loss of
the whole batch). The global feature is the last stage: its spatial mean for a map (what our
CNN encoders return, checked in the tests), the vector itself for the paper's encoders
(``dcgan32``, ``dcgan64``, ``alexnet64``: the 64-d output; :mod:`contrastive.nn.dim_encoders`). Not included:
the prior-matching term (gamma, an adversarial discriminator) and global DIM (alpha), which the
paper reports as secondary for the local objective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods.base import Method, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import resolve_encoder, stage_features
from contrastive.nn.distributed import gather_with_grad, world_size

__all__ = ["DeepInfoMax", "MIConvNet"]


class MIConvNet(nn.Module):
    """The code's ``MI1x1ConvNet``: (N, C, H, W) -> (N, U, H, W)."""

    def __init__(self, in_channels: int, units: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(in_channels, units, 1, bias=False),
                                   nn.BatchNorm2d(units), nn.ReLU(), nn.Conv2d(units, units, 1))
        self.shortcut = nn.Conv2d(in_channels, units, 1, bias=False)
        self.norm = nn.LayerNorm(units)
        if units >= in_channels:  # near the identity, as the code initialises it
            with torch.no_grad():
                self.shortcut.weight.uniform_(-0.01, 0.01)
                idx = torch.arange(in_channels)
                self.shortcut.weight[idx, idx, 0, 0] = 1.0

    def forward(self, x: Tensor) -> Tensor:
        h = self.block(x) + self.shortcut(x)
        return self.norm(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@register_method("deep_infomax", "dim")
class DeepInfoMax(Method):
    """Local Deep InfoMax for CNN encoders (``stage_features`` must give their stages).

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        local_stage: which stage gives the local features; None (default): the encoder's own
            ``local_stage`` attribute where it has one (the code's ``local_task_idx``:
            ``dcgan32`` 1, ``dcgan64`` 2, ``alexnet64`` 2), else -2 (the stage before the last).
        mi_units: U (2048).
        estimator: ``"jsd"`` (the code's default, ``measure='JSD', mode='fd'``) or
            ``"infonce"`` (the paper's ``DIM(L)`` with NCE).
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs = ("views",)
    uses_in_batch_negatives = True  # the other images of the batch are the negatives
    backbones = ()  # the loss reads an intermediate stage, not only the output
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cifar": dict(encoder="dcgan32", mi_units=2048, estimator="infonce"),
        "stl10": dict(encoder="alexnet64", mi_units=2048, estimator="infonce"),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", local_stage: int | None = None,
                 mi_units: int = 2048, estimator: str = "jsd",
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        if local_stage is None:
            local_stage = int(getattr(self.encoder, "local_stage", -2))
        with torch.no_grad():
            was = self.encoder.training
            stages = stage_features(self.encoder.eval(), torch.zeros(2, 3, 32, 32))
            self.encoder.train(was)
        if not -len(stages) <= local_stage < len(stages) or stages[local_stage].dim() != 4:
            raise ValueError(f"DeepInfoMax: local_stage {local_stage} is not a feature map of "
                             f"this encoder ({len(stages)} stages)")
        self.local_stage = local_stage
        self.mi_local = MIConvNet(stages[local_stage].shape[1], mi_units)
        self.mi_global = MIConvNet(stages[-1].shape[1], mi_units)
        self.criterion = get_loss("dim", estimator=estimator)

    def features(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(local map (N, C_l, H, W), global feature (N, C)) of the encoder on ``x``."""
        stages = stage_features(self.encoder, x)
        last = stages[-1]
        return stages[self.local_stage], last.mean(dim=(2, 3)) if last.dim() == 4 else last

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        x = views_of(batch, "DeepInfoMax")[0]  # one view: the image itself suffices
        local, glob = self.features(x)
        lo = self.mi_local(local)  # N x U x H x W
        g = self.mi_global(glob[:, :, None, None]).flatten(1)  # N x U
        if world_size() > 1:
            lo, g = gather_with_grad(lo), gather_with_grad(g)
        loss = self.criterion(g, lo)
        return {"loss": loss, "embeddings": glob.detach()}
