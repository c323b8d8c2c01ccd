"""SwAV (Sinkhorn-Knopp codes, swapped prediction), DINO and Deep InfoMax losses against their
formulas written plainly (loops, float64) and hand-computed cases; Sinkhorn and the DINO centre
over two real gloo processes equal one process with the whole batch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from contrastive.losses import get_loss
from contrastive.losses.clustering import dino, dino_center, sinkhorn_knopp, swav, swav_codes
from contrastive.losses.mutual_info import dim_local_global

REL = dict(rel=1e-12, abs=1e-12)  # float64: rounding of a few hundred operations is ~1e-15
TOL = dict(rtol=1e-12, atol=1e-12)
CASE = Path(__file__).with_name("dist_case_clustering.py")


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def sinkhorn_plain(scores, eps, iters):
    """The official algorithm, one process, entry by entry."""
    b, k = scores.shape
    q = [[math.exp(float(scores[i, j]) / eps) for i in range(b)] for j in range(k)]  # K x B
    total = sum(map(sum, q))
    q = [[v / total for v in row] for row in q]
    for _ in range(iters):
        q = [[v / sum(row) / k for v in row] for row in q]
        cols = [sum(q[j][i] for j in range(k)) for i in range(b)]
        q = [[q[j][i] / cols[i] / b for i in range(b)] for j in range(k)]
    return torch.tensor([[q[j][i] * b for j in range(k)] for i in range(b)], dtype=torch.float64)


def cross_view_plain(targets, logits, tau):
    b, t, _ = targets.shape
    v = logits.shape[1]
    out = []
    for n in range(b):
        terms = []
        for i in range(t):
            for j in range(v):
                if i != j:
                    logp = torch.log_softmax(logits[n, j] / tau, dim=0)
                    terms.append(-float((targets[n, i] * logp).sum()))
        out.append(sum(terms) / len(terms))
    return torch.tensor(out, dtype=torch.float64)


def test_sinkhorn_equals_the_official_algorithm_and_equipartitions():
    scores = torch.tanh(_rand(7, 4))
    torch.testing.assert_close(sinkhorn_knopp(scores), sinkhorn_plain(scores, 0.05, 3), **TOL)
    torch.testing.assert_close(sinkhorn_knopp(scores, epsilon=0.3, iterations=5),
                               sinkhorn_plain(scores, 0.3, 5), **TOL)
    q = sinkhorn_knopp(scores, epsilon=0.5, iterations=200)
    torch.testing.assert_close(q.sum(dim=1), torch.ones(7, dtype=torch.float64), **TOL)
    torch.testing.assert_close(q.sum(dim=0), torch.full((4,), 7 / 4, dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)  # converged equipartition
    # the max shift is exact: a constant added to every score changes nothing
    torch.testing.assert_close(sinkhorn_knopp(scores + 30.0), sinkhorn_knopp(scores), **TOL)
    assert torch.isfinite(sinkhorn_knopp(scores * 1000.0)).all()  # no overflow, no 0 / 0
    # cosine scores at a small epsilon in float32: e^(2 / 0.01) would overflow without the shift
    q32 = sinkhorn_knopp(scores.float(), epsilon=0.01)
    torch.testing.assert_close(q32.sum(dim=1), torch.ones(7), rtol=1e-5, atol=1e-5)


def test_swav_equals_swapped_prediction_formula():
    scores = torch.tanh(_rand(5, 4, 6, seed=1))  # 2 global + 2 local views, K = 6
    codes = torch.stack([sinkhorn_plain(scores[:, t], 0.05, 3) for t in range(2)], dim=1)
    expected = cross_view_plain(codes, scores, 0.1)
    torch.testing.assert_close(swav(scores, reduction="none"), expected, **TOL)
    torch.testing.assert_close(swav(scores, codes, reduction="none"), expected, **TOL)
    assert get_loss("swav")(scores).item() == pytest.approx(expected.mean().item(), **REL)
    # the codes are targets: no gradient flows through them when computed here
    s = scores.clone().requires_grad_()
    swav(s).backward()
    g_auto = s.grad.clone()
    s.grad = None
    swav(s, swav_codes_of(s.detach())).backward()
    torch.testing.assert_close(g_auto, s.grad, **TOL)


def swav_codes_of(scores):
    return torch.stack([swav_codes(scores[:, t]) for t in range(2)], dim=1)


def test_swav_queue_prepends_scores_and_drops_their_codes():
    scores, queued = torch.tanh(_rand(3, 2, 5, seed=2)), torch.tanh(_rand(8, 2, 5, seed=3))
    codes = torch.stack([sinkhorn_plain(torch.cat([queued[:, t], scores[:, t]]), 0.05, 3)[-3:]
                         for t in range(2)], dim=1)
    torch.testing.assert_close(swav(scores, queue_scores=queued, reduction="none"),
                               cross_view_plain(codes, scores, 0.1), **TOL)
    with pytest.raises(ValueError, match="queue_scores"):  # K differs from the scores'
        swav_codes(scores[:, 0], queue_scores=queued[:, 0, :4])


def test_dino_equals_formula_and_centre_update():
    student, teacher, center = _rand(4, 5, 6, seed=4), _rand(4, 2, 6, seed=5), _rand(6, seed=6)
    targets = torch.softmax((teacher - center) / 0.07, dim=2)
    expected = cross_view_plain(targets, student, 0.1)
    torch.testing.assert_close(dino(student, teacher, center, teacher_temperature=0.07,
                                    reduction="none"), expected, **TOL)
    loss = get_loss("dino")(student, teacher, center, teacher_temperature=0.07)
    assert loss.item() == pytest.approx(expected.mean().item(), **REL)
    # defaults of the paper and the official code
    mod = get_loss("dino")
    assert (mod.student_temperature, mod.teacher_temperature) == (0.1, 0.04)
    new = dino_center(center, teacher, momentum=0.9)
    torch.testing.assert_close(new, 0.9 * center + 0.1 * teacher.reshape(-1, 6).mean(0), **TOL)


def dim_plain(g, local, estimator):
    n, _, p = local.shape
    out = []
    for i in range(n):
        total = 0.0
        negs = [float(g[i] @ local[j, :, q]) for j in range(n) if j != i for q in range(p)]
        for q in range(p):
            pos = float(g[i] @ local[i, :, q])
            if estimator == "infonce":
                total += -pos + math.log(math.exp(pos) + sum(math.exp(s) for s in negs))
            else:
                total += math.log1p(math.exp(-pos))
        if estimator == "jsd":
            total = total / p + sum(math.log1p(math.exp(s)) for s in negs) / len(negs)
            out.append(total - 2 * math.log(2))
        else:
            out.append(total / p)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("estimator", ["infonce", "jsd"])
def test_dim_equals_formula(estimator):
    g, local = 0.5 * _rand(4, 3, seed=7), 0.5 * _rand(4, 3, 2, 3, seed=8)
    got = dim_local_global(g, local, estimator=estimator, reduction="none")
    torch.testing.assert_close(got, dim_plain(g, local.flatten(2), estimator), **TOL)
    mod = get_loss("dim", estimator=estimator)
    assert mod(g, local).item() == pytest.approx(got.mean().item(), **REL)


def test_dim_hand_cases():
    # equal scores: InfoNCE is log(1 + (N - 1) P) at every location; JSD is 2 log 2 - 2 log 2 = 0
    g, local = torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, 2, 4, dtype=torch.float64)
    assert dim_local_global(g, local).item() == pytest.approx(math.log(1 + 2 * 4), **REL)
    assert dim_local_global(g, local, estimator="jsd").item() == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="estimator"):
        get_loss("dim", estimator="mine")
    with pytest.raises(ValueError, match="N >= 2"):
        dim_local_global(g[:1], local[:1])


def test_bad_multiview_inputs_raise():
    with pytest.raises(ValueError, match="global views"):
        swav(torch.zeros(4, 1, 3))
    with pytest.raises(ValueError, match="T <= V"):
        dino(torch.zeros(4, 2, 3), torch.zeros(4, 3, 3))
    with pytest.raises(ValueError, match="center"):
        dino(torch.zeros(4, 2, 3), torch.zeros(4, 2, 3), torch.zeros(4))
    with pytest.raises(ValueError, match="epsilon"):
        sinkhorn_knopp(torch.zeros(4, 3), epsilon=0.0)
    with pytest.raises(ValueError, match="not initialised"):
        sinkhorn_knopp(torch.zeros(4, 3), distributed=True)


@pytest.mark.distributed
def test_sinkhorn_and_dino_centre_over_two_processes_equal_one(tmp_path, run_two_ranks):
    results = run_two_ranks(CASE, tmp_path)
    full = results[0]["full"]
    for rank, r in enumerate(results):
        rows = slice(rank * 4, (rank + 1) * 4)
        torch.testing.assert_close(r["codes"], full["codes"][rows], **TOL)
        torch.testing.assert_close(r["center"], full["center"], **TOL)
        # mutation check: the same halves without the all-reduce give other codes
        assert (r["codes_local"] - full["codes"][rows]).abs().max() > 1e-3
