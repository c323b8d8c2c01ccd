"""VICRegL's local loss against its formula written plainly (loops, float64), gradcheck, the
crop grid and both matchings on planted cases, and the global terms against VICReg's. The
generic properties (half precision, permutations, zero vectors) come from test_properties.py."""

from __future__ import annotations

import math

import pytest
import torch

from contrastive.losses import get_loss
from contrastive.losses.decorrelation import (
    VICRegLLocalLoss,
    crop_grid,
    feature_matches,
    location_matches,
    vicreg,
    vicregl_global_terms,
    vicregl_local,
)

TOL = dict(rtol=1e-12, atol=1e-12)  # float64


def plain_matches(dist, k):
    """For each input location its nearest candidate; the k inputs nearest to theirs, in
    index order (no ties in these cases)."""
    nearest = [min(range(len(row)), key=lambda t: row[t]) for row in dist]
    kept = sorted(sorted(range(len(dist)), key=lambda s: dist[s][nearest[s]])[:k])
    return [(s, nearest[s]) for s in kept]


def plain_terms(x, y, eps=1e-4):
    """(mse, var, cov) of matched vectors x[n][k][c], y[n][k][c], unweighted: variance and
    covariance of each slot k over the batch n, x's and y's halved."""
    n, k, c = len(x), len(x[0]), len(x[0][0])
    mse = sum((x[i][s][d] - y[i][s][d]) ** 2 for i in range(n) for s in range(k)
              for d in range(c)) / (n * k * c)
    var = cov = 0.0
    for z in (x, y):
        v_sum = c_sum = 0.0
        for s in range(k):
            cols = [[z[i][s][d] for i in range(n)] for d in range(c)]
            cen = [[v - sum(col) / n for v in col] for col in cols]
            for d in range(c):
                v_sum += max(0.0, 1 - math.sqrt(sum(v * v for v in cen[d]) / (n - 1) + eps))
            c_sum += sum((sum(p * q for p, q in zip(cen[a], cen[b])) / (n - 1)) ** 2
                         for a in range(c) for b in range(c) if a != b) / c
        var += v_sum / (k * c) / 2
        cov += c_sum / k / 2
    return mse, var, cov


def plain_local(a, b, grid_a, grid_b, k_ab, k_ba, feature_top=None):
    """The authors' ``_local_loss`` of one pair written plainly, weights 25 / 25 / 1."""
    def dist(p, q):
        return [[math.dist(u, v) for v in q] for u in p]

    total = 0.0
    for kind in ("feature", "location"):
        for x, y, gx, gy, k in ((a, b, grid_a, grid_b, k_ab), (b, a, grid_b, grid_a, k_ba)):
            xs, ys = [], []
            for i in range(len(x)):
                if kind == "feature":
                    top = None if feature_top is None else feature_top[x is b]
                    pairs = plain_matches(dist(x[i], y[i]), top or len(x[i]))
                else:
                    pairs = plain_matches(dist(gx[i], gy[i]), k)
                xs.append([x[i][s] for s, _ in pairs])
                ys.append([y[i][t] for _, t in pairs])
            mse, var, cov = plain_terms(xs, ys)
            total += (25 * mse + 25 * var + cov) / 2
    return total


def _case(n=5, s=(2, 2), t=(2, 1), c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, s[0] * s[1], c, generator=g, dtype=torch.float64)
    b = torch.randn(n, t[0] * t[1], c, generator=g, dtype=torch.float64)
    boxes = torch.cat([torch.rand(2, n, 2, generator=g, dtype=torch.float64) * 10,
                       4 + torch.rand(2, n, 2, generator=g, dtype=torch.float64) * 6], dim=2)
    return a, b, crop_grid(boxes[0], *s), crop_grid(boxes[1], *t)


def test_crop_grid_is_the_centres_of_the_cells_in_the_image():
    grid = crop_grid(torch.tensor([[0.0, 0.0, 8.0, 8.0], [5.0, 4.0, 8.0, 12.0]]), 2, 3)
    rows = [[2, 2, 2, 6, 6, 6], [7, 7, 7, 11, 11, 11]]
    cols = [[4 / 3, 4, 20 / 3] * 2, [6, 10, 14] * 2]
    torch.testing.assert_close(grid, torch.tensor(
        [list(zip(r, c)) for r, c in zip(rows, cols)], dtype=torch.float32))


def test_location_matching_picks_the_nearest_location_on_planted_boxes():
    # view a covers (0, 0)-(8, 8), view b (5, 4)-(13, 12); 2 x 2 maps: a's centres (2|6, 2|6),
    # b's (7|11, 6|10); a3 = (6, 6) is 1 from b0 = (7, 6), a2 = (6, 2) sqrt(17), a1 5, a0 sqrt 41
    grid_a = crop_grid(torch.tensor([[0.0, 0.0, 8.0, 8.0]]), 2, 2)
    grid_b = crop_grid(torch.tensor([[5.0, 4.0, 8.0, 8.0]]), 2, 2)
    assert location_matches(grid_a, grid_b, 2).tolist() == [[[2, 0], [3, 0]]]
    assert location_matches(grid_a, grid_b).tolist() == [[[0, 0], [1, 0], [2, 0], [3, 0]]]
    # from b every location is nearest a3; b0 (7, 6) the nearest of all
    assert location_matches(grid_b, grid_a, 1).tolist() == [[[0, 3]]]
    assert location_matches(grid_b, grid_a, 3).tolist() == [[[0, 3], [1, 3], [2, 3]]]


def test_feature_matching_keeps_the_k_closest_pairs():
    a = 10 * torch.eye(4)[None]  # four far-apart embeddings
    perm = torch.tensor([2, 0, 3, 1])  # b's location perm[s] holds a's location s
    noise = torch.tensor([0.01, 0.5, 0.02, 0.3])[:, None] * torch.ones(4, 4)
    b = torch.empty_like(a)
    b[0, perm] = a[0] + noise
    assert feature_matches(a, b).tolist() == [[[0, 2], [1, 0], [2, 3], [3, 1]]]
    assert feature_matches(a, b, 2).tolist() == [[[0, 2], [2, 3]]]  # the two least noisy
    # the matching reads distances, not the dot product: a large distractor is not chosen
    far = torch.cat([b, 100 * a[:, :1]], dim=1)
    assert feature_matches(a, far, 1).tolist() == [[[0, 2]]]


@pytest.mark.parametrize("feature_top", [None, (2, 1)])
def test_local_loss_matches_its_formula_written_plainly(feature_top):
    a, b, grid_a, grid_b = _case()
    expected = plain_local(a.tolist(), b.tolist(), grid_a.tolist(), grid_b.tolist(), 3, 1,
                           feature_top)
    out = vicregl_local(a, b, location_matches(grid_a, grid_b, 3),
                        location_matches(grid_b, grid_a, 1), feature_top=feature_top)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), **TOL)
    module = get_loss("vicregl", feature_top=feature_top)
    assert isinstance(module, VICRegLLocalLoss)
    torch.testing.assert_close(module(a, b, location_matches(grid_a, grid_b, 3),
                                      location_matches(grid_b, grid_a, 1)), out)


def test_local_loss_gradcheck_float64():
    a, b, grid_a, grid_b = _case(n=4, c=2, seed=1)
    m_ab, m_ba = location_matches(grid_a, grid_b, 2), location_matches(grid_b, grid_a, 2)
    fn = get_loss("vicregl_local", feature_top=(3, 1))
    assert torch.autograd.gradcheck(lambda x, y: fn(x, y, m_ab, m_ba),
                                    (a.requires_grad_(), b.requires_grad_()))


def test_global_terms_of_two_views_are_vicreg_with_half_the_covariance():
    g = torch.Generator().manual_seed(2)
    z1, z2 = (torch.randn(6, 4, generator=g, dtype=torch.float64) for _ in range(2))
    inv, var, cov = vicregl_global_terms([z1, z2])
    torch.testing.assert_close(25 * inv + 25 * var + cov, vicreg(z1, z2, cov_coeff=0.5), **TOL)
    # multi-crop: the MSE over the pairs (i < 2, j != i), variance and covariance over views
    z3 = torch.randn(6, 4, generator=g, dtype=torch.float64)
    inv3, _, _ = vicregl_global_terms([z1, z2, z3])
    mse = [(p - q).pow(2).mean() for p, q in ((z1, z2), (z1, z3), (z2, z1), (z2, z3))]
    torch.testing.assert_close(inv3, sum(mse) / 4, **TOL)


def test_bad_inputs_raise_one_line_errors():
    a, b, grid_a, grid_b = _case()
    m = location_matches(grid_a, grid_b, 2)
    with pytest.raises(ValueError, match="num_matches"):
        location_matches(grid_a, grid_b, 5)  # 4 locations
    with pytest.raises(ValueError, match="matches_ab"):
        vicregl_local(a, b, m.int(), m)
    with pytest.raises(ValueError, match="same N"):
        vicregl_local(a, b[:3], m, m)
    with pytest.raises(ValueError, match="batch-level"):
        get_loss("vicregl_local", reduction="sum")
    with pytest.raises(ValueError, match="rows"):
        crop_grid(torch.zeros(2, 3), 2, 2)
