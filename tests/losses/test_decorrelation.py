"""Barlow Twins, VICReg, BYOL and SimSiam losses against their formulas written plainly (loops
over samples and dimensions, float64) and hand-computed cases. The generic properties
(gradcheck, half precision, permutations, zero vectors) come from test_properties.py."""

from __future__ import annotations

import math

import pytest
import torch

from contrastive.losses import functional as LF
from contrastive.losses import get_loss, loss_class
from contrastive.losses.decorrelation import barlow_twins, vicreg, vicreg_terms
from contrastive.losses.regression import byol, negative_cosine

TOL = dict(rtol=1e-12, atol=1e-12)  # float64, a few hundred operations: rounding ~1e-15
# four samples whose two columns have mean 0, biased variance 1 and are orthogonal
SQUARE = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)


def _pairs(n=7, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, d, generator=g, dtype=torch.float64)
    return a, a + 0.7 * torch.randn(n, d, generator=g, dtype=torch.float64)


def barlow_plain(z1, z2, lambd, eps):
    n, d = z1.shape
    std = []
    for z in (z1, z2):
        cols = []
        for j in range(d):
            col = [float(z[i, j]) for i in range(n)]
            mean = sum(col) / n
            var = sum((v - mean) ** 2 for v in col) / n
            cols.append([(v - mean) / math.sqrt(var + eps) for v in col])
        std.append(cols)
    loss = 0.0
    for i in range(d):
        for j in range(d):
            c = sum(std[0][i][k] * std[1][j][k] for k in range(n)) / n
            loss += (1 - c) ** 2 if i == j else lambd * c**2
    return loss


def vicreg_plain(z1, z2, sim, std_w, cov_w, eps):
    n, d = z1.shape
    inv = sum(float(z1[i, j] - z2[i, j]) ** 2 for i in range(n) for j in range(d)) / (n * d)
    var_terms, cov_terms = [], []
    for z in (z1, z2):
        cols = [[float(z[i, j]) for i in range(n)] for j in range(d)]
        centred = [[v - sum(c) / n for v in c] for c in cols]
        var = [sum(v * v for v in c) / (n - 1) for c in centred]
        var_terms.append(sum(max(0.0, 1 - math.sqrt(v + eps)) for v in var) / d)
        cov = 0.0
        for a in range(d):
            for b in range(d):
                if a != b:
                    cov += (sum(x * y for x, y in zip(centred[a], centred[b])) / (n - 1)) ** 2
        cov_terms.append(cov / d)
    return sim * inv + std_w * sum(var_terms) / 2 + cov_w * sum(cov_terms)


@pytest.mark.parametrize("lambd, eps", [(0.0051, 1e-5), (0.3, 0.0)])
def test_barlow_twins_equals_formula(lambd, eps):
    z1, z2 = _pairs()
    got = barlow_twins(z1, z2, lambd=lambd, eps=eps)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(barlow_plain(z1, z2, lambd, eps), rel=1e-12, abs=1e-12)
    assert get_loss("barlow_twins", lambd=lambd, eps=eps)(z1, z2).item() == pytest.approx(got.item())


def test_barlow_twins_hand_cases():
    # standardised, orthogonal columns: C = I -> 0; the second view negated: C = -I -> D * 4
    assert barlow_twins(SQUARE, SQUARE, eps=0.0).item() == pytest.approx(0.0, abs=1e-15)
    assert barlow_twins(SQUARE, -SQUARE, eps=0.0).item() == pytest.approx(8.0, rel=1e-12, abs=1e-12)
    # the columns of view 2 swapped: C = [[0, 1], [1, 0]] -> on-diagonal 2 + lambda * 2
    swapped = SQUARE[:, [1, 0]]
    assert barlow_twins(SQUARE, swapped, lambd=0.25, eps=0.0).item() == pytest.approx(2.5, rel=1e-12, abs=1e-12)
    # the paper's lambda is 5e-3; the official code's default (ours) is 0.0051
    assert get_loss("barlow_twins").lambd == 0.0051


@pytest.mark.parametrize("coeffs", [(25.0, 25.0, 1.0), (1.0, 3.0, 0.5)])
def test_vicreg_equals_formula(coeffs):
    z1, z2 = _pairs(n=6, d=4, seed=1)
    z1 = z1 * 0.3  # variances below 1: the variance hinge is active
    got = vicreg(z1, z2, sim_coeff=coeffs[0], std_coeff=coeffs[1], cov_coeff=coeffs[2])
    assert got.item() == pytest.approx(vicreg_plain(z1, z2, *coeffs, 1e-4), rel=1e-12, abs=1e-12)
    mod = get_loss("vicreg", sim_coeff=coeffs[0], std_coeff=coeffs[1], cov_coeff=coeffs[2])
    assert mod(z1, z2).item() == pytest.approx(got.item(), rel=1e-12, abs=1e-12)


def test_vicreg_hand_cases_and_collapse():
    # orthogonal columns with unbiased variance 4/3 > 1: every term is 0
    assert vicreg(SQUARE, SQUARE).item() == pytest.approx(0.0, abs=1e-15)
    # collapse (every sample the same): invariance 0, covariance 0, variance relu(1 - 0.01)
    const = torch.ones(5, 3, dtype=torch.float64)
    inv, var, cov = vicreg_terms(const, const)
    assert (inv.item(), cov.item()) == (0.0, 0.0)
    assert var.item() == pytest.approx(0.99, rel=1e-12, abs=1e-12)
    assert vicreg(const, const).item() == pytest.approx(25 * 0.99, rel=1e-12, abs=1e-12)


def test_batch_level_losses_need_the_global_batch():
    # the mean of the losses of two halves is not the loss of the whole batch: methods must
    # gather (with gradient) before calling these losses
    z1, z2 = _pairs(n=8, d=3, seed=2)
    for fn in (barlow_twins, vicreg):
        whole = fn(z1, z2)
        halves = (fn(z1[:4], z2[:4]) + fn(z1[4:], z2[4:])) / 2
        assert abs(whole.item() - halves.item()) > 1e-3
    assert loss_class("barlow_twins").batch_level and loss_class("vicreg").batch_level
    assert not loss_class("byol").batch_level


def test_byol_and_simsiam_equal_their_formulas():
    p, z = _pairs(n=5, d=4, seed=3)
    cos = [float(p[i] @ z[i] / (p[i].norm() * z[i].norm())) for i in range(5)]
    torch.testing.assert_close(byol(p, z, reduction="none"),
                               torch.tensor([2 - 2 * c for c in cos], dtype=torch.float64), **TOL)
    # BYOL's loss is the squared distance of the unit vectors
    unit = torch.nn.functional.normalize
    torch.testing.assert_close(byol(p, z), (unit(p, dim=1) - unit(z, dim=1)).pow(2).sum(1).mean(),
                               **TOL)
    torch.testing.assert_close(negative_cosine(p, z, reduction="none"),
                               -torch.tensor(cos, dtype=torch.float64), **TOL)
    e = torch.eye(2, dtype=torch.float64)
    assert byol(e, e).item() == pytest.approx(0.0, abs=1e-15)
    assert byol(e, -e).item() == pytest.approx(4.0, rel=1e-12, abs=1e-12)
    assert byol(e, e[[1, 0]]).item() == pytest.approx(2.0, rel=1e-12, abs=1e-12)
    assert negative_cosine(e, -3 * e).item() == pytest.approx(1.0, rel=1e-12, abs=1e-12)
    assert get_loss("negative_cosine")(e, e).item() == pytest.approx(-1.0, rel=1e-12, abs=1e-12)


def test_bad_inputs_raise_value_errors():
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="N >= 2"):
        barlow_twins(z[:1], z[:1])
    with pytest.raises(ValueError, match="same shape"):
        vicreg(z, z[:, :2])
    with pytest.raises(ValueError, match="lambd"):
        get_loss("barlow_twins", lambd=-1.0)
    with pytest.raises(ValueError, match="std_coeff"):
        get_loss("vicreg", std_coeff=float("nan"))
    with pytest.raises(ValueError, match="batch-level"):
        barlow_twins(z, z, reduction="sum")
    with pytest.raises(ValueError, match="same non-empty shape"):
        byol(z, z[:3])
    with pytest.raises(ValueError, match="reduction"):
        negative_cosine(z, z, reduction="avg")
    assert LF.EPS > 0
