"""MoCo v3 equals its formula written plainly: predictor on the query branch, EMA of backbone +
projector, loss = 2 tau [CE(q1 k2^T / tau) + CE(q2 k1^T / tau)] (a sum).

Several optimiser steps are compared in float64 (see ``STEP_TOL``): in float32 the method and
the plain formula sum in different orders, and those roundings (1e-7 relative per operation)
grow through the steps to differences that depend on the machine and the thread count.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.methods import MoCoV3
from contrastive.nn import cosine_momentum

# float64 rounding is 1.1e-16 per operation; a step here chains ~1e3 operations and three steps
# with lr 0.3 amplify differences at most ~10x, so honest reorderings stay below ~1e-12 relative.
# rtol 1e-9 leaves a 1000x margin above that and is 1e6 below the smallest real defect (a wrong
# momentum, temperature or missing term changes values by > 1e-3).
STEP_TOL = dict(rtol=1e-9, atol=1e-12)


def test_moco_v3_matches_plain_formula_over_steps(tiny, views):
    torch.manual_seed(0)
    tau, lr, total = 0.5, 0.3, 3
    method = MoCoV3(tiny(), dim=8, mlp_hidden=16, temperature=tau).double()
    base = nn.Sequential(copy.deepcopy(method.encoder), copy.deepcopy(method.projector))
    predictor = copy.deepcopy(method.predictor)
    momentum_net = copy.deepcopy(base)
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=lr)
    ref_params = [*base.parameters(), *predictor.parameters()]
    opt_ref = torch.optim.SGD(ref_params, lr=lr)
    assert len(opt.param_groups[0]["params"]) == len(ref_params)

    def ctr(q, k):
        q, k = F.normalize(q, dim=1), F.normalize(k, dim=1)
        logits = q @ k.T / tau
        return F.cross_entropy(logits, torch.arange(len(q))) * (2 * tau), logits

    for step in range(total):
        m = cosine_momentum(step, total, 0.9)
        x1, x2 = (v.double() for v in views(5, seed=step))
        out = method({"views": [x1, x2], "momentum": m})
        opt.zero_grad()
        out["loss"].backward()
        opt.step()

        q1, q2 = predictor(base(x1)), predictor(base(x2))
        with torch.no_grad():
            for pk, pb in zip(momentum_net.parameters(), base.parameters()):
                pk.data = pk.data * m + pb.data * (1 - m)
            k1, k2 = momentum_net(x1), momentum_net(x2)
        (l1, logits1), (l2, logits2) = ctr(q1, k2), ctr(q2, k1)
        loss = l1 + l2
        opt_ref.zero_grad()
        loss.backward()
        opt_ref.step()

        assert out["loss"].dtype == torch.float64  # computed in float64 throughout
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
        acc = torch.cat([logits1.argmax(1), logits2.argmax(1)]) == torch.arange(5).repeat(2)
        torch.testing.assert_close(out["pos_acc"], acc.float().mean() * 100)
        diag = torch.cat([logits1.diag(), logits2.diag()]) * tau
        torch.testing.assert_close(out["pos_sim"], diag.mean().detach(), **STEP_TOL)
    for a, b in zip([p for p in method.parameters() if p.requires_grad], ref_params):
        torch.testing.assert_close(a, b, **STEP_TOL)


def test_heads_and_defaults_follow_the_paper(tiny, tiny_patch):
    r = MoCoV3(tiny(), mlp_hidden=32)
    assert not r.vit and r.temperature == 1.0 and r.base_momentum == 0.99
    assert [type(m).__name__ for m in r.projector] == [
        "Linear",
        "BatchNorm1d",
        "ReLU",
        "Linear",
        "BatchNorm1d",
    ]
    assert r.projector[-1].affine is False and r.projector[3].out_features == 256
    assert type(r.predictor[-1]).__name__ == "Linear"
    assert all(m.bias is None for m in [*r.projector, *r.predictor] if isinstance(m, nn.Linear))

    v = MoCoV3(tiny_patch(), mlp_hidden=32, freeze_patch_embed=True)
    assert v.vit and v.temperature == 0.2
    assert sum(isinstance(m, nn.Linear) for m in v.projector) == 3
    assert isinstance(v.predictor[-1], nn.BatchNorm1d)
    assert all(not p.requires_grad for p in v.encoder.patch_embed.parameters())
    assert v.encoder.mix.weight.requires_grad

    assert MoCoV3.uses_in_batch_negatives and r.momentum_schedule == "cosine"
    for step in (0, 3, 7, 10):  # the declared schedule is the paper's cosine from m0 to 1
        assert r.schedule_values(step, 10) == {"momentum": cosine_momentum(step, 10, 0.99)}
    assert MoCoV3.presets["resnet50"]["temperature"] == 1.0
    assert MoCoV3.presets["vit_small"]["temperature"] == 0.2
    assert MoCoV3.presets["resnet50_1000ep"]["momentum"] == 0.996
    with pytest.raises(ValueError, match="patch_embed"):
        MoCoV3(tiny(), freeze_patch_embed=True)


def test_moco_v3_multicrop_pairs_queries_of_all_views_with_other_global_keys(tiny):
    """Multi-crop (2 global + 2 local views): queries from all views, keys from the global ones;
    the loss is 2 tau x 2 x the mean of CE over the (query view, other global key view) pairs."""
    torch.manual_seed(0)
    tau = 0.5
    method = MoCoV3(tiny(), dim=8, mlp_hidden=16, temperature=tau)
    g = torch.Generator().manual_seed(2)
    views = [torch.randn(5, 3, s, s, generator=g) for s in (16, 16, 8, 8)]
    query = nn.Sequential(copy.deepcopy(method.encoder), copy.deepcopy(method.projector),
                          copy.deepcopy(method.predictor))
    key_net = copy.deepcopy(method.key_net.module)
    out = method({"views": views, "momentum": 1.0})  # m = 1: the key encoder stays put
    qs = [F.normalize(query(x), dim=1) for x in views]
    with torch.no_grad():
        ks = [F.normalize(key_net(x), dim=1) for x in views[:2]]
    pairs = [(v, k) for v in range(4) for k in range(2) if v != k]
    assert len(pairs) == 6
    ce = [F.cross_entropy(qs[v] @ ks[k].T / tau, torch.arange(5)) for v, k in pairs]
    torch.testing.assert_close(out["loss"], 2 * tau * 2 * torch.stack(ce).mean(),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="global views must have the same shape"):
        method({"views": [views[0], views[2]], "momentum": 0.9})
