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


def test_multicrop_loss_is_supcon_with_image_ids_and_ntxent_for_two_views():
    """float64: the multi-view loss equals SupCon L_out (image ids as labels: every other view of
    the image is a positive), an independent implementation, and NT-Xent for two views."""
    from contrastive.losses import functional as LF
    from contrastive.methods.simclr import multiview_loss

    g = torch.Generator().manual_seed(0)
    zs = [F.normalize(torch.randn(5, 8, generator=g, dtype=torch.float64), dim=1)
          for _ in range(6)]
    got = multiview_loss(zs, None, 0, 0.3)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, LF.supcon(torch.stack(zs, 1), None, temperature=0.3),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(multiview_loss(zs[:2], None, 0, 0.3),
                               LF.ntxent(zs[0], zs[1], temperature=0.3), rtol=1e-12, atol=1e-12)


def test_simclr_multicrop_views_of_any_size(tiny):
    """2 x 16 px + 3 x 8 px: one loss over the 5 views, gradients reach the encoder."""
    from contrastive.methods.simclr import multiview_loss

    torch.manual_seed(0)
    method = SimCLR(tiny(), dim=6, temperature=0.5)
    g = torch.Generator().manual_seed(1)
    views = [torch.randn(4, 3, s, s, generator=g) for s in (16, 16, 8, 8, 8)]
    out = method({"views": views})
    net = nn.Sequential(copy.deepcopy(method.encoder), copy.deepcopy(method.head))
    ref = multiview_loss([F.normalize(net(x), dim=1) for x in views], None, 0, 0.5)
    torch.testing.assert_close(out["loss"], ref)
    out["loss"].backward()
    assert all(p.grad is not None for p in method.encoder.parameters())
