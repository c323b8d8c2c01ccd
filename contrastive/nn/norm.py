"""Batch-norm variants for contrastive training: split BN (one process) and SyncBN (many).

Why: with BN, a query and its positive key that see the same batch statistics can "cheat"
(MoCo, He et al. 2020, sec. 3.3: the network finds a low-loss shortcut through the batch
statistics). Across processes MoCo uses shuffle BN (:mod:`contrastive.nn.distributed`). On one
process the MoCo CIFAR-10 demo emulates it with split BN: the batch is cut into ``num_splits``
groups that are normalised independently, as if each group ran on its own GPU.

Both memory formats take one ``F.batch_norm`` over the groups side by side as channels: an NCHW
batch as (N/s, s*C, H, W) in NCHW (a free view), a channels_last batch as (N/s, s*C, H, W) in
channels_last (two copies that move whole C-channel rows), so a channels_last network never
leaves its layout at its split BN layers.
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

    Shape: (N, C, H, W) -> (N, C, H, W) in the input's memory format (NCHW or channels_last);
    N must be divisible by ``num_splits``.
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
        channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        if channels_last:
            groups = _groups_channels_last(x, s)
        else:
            groups = x.contiguous().view(n // s, c * s, h, w)
        weight = self.weight.repeat(s) if self.weight is not None else None
        bias = self.bias.repeat(s) if self.bias is not None else None
        if not self.track_running_stats:
            y = F.batch_norm(groups, None, None, weight, bias, True, momentum, self.eps)
            return _ungroup_channels_last(y, s) if channels_last else y.view(n, c, h, w)
        # BatchNorm registers these buffers exactly when track_running_stats is set
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        mean, var = self.running_mean.repeat(s), self.running_var.repeat(s)
        y = F.batch_norm(groups, mean, var, weight, bias, True, momentum, self.eps)
        with torch.no_grad():
            self.running_mean.copy_(mean.view(s, c).mean(0))
            self.running_var.copy_(var.view(s, c).mean(0))
        return _ungroup_channels_last(y, s) if channels_last else y.view(n, c, h, w)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_splits={self.num_splits}"


def _groups_channels_last(x: Tensor, s: int) -> Tensor:
    """(N, C, H, W) channels_last -> (N/s, s*C, H, W) channels_last, channel g*C + c = channel c
    of the samples n with n % s == g: the NCHW path's grouping, in the other layout.

    channels_last memory is (N, H, W, C); with n = n' * s + g it is (N/s, s, H*W, C), and the
    groups side by side as channels need (N/s, H*W, s, C): one copy that moves whole rows of C
    values, then the native channels_last batch norm (cuDNN's on a GPU, any dtype under
    autocast). Why not statistics per group with no copy at all (sums over the (N/s, s, H*W, C)
    view, broadcast normalisation, a closed-form backward)? Tried: same speed on the CPU,
    slower on a GPU, where its many elementwise kernels cost more than two copies
    (figures in ``benchmarks/bench_split_bn.py``).
    """
    n, c, h, w = x.shape
    rows = x.permute(0, 2, 3, 1).reshape(n // s, s, h * w, c)  # a view of the memory
    return rows.transpose(1, 2).contiguous().view(n // s, h, w, s * c).permute(0, 3, 1, 2)


def _ungroup_channels_last(y: Tensor, s: int) -> Tensor:
    """The inverse of :func:`_groups_channels_last`: (N/s, s*C, H, W) -> (N, C, H, W), both
    channels_last (``reshape``: a view when ``F.batch_norm`` kept the layout, as it does)."""
    q, sc, h, w = y.shape
    c = sc // s
    rows = y.permute(0, 2, 3, 1).reshape(q, h * w, s, c).transpose(1, 2).contiguous()
    return rows.view(q * s, h, w, c).permute(0, 3, 1, 2)  # (N, C, H, W) channels_last


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
