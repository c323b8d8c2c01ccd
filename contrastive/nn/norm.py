"""Batch-norm variants for contrastive training: split BN (one process) and SyncBN (many).

Why: with BN, a query and its positive key that see the same batch statistics can "cheat"
(MoCo, He et al. 2020, sec. 3.3: the network finds a low-loss shortcut through the batch
statistics). Across processes MoCo uses shuffle BN (:mod:`contrastive.nn.distributed`). On one
process the MoCo CIFAR-10 demo emulates it with split BN: the batch is cut into ``num_splits``
groups that are normalised independently, as if each group ran on its own GPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["SplitBatchNorm2d", "convert_to_split_bn", "convert_to_sync_bn"]


class SplitBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are computed per group of the batch.

    In training mode the N samples are cut into ``num_splits`` groups, sample n going to group
    ``n % num_splits`` (a free reshape, no copy), and each group is normalised with its own mean
    and variance: ``y = (x - mean_g) / sqrt(var_g + eps) * weight + bias``. The running
    statistics are the mean over groups of the per-group running statistics. In eval mode it
    is a plain BatchNorm2d (same parameters and buffers, so state dicts are interchangeable).

    Shape: (N, C, H, W) -> (N, C, H, W); N must be divisible by ``num_splits``.
    """

    def __init__(self, num_features: int, num_splits: int, **kwargs: Any) -> None:
        super().__init__(num_features, **kwargs)
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        if self.momentum is None:
            raise ValueError("SplitBatchNorm2d needs a float momentum (got momentum=None)")
        self.num_splits = num_splits

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.num_splits == 1:
            return super().forward(x)
        n, c, h, w = x.shape
        s = self.num_splits
        if n % s:
            raise ValueError(
                f"SplitBatchNorm2d: batch size {n} is not divisible by num_splits={s}; "
                "use a batch size that is a multiple of num_splits (drop_last=True)"
            )
        momentum = self.momentum
        if momentum is None:  # checked in __init__, unless set to None since
            raise ValueError("SplitBatchNorm2d needs a float momentum (got momentum=None)")
        groups = x.contiguous().view(n // s, c * s, h, w)
        weight = self.weight.repeat(s) if self.weight is not None else None
        bias = self.bias.repeat(s) if self.bias is not None else None
        if not self.track_running_stats:
            y = F.batch_norm(groups, None, None, weight, bias, True, momentum, self.eps)
            return y.view(n, c, h, w)
        # BatchNorm registers these buffers exactly when track_running_stats is set
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        mean, var = self.running_mean.repeat(s), self.running_var.repeat(s)
        y = F.batch_norm(groups, mean, var, weight, bias, True, momentum, self.eps)
        with torch.no_grad():
            self.running_mean.copy_(mean.view(s, c).mean(0))
            self.running_var.copy_(var.view(s, c).mean(0))
        return y.view(n, c, h, w)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_splits={self.num_splits}"


def convert_to_split_bn(module: nn.Module, num_splits: int) -> nn.Module:
    """Replace every ``nn.BatchNorm2d`` in ``module`` by a :class:`SplitBatchNorm2d`.

    Parameters and running statistics are carried over. Returns the converted module (the same
    object unless ``module`` itself is a BatchNorm2d). ``num_splits`` <= 1 returns it unchanged.
    """
    if num_splits <= 1:
        return module
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, SplitBatchNorm2d):
        new = SplitBatchNorm2d(
            module.num_features,
            num_splits,
            eps=module.eps,
            momentum=module.momentum if module.momentum is not None else 0.1,
            affine=module.affine,
            track_running_stats=module.track_running_stats,
        )
        new.load_state_dict(module.state_dict())
        return new.to(device=_device_of(module))
    for name, child in module.named_children():
        new_child = convert_to_split_bn(child, num_splits)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


def convert_to_sync_bn(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm by ``torch.nn.SyncBatchNorm`` (statistics over all processes).

    A plain BN in one process or in eval mode. PyTorch's SyncBatchNorm only synchronises GPU
    (and XPU/HPU) tensors: on CPU with several processes its forward raises, so use shuffle BN
    there.
    """
    return nn.SyncBatchNorm.convert_sync_batchnorm(module)


def _device_of(module: nn.Module) -> torch.device:
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")
