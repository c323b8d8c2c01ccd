"""SplitBatchNorm2d equals per-group batch norm written by hand; conversion keeps weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from contrastive.nn import SplitBatchNorm2d, convert_to_split_bn, convert_to_sync_bn


def _manual_split_bn(x, weight, bias, splits, eps):
    """Group g = samples n with n % splits == g, each normalised with its own statistics."""
    out = torch.empty_like(x)
    means, vars_unbiased = [], []
    for g in range(splits):
        xs = x[g::splits]
        mean = xs.mean(dim=(0, 2, 3))
        var = xs.var(dim=(0, 2, 3), unbiased=False)
        y = (xs - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + eps)
        out[g::splits] = y * weight[None, :, None, None] + bias[None, :, None, None]
        means.append(mean)
        vars_unbiased.append(xs.var(dim=(0, 2, 3), unbiased=True))
    return out, torch.stack(means).mean(0), torch.stack(vars_unbiased).mean(0)


def test_split_bn_training_matches_manual_groups():
    torch.manual_seed(0)
    bn = SplitBatchNorm2d(3, num_splits=4, momentum=0.1)
    bn.weight.data.uniform_(0.5, 2.0)
    bn.bias.data.normal_()
    x = torch.randn(8, 3, 5, 5) * 3 + 1
    y = bn(x)
    ref, mean, var = _manual_split_bn(x, bn.weight.detach(), bn.bias.detach(), 4, bn.eps)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_mean, 0.1 * mean)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * var)
    assert int(bn.num_batches_tracked) == 1
    y.sum().backward()
    assert bn.weight.grad is not None


def test_split_bn_eval_is_plain_bn_and_errors():
    torch.manual_seed(0)
    bn = SplitBatchNorm2d(3, num_splits=2)
    plain = nn.BatchNorm2d(3)
    bn.running_mean.normal_()
    plain.load_state_dict(bn.state_dict())
    x = torch.randn(4, 3, 2, 2)
    torch.testing.assert_close(bn.eval()(x), plain.eval()(x))
    with pytest.raises(ValueError, match="divisible"):
        bn.train()(torch.randn(3, 3, 2, 2))
    with pytest.raises(ValueError, match="num_splits"):
        SplitBatchNorm2d(3, num_splits=0)


def test_convert_to_split_bn_replaces_every_bn2d_and_keeps_state():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    net[1].running_mean.normal_()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(4, 3, 6, 6)
    ref = net.eval()(x)
    net = convert_to_split_bn(net, 2)
    assert isinstance(net[1], SplitBatchNorm2d) and isinstance(net[2][0], SplitBatchNorm2d)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    torch.testing.assert_close(net.eval()(x), ref)
    assert convert_to_split_bn(net, 1) is net
    assert isinstance(convert_to_split_bn(nn.BatchNorm2d(2), 2), SplitBatchNorm2d)


def test_convert_to_sync_bn():
    net = convert_to_sync_bn(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    assert isinstance(net[1], nn.SyncBatchNorm)


def test_split_bn_without_running_stats_and_momentum_none():
    """track_running_stats=False: batch statistics per group, no buffers to update; a momentum
    set to None after construction is a clear error, not a failure inside batch_norm."""
    torch.manual_seed(0)
    bn = SplitBatchNorm2d(3, num_splits=2, track_running_stats=False)
    bn.weight.data.uniform_(0.5, 2.0)
    x = torch.randn(6, 3, 4, 4) * 2 - 1
    ref, _, _ = _manual_split_bn(x, bn.weight.detach(), bn.bias.detach(), 2, bn.eps)
    torch.testing.assert_close(bn(x), ref, rtol=1e-5, atol=1e-5)
    assert bn.running_mean is None and bn.num_batches_tracked is None
    bn.momentum = None
    with pytest.raises(ValueError, match="float momentum"):
        bn(x)
