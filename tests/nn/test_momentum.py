"""Momentum (EMA) update equals the formula on every tensor; the key encoder gets no gradient;
momentum schedules."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from contrastive.nn import (
    MomentumEncoder,
    constant_momentum,
    copy_buffers,
    cosine_momentum,
    momentum_update,
)


def _pair():
    torch.manual_seed(0)
    src = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
    tgt = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
    for p in src.parameters():  # make BN affine params differ from their init too
        p.data.normal_()
    src[1].running_mean.fill_(3.0)
    return tgt, src


@pytest.mark.parametrize("m", [0.0, 0.5, 0.99, 0.999, 1.0])
def test_momentum_update_matches_formula_on_every_tensor(m):
    tgt, src = _pair()
    before_t = {k: v.clone() for k, v in tgt.state_dict().items()}
    src_sd = {k: v.clone() for k, v in src.state_dict().items()}
    momentum_update(tgt, src, m)
    param_names = {n for n, _ in tgt.named_parameters()}
    assert len(param_names) == 6
    for name, value in tgt.state_dict().items():
        if name in param_names:
            a, b = m * before_t[name].double(), (1 - m) * src_sd[name].double()
            # float32 lerp: at most a few roundings of 2^-24 relative on each term; the bound
            # 4 eps (|m a| + |(1-m) b|) holds for any kernel (FMA or not, any vector width),
            # unlike a fixed rtol, which fails where the two terms nearly cancel
            bound = 4 * torch.finfo(torch.float32).eps * (a.abs() + b.abs()) + 1e-30
            assert ((value.double() - (a + b)).abs() <= bound).all(), name
        else:  # buffers (BN running stats) are not part of the EMA
            assert torch.equal(value, before_t[name]), name
    assert all(torch.equal(v, src_sd[k]) for k, v in src.state_dict().items())


def test_momentum_update_accepts_parameter_lists_and_checks_lengths():
    tgt, src = _pair()
    momentum_update(list(tgt.parameters()), src.parameters(), 0.0)
    for a, b in zip(tgt.parameters(), src.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="parameters"):
        momentum_update(tgt, list(src.parameters())[:-1], 0.5)
    with pytest.raises(ValueError, match="momentum"):
        momentum_update(tgt, src, 1.5)


def test_copy_buffers():
    tgt, src = _pair()
    copy_buffers(tgt, src)
    assert torch.equal(tgt[1].running_mean, src[1].running_mean)


def test_momentum_encoder_is_frozen_copy_without_gradient():
    torch.manual_seed(0)
    query = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    key = MomentumEncoder(query)
    for a, b in zip(key.parameters(), query.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
        assert not a.requires_grad and b.requires_grad
    x = torch.randn(5, 4)
    loss = (query(x) - key(x)).square().sum() + query(x).sum()
    loss.backward()
    assert all(p.grad is None for p in key.parameters())
    assert all(p.grad is not None for p in query.parameters())
    opt = torch.optim.SGD(
        [p for p in (*query.parameters(), *key.parameters()) if p.requires_grad], lr=0.1
    )
    assert len(opt.param_groups[0]["params"]) == 4  # only the query's 4 tensors
    opt.step()
    old = [p.clone() for p in key.parameters()]
    key.update(query, 0.9)
    for k0, k1, q in zip(old, key.parameters(), query.parameters()):
        torch.testing.assert_close(k1, 0.9 * k0 + 0.1 * q.detach())


def test_constant_and_cosine_schedules():
    assert constant_momentum(7, 100, 0.99) == 0.99
    assert cosine_momentum(0, 100, 0.99) == pytest.approx(0.99)
    assert cosine_momentum(50, 100, 0.99) == pytest.approx(0.995)
    assert cosine_momentum(100, 100, 0.99) == pytest.approx(1.0)
    assert cosine_momentum(150, 100, 0.99) == pytest.approx(1.0)
    t = 30
    assert cosine_momentum(t, 100, 0.9) == pytest.approx(
        1 - 0.1 * (math.cos(math.pi * 0.3) + 1) / 2
    )
    values = [cosine_momentum(s, 100, 0.99) for s in range(101)]
    assert all(a <= b for a, b in zip(values, values[1:]))
    with pytest.raises(ValueError, match="total_steps"):
        cosine_momentum(0, 0, 0.99)


def test_momentum_encoder_cache_follows_replaced_parameters():
    torch.manual_seed(0)
    query = nn.Linear(3, 2)
    key = MomentumEncoder(query)
    key.update(query, 0.5)  # fills the cached parameter list
    fresh = {k: torch.zeros_like(v) for k, v in key.state_dict().items()}
    key.load_state_dict(fresh, assign=True)  # replaces the Parameter objects
    key.update(query, 0.5)
    torch.testing.assert_close(key.module.weight, 0.5 * query.weight.detach())
