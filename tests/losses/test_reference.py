"""Every loss against its paper's formula (as each function's docstring in contrastive.losses
states it, with the paper), written out with plain Python loops and floats.

The references below never call contrastive.losses: they rebuild each formula term by term from
Python lists, so a bug shared by the implementation and the test is unlikely.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from contrastive.losses import functional as LF
from contrastive.losses import get_loss

# ----------------------------------------------------------------------------- plain-float maths


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def unit(a: list[float]) -> list[float]:
    n = math.sqrt(dot(a, a))
    return [x / n for x in a]


def cos(a: list[float], b: list[float]) -> float:
    return dot(unit(a), unit(b))


def logsumexp(xs: list[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def close(actual: torch.Tensor, expected: float | list, tol: float = 1e-10) -> None:
    expected_t = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual.double(), expected_t, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- InfoNCE


def ref_infonce(q, k, neg, tau, offset=0, normalize=True):
    """Per-query -log(exp(q.k+/tau) / sum over candidates), MoCo eq. 1."""
    f = unit if normalize else (lambda v: v)
    out = []
    for i, qi in enumerate(q):
        qi = f(qi)
        pos = dot(qi, f(k[offset + i])) / tau
        if neg is None:
            candidates = [dot(qi, f(kj)) / tau for kj in k]
        else:
            candidates = [pos] + [dot(qi, f(nj)) / tau for nj in neg]
        out.append(-(pos - logsumexp(candidates)))
    return out


def test_infonce_by_hand_two_dims():
    # q = k+ = e1, one negative e2, tau = 1: logits [1, 0] -> log(1 + e^-1)
    q = torch.tensor([[2.0, 0.0]])
    k = torch.tensor([[5.0, 0.0]])
    neg = torch.tensor([[0.0, 3.0]])
    out = LF.infonce(q, k, neg, temperature=1.0)
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    # in-batch, two orthogonal pairs at tau = 0.5: logits [[2, 0], [0, 2]] -> log(1 + e^-2) each
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = LF.infonce(q, q.clone(), temperature=0.5, reduction="none")
    torch.testing.assert_close(out, torch.full((2,), math.log(1 + math.exp(-2))))


@pytest.mark.parametrize("normalize", [True, False])
def test_infonce_with_negatives_loops(normalize):
    q, k, neg = rand(4, 5, seed=0), rand(4, 5, seed=1), rand(7, 5, seed=2)
    if not normalize:
        q, k, neg = F.normalize(q, dim=1), F.normalize(k, dim=1), F.normalize(neg, dim=1) * 0.5
    expected = ref_infonce(q.tolist(), k.tolist(), neg.tolist(), 0.2, normalize=normalize)
    out = LF.infonce(q, k, neg, temperature=0.2, normalize=normalize, reduction="none")
    close(out, expected)
    close(LF.infonce(q, k, neg, temperature=0.2, normalize=normalize), sum(expected) / 4)
    close(
        LF.infonce(q, k, neg, temperature=0.2, normalize=normalize, reduction="sum"), sum(expected)
    )


def test_infonce_in_batch_and_positive_offset_loops():
    q, k = rand(3, 4, seed=3), rand(7, 4, seed=4)
    for offset in (0, 2, 4):
        expected = ref_infonce(q.tolist(), k.tolist(), None, 0.3, offset=offset)
        close(LF.infonce(q, k, temperature=0.3, positive_offset=offset, reduction="none"), expected)
    # with a queue the offset only picks the positive
    neg = rand(5, 4, seed=5)
    expected = ref_infonce(q.tolist(), k.tolist(), neg.tolist(), 0.3, offset=3)
    close(LF.infonce(q, k, neg, temperature=0.3, positive_offset=3, reduction="none"), expected)


def test_infonce_equals_moco_pseudo_code():
    """Algorithm 1 of the MoCo paper, written out: queue kept as C x K, l_pos via bmm."""
    n, c, k_size, tau = 5, 6, 9, 0.07
    q = F.normalize(rand(n, c, seed=6), dim=1)
    k = F.normalize(rand(n, c, seed=7), dim=1)
    queue = F.normalize(rand(c, k_size, seed=8), dim=0)  # C x K as in the paper
    l_pos = torch.bmm(q.view(n, 1, c), k.view(n, c, 1)).view(n, 1)
    l_neg = torch.mm(q.view(n, c), queue.view(c, k_size))
    logits = torch.cat([l_pos, l_neg], dim=1) / tau
    labels = torch.zeros(n, dtype=torch.long)
    expected = F.cross_entropy(logits, labels)
    torch.testing.assert_close(LF.infonce(q, k, queue.T, temperature=tau), expected)
    torch.testing.assert_close(get_loss("infonce", temperature=tau)(q, k, queue.T), expected)


def test_infonce_symmetric_is_clip_average_of_both_directions():
    q, k, tau = rand(4, 3, seed=9), rand(4, 3, seed=10), 0.5
    q_dir = ref_infonce(q.tolist(), k.tolist(), None, tau)
    k_dir = ref_infonce(k.tolist(), q.tolist(), None, tau)
    expected = [(a + b) / 2 for a, b in zip(q_dir, k_dir)]
    close(LF.infonce(q, k, temperature=tau, symmetric=True, reduction="none"), expected)
    close(LF.infonce(q, k, temperature=tau, symmetric=True), sum(expected) / 4)


def test_infonce_learnable_temperature_starts_at_temperature_and_learns():
    q, k = rand(4, 3, seed=11), rand(4, 3, seed=12)
    fixed = get_loss("infonce", temperature=0.1, symmetric=True)(q, k)
    loss_fn = get_loss("infonce", temperature=0.1, symmetric=True, learnable_temperature=True)
    out = loss_fn(q, k)
    torch.testing.assert_close(out, fixed)
    out.backward()
    assert loss_fn.logit_scale.grad is not None and loss_fn.logit_scale.grad.abs() > 0
    with torch.no_grad():
        loss_fn.logit_scale.fill_(10.0)  # 1/tau = e^10 > 100: clamped to tau = 0.01
    assert float(loss_fn.current_temperature().detach()) == pytest.approx(0.01)


# ----------------------------------------------------------------------------- NT-Xent and DCL


def ref_two_view(z1, z2, tau, decoupled):
    """Per-anchor NT-Xent (or DCL) over the 2N views [z1; z2] (SimCLR eq. 1)."""
    z = z1 + z2
    n = len(z1)
    out = []
    for i in range(2 * n):
        p = i + n if i < n else i - n
        others = [k for k in range(2 * n) if k != i and not (decoupled and k == p)]
        out.append(-cos(z[i], z[p]) / tau + logsumexp([cos(z[i], z[k]) / tau for k in others]))
    return out


@pytest.mark.parametrize("decoupled", [False, True])
def test_ntxent_and_dcl_loops(decoupled):
    fn = LF.dcl if decoupled else LF.ntxent
    z1, z2, tau = rand(4, 3, seed=13), rand(4, 3, seed=14), 0.25
    expected = ref_two_view(z1.tolist(), z2.tolist(), tau, decoupled)
    out = fn(z1, z2, temperature=tau, reduction="none")
    assert out.shape == (4, 2)
    close(out[:, 0], expected[:4])  # anchors z1[i]
    close(out[:, 1], expected[4:])  # anchors z2[i]
    close(fn(z1, z2, temperature=tau), sum(expected) / 8)  # mean over the 2N anchors
    close(fn(z1, z2, temperature=tau, reduction="sum"), sum(expected))


def test_ntxent_by_hand_two_pairs():
    # two samples, both views identical, the two samples orthogonal, tau = 1:
    # anchor z1[0]: positive cos 1, negatives cos 0 (z1[1]) and 0 (z2[1]) -> -1 + log(e + 2)
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = LF.ntxent(z, z.clone(), temperature=1.0)
    assert out.item() == pytest.approx(-1 + math.log(math.e + 2), abs=1e-6)
    # DCL drops the positive from the denominator: -1 + log(2)
    assert LF.dcl(z, z.clone(), temperature=1.0).item() == pytest.approx(-1 + math.log(2), abs=1e-6)


def test_ntxent_equals_infonce_on_the_2n_concatenation_with_self_masked():
    z1, z2, tau = rand(5, 4, seed=15), rand(5, 4, seed=16), 0.5
    z = torch.cat([z1, z2])
    n2 = z.shape[0]
    # (a) one infonce call per anchor: positive = the other view, negatives = all but self, positive
    per_anchor = []
    for i in range(n2):
        p = (i + n2 // 2) % n2
        negatives = z[[j for j in range(n2) if j not in (i, p)]]
        per_anchor.append(LF.infonce(z[i : i + 1], z[p : p + 1], negatives, temperature=tau))
    expected = torch.stack(per_anchor).mean()
    torch.testing.assert_close(LF.ntxent(z1, z2, temperature=tau), expected)
    # (b) the same as one cross-entropy over the 2N x 2N similarity with the diagonal masked
    zn = F.normalize(z, dim=1)
    logits = (zn @ zn.T / tau).masked_fill(torch.eye(n2, dtype=torch.bool), float("-inf"))
    targets = torch.cat([torch.arange(n2 // 2) + n2 // 2, torch.arange(n2 // 2)])
    torch.testing.assert_close(LF.ntxent(z1, z2, temperature=tau), F.cross_entropy(logits, targets))


def test_ntxent_single_pair_has_zero_loss():
    z1, z2 = rand(1, 4, seed=17), rand(1, 4, seed=18)
    close(LF.ntxent(z1, z2), 0.0)  # the positive is the only candidate


# ----------------------------------------------------------------------------- COS-NCE


def ref_cosnce(s, t, negs):
    """negs[i] = list of the K negatives of sample i; the 2K form of LRC-BERT's COS-NCE (Fu et
    al., AAAI 2021, arXiv:2012.07335) given in contrastive.losses.functional.cosnce."""
    out = []
    for si, ti, ni in zip(s, t, negs):
        g = lambda a, b: 1 - cos(a, b)  # noqa: E731
        k = len(ni)
        out.append((2 * k - (sum(g(nk, si) for nk in ni) - k * g(ti, si))) / (2 * k) + g(ti, si))
    return out


def test_cosnce_by_hand():
    # z_S = z_T, the one negative opposite: g(z_T, z_S) = 0, g(n, z_S) = 2 -> (2 - 2)/2 + 0 = 0
    s = torch.tensor([[1.0, 0.0]])
    assert LF.cosnce(s, 3 * s, torch.tensor([[-2.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-7)
    # orthogonal teacher and negative: g = 1 each -> (2 - 0)/2 + 1 = 2
    out = LF.cosnce(s, torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, -1.0]]))
    assert out.item() == pytest.approx(2.0, abs=1e-6)


def test_cosnce_three_kinds_of_negatives():
    s, t = rand(4, 5, seed=19), rand(4, 5, seed=20)
    sl, tl = s.tolist(), t.tolist()
    # None: the other teacher rows
    negs = [[tl[j] for j in range(4) if j != i] for i in range(4)]
    close(LF.cosnce(s, t, reduction="none"), ref_cosnce(sl, tl, negs))
    # (K, D) shared
    shared = rand(3, 5, seed=21)
    close(LF.cosnce(s, t, shared, reduction="none"), ref_cosnce(sl, tl, [shared.tolist()] * 4))
    # (N, K, D) per sample
    per = rand(4, 2, 5, seed=22)
    expected = ref_cosnce(sl, tl, per.tolist())
    close(LF.cosnce(s, t, per, reduction="none"), expected)
    close(LF.cosnce(s, t, per), sum(expected) / 4)


def test_cosnce_without_normalize_uses_dot_products_of_unit_vectors():
    s, t, neg = (F.normalize(rand(3, 4, seed=s), dim=1) for s in (23, 24, 25))
    expected = LF.cosnce(s, t, neg)
    torch.testing.assert_close(LF.cosnce(s, t, neg, normalize=False), expected)
    # and it really skips the normalisation
    assert not torch.allclose(LF.cosnce(2 * s, t, neg, normalize=False), expected)


# ----------------------------------------------------------------------------- SupCon


def ref_supcon(features, labels, tau):
    """Khosla et al. eq. 2 (L^sup_out), anchors in sample-major order; 0 for no positive."""
    anchors = [(unit(view), labels[i]) for i, views in enumerate(features) for view in views]
    out = []
    for i, (zi, yi) in enumerate(anchors):
        others = [a for a in range(len(anchors)) if a != i]
        positives = [p for p in others if anchors[p][1] == yi]
        log_den = logsumexp([dot(zi, anchors[a][0]) / tau for a in others])
        if not positives:
            out.append(0.0)
            continue
        out.append(-sum(dot(zi, anchors[p][0]) / tau - log_den for p in positives) / len(positives))
    return out


@pytest.mark.parametrize(
    "labels,views",
    [([0, 1, 0, 2, 1], 2), ([3, 3, 3, 3, 3], 2), ([0, 1, 0, 2, 1], 1), ([0, 1, 0, 2, 1], 3)],
)
def test_supcon_loops(labels, views):
    feats, tau = rand(5, views, 4, seed=26), 0.3
    expected = ref_supcon(feats.tolist(), labels, tau)
    out = LF.supcon(feats, torch.tensor(labels), temperature=tau, reduction="none")
    assert out.shape == (5, views)
    close(out.flatten(), expected)
    close(LF.supcon(feats, torch.tensor(labels), temperature=tau), sum(expected) / len(expected))


def test_supcon_without_labels_is_ntxent_for_two_views():
    z1, z2 = rand(4, 3, seed=27), rand(4, 3, seed=28)
    feats = torch.stack([z1, z2], dim=1)
    expected = ref_two_view(z1.tolist(), z2.tolist(), 0.2, decoupled=False)
    close(LF.supcon(feats, temperature=0.2), sum(expected) / 8)


# ----------------------------------------------------------------------------- KD


def ref_kd(s, t, temp):
    out = []
    for si, ti in zip(s, t):
        lse_s, lse_t = logsumexp([x / temp for x in si]), logsumexp([x / temp for x in ti])
        log_ps = [x / temp - lse_s for x in si]
        log_pt = [x / temp - lse_t for x in ti]
        out.append(temp**2 * sum(math.exp(a) * (a - b) for a, b in zip(log_pt, log_ps)))
    return out


@pytest.mark.parametrize("temp", [1.0, 1.1, 4.0])
def test_kd_loops(temp):
    s, t = rand(3, 6, seed=29), 3 * rand(3, 6, seed=30)
    expected = ref_kd(s.tolist(), t.tolist(), temp)
    close(LF.kd(s, t, temperature=temp, reduction="none"), expected)
    close(LF.kd(s, t, temperature=temp), sum(expected) / 3)
    # the batch-mean KLDivLoss form used in most distillation code
    batchmean = F.kl_div(
        F.log_softmax(s / temp, dim=1), F.softmax(t / temp, dim=1), reduction="batchmean"
    )
    torch.testing.assert_close(LF.kd(s, t, temperature=temp), batchmean * temp**2)


def test_kd_is_zero_for_equal_logits_and_never_normalises():
    s = rand(2, 5, seed=31)
    close(LF.kd(s, s.clone()), 0.0)
    assert not torch.allclose(LF.kd(s, 2 * s), LF.kd(2 * s, 4 * s))
