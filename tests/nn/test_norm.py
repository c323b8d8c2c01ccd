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


def _train_pair(splits=4, affine=True, track=True, momentum=0.3):
    """Two equal float64 split BNs, one to be fed NCHW and one channels_last."""
    torch.manual_seed(0)
    nchw = SplitBatchNorm2d(3, num_splits=splits, momentum=momentum, affine=affine,
                            track_running_stats=track).double()
    if affine:
        nchw.weight.data.uniform_(0.5, 2.0)
        nchw.bias.data.normal_()
    cl = SplitBatchNorm2d(3, num_splits=splits, momentum=momentum, affine=affine,
                          track_running_stats=track).double()
    cl.load_state_dict(nchw.state_dict())
    return nchw, cl


@pytest.mark.parametrize("affine,track", [(True, True), (False, True), (True, False)])
def test_split_bn_channels_last_equals_nchw_over_steps(affine, track):
    """Outputs, input and parameter grads, running stats (momentum, unbiased running_var) and
    num_batches_tracked equal the NCHW path's over three steps; the output stays
    channels_last, the NCHW output stays NCHW."""
    nchw, cl = _train_pair(affine=affine, track=track)
    for step in range(3):
        x = torch.randn(8, 3, 5, 4, dtype=torch.float64) * (step + 2) + step - 1
        grad = torch.randn_like(x)
        x_ref = x.clone().requires_grad_()
        x_cl = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        y_ref, y_cl = nchw(x_ref), cl(x_cl)
        assert y_cl.is_contiguous(memory_format=torch.channels_last) and not y_cl.is_contiguous()
        assert y_ref.is_contiguous()
        (y_ref * grad).sum().backward()
        (y_cl * grad).sum().backward()
        torch.testing.assert_close(y_cl, y_ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(x_cl.grad, x_ref.grad, rtol=0, atol=1e-10)
        if affine:
            torch.testing.assert_close(cl.weight.grad, nchw.weight.grad, rtol=0, atol=1e-10)
            torch.testing.assert_close(cl.bias.grad, nchw.bias.grad, rtol=0, atol=1e-10)
    for name, buf in nchw.named_buffers():
        torch.testing.assert_close(dict(cl.named_buffers())[name], buf, rtol=0, atol=1e-10)
    if track:
        assert int(cl.num_batches_tracked) == 3


def test_split_bn_channels_last_running_var_is_unbiased():
    """One step from the initial buffers: running_var = 0.9 + 0.1 * mean over groups of the
    unbiased group variances (M / (M - 1) with M = N/s * H * W = 2 * 3 * 2 = 12)."""
    _, cl = _train_pair(momentum=0.1)
    x = torch.randn(8, 3, 3, 2, dtype=torch.float64) * 3 + 1
    cl(x.contiguous(memory_format=torch.channels_last))
    _, mean, var = _manual_split_bn(x, cl.weight.detach(), cl.bias.detach(), 4, cl.eps)
    torch.testing.assert_close(cl.running_mean, 0.1 * mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(cl.running_var, 0.9 + 0.1 * var, rtol=0, atol=1e-12)


def test_split_bn_channels_last_gradcheck():
    """The channels_last path's gradients (through its two regrouping copies and the batch norm)
    against finite differences, for the input, weight and bias."""
    from torch.func import functional_call

    torch.manual_seed(0)
    bn = SplitBatchNorm2d(3, num_splits=2).double()
    x = torch.randn(4, 3, 2, 3, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last).requires_grad_()
    weight = torch.empty(3, dtype=torch.float64).uniform_(0.5, 2.0).requires_grad_()
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def split_bn(inp, w, b):
        assert inp.is_contiguous(memory_format=torch.channels_last) and not inp.is_contiguous()
        return functional_call(bn, {"weight": w, "bias": b}, (inp,))

    assert torch.autograd.gradcheck(split_bn, (x, weight, bias))


def test_split_bn_channels_last_not_divisible_and_bf16():
    bn = SplitBatchNorm2d(3, num_splits=4)
    x = torch.randn(6, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="not divisible by num_splits=4"):
        bn(x)
    # low precision (autocast's bf16 activations): statistics in float32, output in bf16
    x = torch.randn(8, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    y = bn(x.bfloat16())
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last)
    ref = SplitBatchNorm2d(3, num_splits=4)(x.contiguous())
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
