"""MSN's and PMSN's loss (contrastive/losses/masked_siamese.py) against a hand-computed case,
the formula written plainly and a float64 transcription of the authors' ``init_msn_loss`` /
``distributed_sinkhorn`` (facebookresearch/msn ``src/losses.py``); the targets carry no
gradient; the mean prediction and Sinkhorn-Knopp over two gloo processes equal one process.
gradcheck in float64, half precision and permutation invariance: tests/losses/test_properties.py
(every registered loss)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from contrastive.losses import get_loss
from contrastive.losses.masked_siamese import msn, msn_targets, msn_terms, power_law_prior

TOL = dict(rtol=1e-12, atol=1e-12)
CASE = Path(__file__).with_name("dist_case_msn.py")


def _load(path: Path):
    """A helper module of the tests by its path (the suite imports in importlib mode)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


authors_loss = _load(Path(__file__).with_name("msn_reference.py")).authors_loss


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _scores(target, anchors, prototypes):
    """(B, V, K) and (B, K) cosines: anchors (V B, D) view-major, as the code stacks them."""
    b, p = len(target), F.normalize(prototypes, dim=1)
    z = anchors.reshape(-1, b, target.shape[1]).transpose(0, 1)
    return F.normalize(z, dim=2) @ p.T, F.normalize(target, dim=1) @ p.T


def _terms(scores, iterations=3, **kw):
    """msn_terms on (B, 1 + V, K) cosines, the target view first."""
    return msn_terms(scores[:, 1:], msn_targets(scores[:, 0], sinkhorn_iterations=iterations),
                     **kw)


def test_hand_computed_case():
    """K = 2, one image, one anchor: the target's cosines (0, 0) give t = (1/2, 1/2); the
    anchor's (0.1, 0) give p = (e, 1) / (e + 1) at tau 0.1; no Sinkhorn (one image)."""
    scores = torch.tensor([[[0.0, 0.0], [0.1, 0.0]]], dtype=torch.float64)
    e = math.e
    p0, p1 = e / (e + 1), 1 / (e + 1)
    ce = -0.5 * (math.log(p0) + math.log(p1))
    me_max = p0 * math.log(p0) + p1 * math.log(p1) + math.log(2)
    got_ce, got_reg = _terms(scores, 0)
    assert got_ce.item() == pytest.approx(ce, rel=1e-12)
    assert got_reg.item() == pytest.approx(me_max, rel=1e-12)
    targets = msn_targets(scores[:, 0], sinkhorn_iterations=0)
    assert msn(scores[:, 1:], targets, regularization_weight=2.0).item() == \
        pytest.approx(ce + 2 * me_max, rel=1e-12)


def test_sharpening_is_the_code_s_power_of_the_probabilities():
    """sharpen(softmax(s / 0.1), 0.25) = softmax(s / 0.025), entry by entry."""
    s = torch.tanh(_rand(3, 5))
    p = [[math.exp(float(v) / 0.1) for v in row] for row in s]
    sharp = [[v ** 4 for v in row] for row in p]
    want = torch.tensor([[v / sum(row) for v in row] for row in sharp], dtype=torch.float64)
    torch.testing.assert_close(msn_targets(s, sinkhorn_iterations=0), want, **TOL)


@pytest.mark.parametrize("sinkhorn", [True, False])
@pytest.mark.parametrize("views", [1, 3])
def test_equals_the_authors_loss(sinkhorn, views):
    b, d, k = 5, 6, 7
    target, anchors, prototypes = _rand(b, d, seed=1), _rand(views * b, d, seed=2), \
        _rand(k, d, seed=3)
    ce, rloss = authors_loss(anchors, target, prototypes, views, sinkhorn=sinkhorn)
    anchor_scores, target_scores = _scores(target, anchors, prototypes)
    targets = msn_targets(target_scores, sinkhorn_iterations=3 if sinkhorn else 0)
    got_ce, got_reg = msn_terms(anchor_scores, targets)
    torch.testing.assert_close(got_ce, ce, **TOL)
    torch.testing.assert_close(got_reg, rloss, **TOL)


def test_targets_carry_no_gradient():
    """Sharpening and Sinkhorn run without gradient, even on cosines that carry one (the
    prototypes are shared with the anchors): the prototypes' gradient is the anchors' alone."""
    anchors, target = _rand(4, 2, 6, seed=1), _rand(4, 6, seed=2)
    for iterations in (0, 3):
        prototypes = _rand(5, 6, seed=3).requires_grad_()
        p = F.normalize(prototypes, dim=1)
        targets = msn_targets(F.normalize(target, dim=1) @ p.T, sinkhorn_iterations=iterations)
        assert not targets.requires_grad
        msn(F.normalize(anchors, dim=2) @ p.T, targets).backward()
        frozen = prototypes.detach().clone().requires_grad_()
        q = F.normalize(frozen, dim=1)
        msn(F.normalize(anchors, dim=2) @ q.T, targets).backward()
        torch.testing.assert_close(prototypes.grad, frozen.grad, **TOL)


def test_pmsn_is_the_kl_to_the_power_law_and_uniform_is_me_max():
    scores = torch.tanh(_rand(6, 3, 5))
    prior = power_law_prior(5, 0.25, dtype=torch.float64)
    want_prior = torch.tensor([i ** -0.25 for i in range(1, 6)], dtype=torch.float64)
    torch.testing.assert_close(prior, want_prior / want_prior.sum(), **TOL)
    p = F.softmax(scores[:, 1:] / 0.1, dim=2).mean(dim=(0, 1))
    kl = sum(float(p[i]) * (math.log(float(p[i])) - math.log(float(prior[i]))) for i in range(5))
    assert _terms(scores, prior=prior)[1].item() == pytest.approx(kl, rel=1e-12)
    pmsn = get_loss("pmsn")
    assert pmsn(scores[:, 1:], pmsn.targets(scores[:, 0])).item() == pytest.approx(
        _terms(scores, prior=prior)[0].item() + kl, rel=1e-12)
    uniform = power_law_prior(5, 0.0, dtype=torch.float64)
    torch.testing.assert_close(_terms(scores, prior=uniform)[1], _terms(scores)[1], **TOL)
    targets = msn_targets(scores[:, 0])
    torch.testing.assert_close(get_loss("pmsn", power_law_exponent=0.0)(scores[:, 1:], targets),
                               get_loss("msn")(scores[:, 1:], targets), **TOL)


@pytest.mark.parametrize("kwargs, match", [
    (dict(regularization_weight=-1.0), "regularization_weight"),
    (dict(prior=torch.ones(4) / 4), "prior"),
    (dict(reduction="none"), "batch-level"),
])
def test_bad_arguments_raise_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        msn(torch.zeros(2, 2, 5), torch.ones(2, 5) / 5, **kwargs)
    with pytest.raises(ValueError, match="targets"):
        msn(torch.zeros(2, 2, 5), torch.ones(3, 5) / 5)
    for bad, match in ((dict(sharpen_temperature=0.0), "sharpen_temperature"),
                       (dict(sinkhorn_iterations=-1), "sinkhorn_iterations")):
        with pytest.raises(ValueError, match=match):
            msn_targets(torch.zeros(2, 5), **bad)


@pytest.mark.distributed
def test_mean_prediction_and_sinkhorn_over_two_processes_equal_one(tmp_path, run_two_ranks):
    """Each rank's loss on its half, its gradient averaged over the ranks (DDP's rule), equal
    the one-process loss and gradient on the whole batch; the mean prediction taken per process
    (distributed=False) does not."""
    ranks = run_two_ranks(CASE, tmp_path)
    ref = ranks[0]["full"]
    for name in ("sinkhorn", "me_max"):
        losses = torch.stack([r[name]["loss"] for r in ranks])
        torch.testing.assert_close(losses.mean(), ref[name]["loss"], **TOL)
        grads = torch.cat([r[name]["grad"] for r in ranks]) / len(ranks)
        torch.testing.assert_close(grads, ref[name]["grad"], **TOL)
        local = torch.cat([r[name + "_local"]["grad"] for r in ranks]) / len(ranks)
        assert (local - ref[name]["grad"]).abs().max() > 1e-6
