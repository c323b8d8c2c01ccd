"""SimCLR: NT-Xent over the 2N views, written here as an explicit loop over anchors."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.methods import SimCLR


def _ntxent_loop(z1, z2, tau):
    z = F.normalize(torch.cat([z1, z2]), dim=1).double().detach()
    n2 = z.shape[0]
    n = n2 // 2
    total = 0.0
    correct = 0
    for i in range(n2):
        p = (i + n) % n2
        denom = sum(math.exp(float(z[i] @ z[j]) / tau) for j in range(n2) if j != i)
        total += -math.log(math.exp(float(z[i] @ z[p]) / tau) / denom)
        sims = [float(z[i] @ z[j]) if j != i else -9.0 for j in range(n2)]
        correct += int(max(range(n2), key=lambda j: sims[j]) == p)
    return total / n2, 100.0 * correct / n2


def test_simclr_matches_ntxent_loop(tiny, views):
    torch.manual_seed(0)
    method = SimCLR(tiny(), dim=6, temperature=0.5)
    net = nn.Sequential(copy.deepcopy(method.encoder), copy.deepcopy(method.head))
    x1, x2 = views(5)
    out = method({"views": [x1, x2], "momentum": 0.3})  # keys it does not need are ignored
    loss, acc = _ntxent_loop(net(x1), net(x2), 0.5)
    assert abs(out["loss"].item() - loss) < 1e-5
    assert abs(float(out["pos_acc"]) - acc) < 1e-4
    out["loss"].backward()
    assert all(p.grad is not None for p in method.parameters())


def test_simclr_head_and_defaults(tiny):
    s = SimCLR(tiny())
    assert s.temperature == 0.1 and s.uses_in_batch_negatives and s.schedules() == {}
    assert s.needs == ("views",)
    assert s.head[0].out_features == s.encoder.num_features  # hidden = encoder width
    assert isinstance(s.head[-1], nn.BatchNorm1d) and s.head[-1].affine is False
    assert SimCLR.presets["cifar"]["temperature"] == 0.5
    assert SimCLR.presets["imagenet"]["temperature"] == 0.1
    assert SimCLR(tiny(), mlp_hidden=32, num_layers=3, last_bn=False).head[-1].out_features == 128
