"""BYOL, SimSiam, Barlow Twins, VICReg, SupCon and NNCLR against their formulas written plainly
here (the papers' pseudo-code), with the same weights and inputs, over several SGD steps in
float64 (``STEP_TOL``: float64 rounding of sums taken in other orders stays below ~1e-12
relative over these steps; a wrong momentum, stop-gradient, weight or pairing moves values by
more than 1e-3)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.methods import BYOL, NNCLR, BarlowTwins, SimSiam, SupCon, VICReg, get_method
from contrastive.nn import cosine_momentum

STEP_TOL = dict(rtol=1e-9, atol=1e-12)


def _views(n=6, size=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 3, size, size, generator=g, dtype=torch.float64) for _ in range(2)]


def _sgd(params, lr=0.3):
    return torch.optim.SGD([p for p in params if p.requires_grad], lr=lr)


def _step(opt, loss):
    opt.zero_grad()
    loss.backward()
    opt.step()


def _close_params(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **STEP_TOL)


def test_byol_matches_paper_over_steps(tiny):
    torch.manual_seed(0)
    method = BYOL(tiny(), dim=6, mlp_hidden=10, momentum=0.9).double()
    online = nn.Sequential(copy.deepcopy(method.encoder), copy.deepcopy(method.projector))
    predictor, target = copy.deepcopy(method.predictor), copy.deepcopy(online)
    opt, opt_ref = _sgd(method.parameters()), _sgd([*online.parameters(), *predictor.parameters()])

    def reg(p, z):  # ||p/|p| - z/|z|||^2, eq. 2
        return (F.normalize(p, dim=1) - F.normalize(z, dim=1)).pow(2).sum(1).mean()

    for step in range(3):
        x1, x2 = _views(seed=step)
        tau = cosine_momentum(step, 3, 0.9)
        out = method(method.make_batch([x1, x2], step=step, total_steps=3))
        _step(opt, out["loss"])
        with torch.no_grad():
            for pt, po in zip(target.parameters(), online.parameters()):
                pt.copy_(tau * pt + (1 - tau) * po)
            t1, t2 = target(x1), target(x2)
        loss = reg(predictor(online(x1)), t2) + reg(predictor(online(x2)), t1)
        _step(opt_ref, loss)
        assert out["loss"].dtype == torch.float64
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
    _close_params([*method.encoder.parameters(), *method.projector.parameters(),
                   *method.predictor.parameters()], [*online.parameters(), *predictor.parameters()])
    _close_params(method.target.parameters(), target.parameters())
    assert method.schedules()["momentum"](0, 10) == 0.9 and method.schedules()["momentum"](10, 10) == 1.0


@pytest.mark.parametrize("stop_gradient", [True, False])
def test_simsiam_matches_paper_over_steps(tiny, stop_gradient):
    torch.manual_seed(0)
    method = SimSiam(tiny(), dim=6, proj_hidden=8, pred_hidden=4,
                     stop_gradient=stop_gradient).double()
    f, h = copy.deepcopy(nn.Sequential(method.encoder, method.projector)), copy.deepcopy(method.predictor)
    opt, opt_ref = _sgd(method.parameters()), _sgd([*f.parameters(), *h.parameters()])

    def d(p, z):  # Algorithm 1: D(p, z) = -cos(p, z.detach())
        z = z.detach() if stop_gradient else z
        return -(F.normalize(p, dim=1) * F.normalize(z, dim=1)).sum(1).mean()

    for step in range(3):
        x1, x2 = _views(seed=step)
        out = method({"views": [x1, x2]})
        _step(opt, out["loss"])
        z1, z2 = f(x1), f(x2)
        loss = d(h(z1), z2) / 2 + d(h(z2), z1) / 2
        _step(opt_ref, loss)
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
    _close_params([*method.encoder.parameters(), *method.projector.parameters(),
                   *method.predictor.parameters()], [*f.parameters(), *h.parameters()])


def test_simsiam_predictor_group_and_projector_layout(tiny):
    m = SimSiam(tiny(), dim=6, pred_hidden=4, predictor_lr=0.05)
    (group,) = m.param_groups()
    assert group.lr == 0.05 and {id(p) for p in group.params} == {id(p) for p in m.predictor.parameters()}
    assert SimSiam(tiny(), dim=6).param_groups() == []
    last_bn = m.projector[-1]
    assert isinstance(last_bn, nn.BatchNorm1d) and not last_bn.affine  # the code's affine=False
    assert all(layer.bias is None for layer in m.projector if isinstance(layer, nn.Linear))


def _standardise(z, eps=1e-5):
    return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + eps)


def test_barlow_twins_and_vicreg_match_their_formulas_over_steps(tiny):
    for cls in (BarlowTwins, VICReg):
        torch.manual_seed(0)
        method = cls(tiny(), dim=5, mlp_hidden=7).double()
        f = copy.deepcopy(nn.Sequential(method.encoder, method.projector))
        opt, opt_ref = _sgd(method.parameters(), 0.05), _sgd(f.parameters(), 0.05)
        for step in range(3):
            x1, x2 = _views(seed=step)
            out = method({"views": [x1, x2]})
            _step(opt, out["loss"])
            z1, z2 = f(x1), f(x2)
            n, dim = z1.shape
            if cls is BarlowTwins:  # eq. 1 with the code's lambda
                c = _standardise(z1).T @ _standardise(z2) / n
                off = c - torch.diag(torch.diagonal(c))
                loss = (torch.diagonal(c) - 1).pow(2).sum() + 0.0051 * off.pow(2).sum()
            else:  # eq. 6 with (25, 25, 1)
                inv = F.mse_loss(z1, z2)
                var = sum(F.relu(1 - torch.sqrt(z.var(0) + 1e-4)).mean() for z in (z1, z2)) / 2
                cov = 0.0
                for z in (z1, z2):
                    zc = z - z.mean(0)
                    cm = zc.T @ zc / (n - 1)
                    cov = cov + (cm - torch.diag(torch.diagonal(cm))).pow(2).sum() / dim
                loss = 25 * inv + 25 * var + cov
            _step(opt_ref, loss)
            torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
        _close_params([*method.encoder.parameters(), *method.projector.parameters()],
                      f.parameters())


def test_supcon_uses_class_labels_and_refuses_unknown(tiny):
    torch.manual_seed(0)
    method = SupCon(tiny(), dim=5, temperature=0.5).double()
    f = copy.deepcopy(nn.Sequential(method.encoder, method.head))
    x1, x2 = _views(n=6)
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    out = method({"views": [x1, x2], "labels": labels})
    z = F.normalize(torch.stack([f(x1), f(x2)], 1), dim=2).reshape(12, 5)  # sample-major
    y = labels.repeat_interleave(2)
    total = 0.0
    for i in range(12):  # eq. 2, L^sup_out
        others = [a for a in range(12) if a != i]
        log_den = torch.logsumexp(torch.stack([z[i] @ z[a] / 0.5 for a in others]), 0)
        pos = [p for p in others if y[p] == y[i]]
        total = total - sum(z[i] @ z[p] / 0.5 - log_den for p in pos) / len(pos)
    torch.testing.assert_close(out["loss"], total / 12, **STEP_TOL)
    assert SupCon.needs == ("views", "labels")
    with pytest.raises(ValueError, match="class label"):
        method({"views": [x1, x2], "labels": torch.tensor([0, 1, -1, 2, 1, 0])})
    scaled = SupCon(tiny(), dim=5, temperature=0.1, base_temperature=0.07)
    assert scaled.factor == pytest.approx(0.1 / 0.07)


def test_supcon_head_bn_is_simclrs_head_and_starts_spread_out(tiny):
    """``head_bn``: SimCLR's head (BN after the hidden Linear, and on the output without affine);
    the default is the paper's Linear-ReLU-Linear. On inputs that are almost identical (as a
    small CNN's pooled ReLU features at init) the default head's embeddings are almost one
    point, while the output BN centres them over the batch (mean cosine near 0)."""
    plain, bn = SupCon(tiny(), dim=8), SupCon(tiny(), dim=8, head_bn=True)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in plain.head.modules())
    assert [type(m) for m in bn.head] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear,
                                         nn.BatchNorm1d]
    assert bn.head[1].affine and not bn.head[4].affine
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 3, 12, 12, generator=g) + 1e-3 * torch.randn(16, 3, 12, 12, generator=g)

    def mean_cosine(method):
        z = method({"views": [x, x], "labels": torch.arange(16) % 4})["embeddings"]
        return ((z @ z.T).sum() - 16) / (16 * 15)

    assert mean_cosine(plain) > 0.99
    assert abs(mean_cosine(bn)) < 0.1


def test_nnclr_matches_paper_and_fills_its_support_set(tiny):
    torch.manual_seed(0)
    method = NNCLR(tiny(), dim=5, proj_hidden=7, pred_hidden=9, support_size=8,
                   temperature=0.2).double()
    f, h = copy.deepcopy(nn.Sequential(method.encoder, method.projector)), copy.deepcopy(method.predictor)
    support = method.support.ordered_keys().clone()
    opt, opt_ref = _sgd(method.parameters()), _sgd([*f.parameters(), *h.parameters()])
    for step in range(3):
        x1, x2 = _views(n=3, seed=step)
        out = method({"views": [x1, x2]})
        _step(opt, out["loss"])
        z1, z2 = F.normalize(f(x1), dim=1), F.normalize(f(x2), dim=1)
        p1, p2 = F.normalize(h(z1), dim=1), F.normalize(h(z2), dim=1)

        def nearest(z, bank=support):
            return bank[(z.detach() @ bank.T).argmax(1)]

        def nce(a, b):  # eq. 2: nn(z_i) against every prediction of the batch, positive i
            return F.cross_entropy(a @ b.T / 0.2, torch.arange(len(a)))

        loss = (nce(nearest(z1), p2) + nce(nearest(z2), p1)) / 2
        _step(opt_ref, loss)
        support = torch.cat([support, z1.detach()])[-8:]  # FIFO of the first view's z
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
        torch.testing.assert_close(method.support.ordered_keys(), support, **STEP_TOL)
    _close_params([*method.encoder.parameters(), *method.projector.parameters(),
                   *method.predictor.parameters()], [*f.parameters(), *h.parameters()])


@pytest.mark.parametrize("name", ["byol", "simsiam", "barlow_twins", "vicreg", "supcon", "nnclr"])
def test_registered_with_paper_presets_and_bad_batches(name, tiny):
    cls = type(get_method(name, encoder=tiny(), **_small(name)))
    assert {"resnet50", "cifar"} <= set(cls.presets)
    method = get_method(name, encoder=tiny(), **_small(name))
    x1, x2 = _views(n=4)
    with pytest.raises(ValueError, match="views"):
        method(method.make_batch([x1.float()], labels=torch.zeros(4, dtype=torch.long)))


def _small(name):
    return {"byol": dict(dim=4, mlp_hidden=6), "simsiam": dict(dim=4, pred_hidden=3),
            "barlow_twins": dict(dim=4, mlp_hidden=6), "vicreg": dict(dim=4, mlp_hidden=6),
            "supcon": dict(dim=4), "nnclr": dict(dim=4, proj_hidden=6, pred_hidden=6,
                                                 support_size=8)}[name]
