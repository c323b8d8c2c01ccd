"""DCL and DCLW (Yeh et al. ECCV 2022, arXiv 2110.06848) against their formulas written plainly
here, over 3 SGD steps in float64 with the same weights and inputs (the tolerance of
tests/methods/test_two_view_family.py: a wrong pairing, weight or denominator moves values by
far more than 1e-9)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.methods import DCL, DCLW, SimCLR, get_method

STEP_TOL = dict(rtol=1e-9, atol=1e-12)


def _views(n=6, size=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 3, size, size, generator=g, dtype=torch.float64) for _ in range(2)]


def _reference_loss(z1, z2, tau, sigma=None, detach=False):
    """Eq. 6 (and DCLW's weight, sec. 4) anchor by anchor: anchor i of the 2N views has its other
    view p(i) as the positive and the 2N - 2 views of the other images as negatives; the
    positive is NOT in the denominator."""
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    n = z1.shape[0]
    z = torch.cat([z1, z2])
    if sigma is not None:  # w_i = 2 - exp(<z1_i, z2_i>/sigma) / mean_k exp(<z1_k, z2_k>/sigma)
        e = torch.exp((z1 * z2).sum(1) / sigma)
        w = 2 - e / e.mean()
        w = w.detach() if detach else w  # lightly's choice; the paper's code lets it flow
    terms = []
    for i in range(2 * n):
        p = (i + n) % (2 * n)
        pos = (z[i] @ z[p]) / tau
        if sigma is not None:
            pos = w[i % n] * pos
        neg = torch.stack([z[i] @ z[k] / tau for k in range(2 * n) if k not in (i, p)])
        terms.append(-pos + torch.logsumexp(neg, 0))
    return torch.stack(terms).mean()


@pytest.mark.parametrize("cls, sigma, detach", [(DCL, None, False), (DCLW, 0.5, False),
                                               (DCLW, 0.8, False), (DCLW, 0.5, True)])
def test_matches_paper_over_three_sgd_steps(tiny, cls, sigma, detach):
    torch.manual_seed(0)
    kwargs = {} if sigma is None else {"sigma": sigma, "detach_weight": detach}
    method = cls(tiny(), dim=6, mlp_hidden=10, temperature=0.2, **kwargs).double()
    net = nn.Sequential(copy.deepcopy(method.encoder), copy.deepcopy(method.head))
    opt = torch.optim.SGD(method.parameters(), lr=0.3)
    opt_ref = torch.optim.SGD(net.parameters(), lr=0.3)
    for step in range(3):
        x1, x2 = _views(seed=step)
        out = method(method.make_batch([x1, x2], step=step, total_steps=3))
        ref = _reference_loss(net(x1), net(x2), 0.2, sigma, detach)
        assert out["loss"].dtype == torch.float64
        torch.testing.assert_close(out["loss"].detach(), ref.detach(), **STEP_TOL)
        for o, loss in ((opt, out["loss"]), (opt_ref, ref)):
            o.zero_grad()
            loss.backward()
            o.step()
    for a, b in zip([*method.encoder.parameters(), *method.head.parameters()], net.parameters()):
        torch.testing.assert_close(a, b, **STEP_TOL)


def test_dcl_is_not_ntxent_and_dclw_is_not_dcl(tiny):
    """The three losses differ on the same network and inputs (so the test above can fail)."""
    torch.manual_seed(0)
    base = SimCLR(tiny(), dim=6, mlp_hidden=10, temperature=0.2).double()
    x1, x2 = _views()
    losses = []
    for cls in (SimCLR, DCL, DCLW):
        m = cls(tiny(), dim=6, mlp_hidden=10, temperature=0.2).double()
        m.load_state_dict(base.state_dict())
        losses.append(m({"views": [x1, x2]})["loss"].item())
    assert abs(losses[0] - losses[1]) > 1e-3 and abs(losses[1] - losses[2]) > 1e-3


@pytest.mark.parametrize("name", ["dcl", "dclw"])
def test_registered_presets_and_two_views_only(tiny, name):
    cls = type(get_method(name, encoder=tiny(), dim=4))
    assert cls.presets["cifar"]["temperature"] == 0.1
    assert cls.presets["cifar"]["encoder"] == "cifar_resnet18"
    if name == "dclw":
        assert cls.presets["cifar"]["sigma"] == 0.5 and cls(tiny()).criterion.sigma == 0.5
    method = cls(tiny(), dim=4)
    x1, x2 = _views(n=4)
    with pytest.raises(ValueError, match="exactly two views"):
        method({"views": [x1.float(), x2.float(), x1.float()]})
    with pytest.raises(ValueError, match="views"):
        method({"views": [x1.float()]})
    assert not math.isnan(method({"views": [x1.float(), x2.float()]})["loss"].item())
