"""SigLIP's sigmoid loss and DCLW against their papers' formulas (plain Python loops and floats,
nothing shared with contrastive.losses), gradcheck in float64 (SigLIP's scale and bias
included), invariances, and the exact chunked multi-process SigLIP simulated in one process.
The comparisons with open_clip and lightly are in test_vs_peers.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from contrastive.losses import DCLWLoss, SigLIPLoss, get_loss
from contrastive.losses import functional as LF


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def unit(a: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in a))
    return [x / n for x in a]


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def log_sigmoid(u: float) -> float:
    return -math.log1p(math.exp(-u)) if u >= 0 else u - math.log1p(math.exp(u))


def close(actual: torch.Tensor, expected: float | list, tol: float = 1e-10) -> None:
    torch.testing.assert_close(
        actual.double(), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol
    )


# ----------------------------------------------------------------------------- SigLIP


def ref_siglip_rows(img, txt, t, b, positives=True):
    """Row i: -sum_j log sigmoid(z_ij (t x_i.y_j + b)), z_ij = 1 iff i == j (paper eq. 1)."""
    out = []
    for i, xi in enumerate(img):
        row = 0.0
        for j, yj in enumerate(txt):
            z = 1.0 if (positives and i == j) else -1.0
            row -= log_sigmoid(z * (t * dot(unit(xi), unit(yj)) + b))
        out.append(row)
    return out


@pytest.mark.parametrize("t,b", [(10.0, -10.0), (3.0, 0.5), (50.0, -2.0)])
def test_siglip_equals_the_paper_formula(t, b):
    x, y = rand(5, 4, seed=1), rand(5, 4, seed=2)
    rows = ref_siglip_rows(x.tolist(), y.tolist(), t, b)
    close(LF.siglip(x, y, scale=t, bias=b, reduction="none"), rows)
    close(LF.siglip(x, y, scale=t, bias=b), sum(rows) / 5)  # -1/|B| sum_ij (Algorithm 1)
    close(LF.siglip(x, y, scale=t, bias=b, reduction="sum"), sum(rows))


def test_siglip_negative_only_chunk_equals_the_formula():
    x, y = rand(3, 4, seed=3), rand(5, 4, seed=4)  # a chunk of another process: no positive
    close(
        LF.siglip(x, y, scale=7.0, bias=-3.0, positives=False, reduction="none"),
        ref_siglip_rows(x.tolist(), y.tolist(), 7.0, -3.0, positives=False),
    )


def test_siglip_by_hand():
    # two orthogonal pairs, t = 1, b = 0: positives x.y = 1, negatives x.y = 0
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    expected = -(math.log(1 / (1 + math.exp(-1))) + math.log(0.5))  # per row; mean = the same
    close(LF.siglip(z, z.clone(), scale=1.0, bias=0.0), expected)


def test_siglip_module_holds_the_paper_init_and_learns_scale_and_bias():
    loss_fn = get_loss("siglip")
    assert isinstance(loss_fn, SigLIPLoss)
    params = dict(loss_fn.named_parameters())
    assert set(params) == {"log_scale", "bias"}
    assert params["log_scale"].item() == pytest.approx(math.log(10.0))  # t' = log 10
    assert params["bias"].item() == pytest.approx(-10.0)
    x, y = rand(4, 3, seed=5), rand(4, 3, seed=6)
    loss = loss_fn(x, y)
    close(loss, sum(ref_siglip_rows(x.tolist(), y.tolist(), 10.0, -10.0)) / 4, tol=1e-6)
    loss.backward()
    assert params["log_scale"].grad.abs() > 0 and params["bias"].grad.abs() > 0
    fixed = get_loss("siglip", scale_init=2.0, bias_init=1.0, learnable=False)
    assert not list(fixed.parameters())
    assert fixed.log_scale.item() == pytest.approx(math.log(2.0))


def test_siglip_gradcheck_float64_with_scale_and_bias():
    x, y = rand(4, 3, seed=7).requires_grad_(), rand(4, 3, seed=8).requires_grad_()
    log_t = torch.tensor(math.log(10.0), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-10.0, dtype=torch.float64, requires_grad=True)

    def f(x, y, log_t, b):
        return LF.siglip(x, y, scale=log_t.exp(), bias=b, reduction="none")

    assert torch.autograd.gradcheck(f, (x, y, log_t, b), eps=1e-6, atol=1e-6, rtol=1e-5)
    # and at a less saturated point, where every term has a sizable gradient
    log_t2 = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    b2 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x, y, log_t2, b2), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_siglip_bias_gradient_is_the_formula():
    # dL/db = 1/N sum_ij -z_ij (1 - sigmoid(z_ij l_ij)), l_ij = t x_i.y_j + b
    x, y, t = rand(4, 3, seed=9), rand(4, 3, seed=10), 2.0
    b = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    LF.siglip(x, y, scale=t, bias=b).backward()
    xs, ys = x.tolist(), y.tolist()
    g = 0.0
    for i in range(4):
        for j in range(4):
            z = 1.0 if i == j else -1.0
            lij = t * dot(unit(xs[i]), unit(ys[j])) + 0.7
            g += -z * (1 - 1 / (1 + math.exp(-z * lij)))
    close(b.grad, g / 4)


def test_siglip_invariances():
    x, y = rand(6, 4, seed=11), rand(6, 4, seed=12)
    base = LF.siglip(x, y, scale=5.0, bias=-1.0)
    # the loss is symmetric in the two towers (z and x.y are symmetric)
    close(LF.siglip(y, x, scale=5.0, bias=-1.0), base.item())
    # a common rotation of both towers leaves every x_i.y_j unchanged
    q, _ = torch.linalg.qr(rand(4, 4, seed=13))
    close(LF.siglip(x @ q, y @ q, scale=5.0, bias=-1.0), base.item())


def test_siglip_chunked_over_simulated_ranks_equals_one_process():
    """The paper's sec. 3.3: rank r scores its images against its own texts (positives) and
    against every other rank's text chunk (negatives only), each over the local N; the mean
    over ranks of the per-rank sums equals the one-process loss, values and gradients."""
    world, n = 3, 2
    x, y = rand(world * n, 4, seed=14).requires_grad_(), rand(world * n, 4, seed=15).requires_grad_()
    log_t = torch.tensor(1.2, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-0.4, dtype=torch.float64, requires_grad=True)
    kw = {"scale": log_t.exp(), "bias": b}

    def rank_loss(r: int, skip: int | None = None) -> torch.Tensor:
        xr = x[r * n : (r + 1) * n]
        loss = LF.siglip(xr, y[r * n : (r + 1) * n], **kw)
        for k in range(world):
            if k != r and k != skip:
                loss = loss + LF.siglip(xr, y[k * n : (k + 1) * n], positives=False, **kw)
        return loss

    single = LF.siglip(x, y, **kw)
    multi = torch.stack([rank_loss(r) for r in range(world)]).mean()
    torch.testing.assert_close(multi, single)
    inputs = [x, y, log_t, b]
    for g_multi, g_single in zip(
        torch.autograd.grad(multi, inputs, retain_graph=True),
        torch.autograd.grad(single, inputs, retain_graph=True),
    ):
        torch.testing.assert_close(g_multi, g_single)
    # the mutation: a ring that skips one peer's chunk is not the one-process loss
    skipped = torch.stack([rank_loss(r, skip=(r + 1) % world) for r in range(world)]).mean()
    assert not torch.allclose(skipped, single)


# ----------------------------------------------------------------------------- DCLW


def ref_dclw(z1, z2, tau, sigma):
    """Per-anchor DCLW over the 2N views (paper eq. 6 with the vMF weight of sec. 4)."""
    n = len(z1)
    z = [unit(v) for v in z1 + z2]
    c = [dot(z[i], z[i + n]) for i in range(n)]
    mean_e = sum(math.exp(ci / sigma) for ci in c) / n
    w = [2 - math.exp(ci / sigma) / mean_e for ci in c]
    out = []
    for i in range(2 * n):
        p = i + n if i < n else i - n
        neg = [math.exp(dot(z[i], z[k]) / tau) for k in range(2 * n) if k not in (i, p)]
        out.append(-w[i % n] * dot(z[i], z[p]) / tau + math.log(sum(neg)))
    return out


@pytest.mark.parametrize("tau,sigma", [(0.1, 0.5), (0.3, 2.0)])
def test_dclw_equals_the_paper_formula(tau, sigma):
    z1, z2 = rand(5, 3, seed=20), rand(5, 3, seed=21)
    expected = ref_dclw(z1.tolist(), z2.tolist(), tau, sigma)
    out = LF.dclw(z1, z2, temperature=tau, sigma=sigma, reduction="none")
    assert out.shape == (5, 2)
    close(out[:, 0], expected[:5])
    close(out[:, 1], expected[5:])
    close(LF.dclw(z1, z2, temperature=tau, sigma=sigma), sum(expected) / 10)
    close(get_loss("dclw", temperature=tau, sigma=sigma)(z1, z2), sum(expected) / 10)


def test_dclw_weights_average_one_and_equal_positives_give_dcl():
    # every positive pair at the same cosine: all weights are 1, DCLW == DCL
    z1 = torch.eye(4, dtype=torch.float64)
    z2 = torch.roll(torch.eye(4, dtype=torch.float64), 1, dims=1) + z1
    torch.testing.assert_close(LF.dclw(z1, z2), LF.dcl(z1, z2))
    # otherwise they differ (the test above can fail)
    z1, z2 = rand(4, 3, seed=22), rand(4, 3, seed=23)
    assert not torch.allclose(LF.dclw(z1, z2), LF.dcl(z1, z2))
    # a huge sigma flattens the weights to 1 as well
    torch.testing.assert_close(LF.dclw(z1, z2, sigma=1e9), LF.dcl(z1, z2))


def test_dclw_swapping_the_views_keeps_the_mean():
    z1, z2 = rand(5, 3, seed=24), rand(5, 3, seed=25)
    torch.testing.assert_close(LF.dclw(z2, z1), LF.dclw(z1, z2))


def test_dclw_gradcheck_float64_and_the_detached_weight():
    z1, z2 = rand(4, 3, seed=26).requires_grad_(), rand(4, 3, seed=27).requires_grad_()

    def f(a, b):
        return LF.dclw(a, b, temperature=0.3, reduction="none")

    assert torch.autograd.gradcheck(f, (z1, z2), eps=1e-6, atol=1e-6, rtol=1e-5)
    # detached: DCLW = DCL - 1/N sum_i (w_i - 1) c_i / tau with w held constant, values and grads
    c = torch.nn.functional.cosine_similarity(z1, z2, dim=1)
    w = (2 - 4 * torch.softmax(c / 0.5, dim=0)).detach()
    expected = LF.dcl(z1, z2, temperature=0.3) - ((w - 1) * c).sum() / 4 / 0.3
    d = LF.dclw(z1, z2, temperature=0.3, detach_weight=True)
    torch.testing.assert_close(d, expected)
    for gd, ge in zip(torch.autograd.grad(d, [z1, z2]), torch.autograd.grad(expected, [z1, z2])):
        torch.testing.assert_close(gd, ge)
    # same value as the default, different gradient
    a = LF.dclw(z1, z2, temperature=0.3)
    torch.testing.assert_close(a, d.detach())
    assert not torch.allclose(
        torch.autograd.grad(a, z1)[0],
        torch.autograd.grad(LF.dclw(z1, z2, temperature=0.3, detach_weight=True), z1)[0],
    )


@pytest.mark.parametrize("world", [2, 4])
def test_dclw_over_simulated_ranks_equals_one_process(world):
    total = 8
    z1, z2 = rand(total, 5, seed=28).requires_grad_(), rand(total, 5, seed=29).requires_grad_()
    single = LF.dclw(z1, z2, temperature=0.3)
    n = total // world
    multi = torch.stack([
        LF.dclw(z1[r * n : (r + 1) * n], z2[r * n : (r + 1) * n], z1_all=z1, z2_all=z2,
                positive_offset=r * n, temperature=0.3)
        for r in range(world)
    ]).mean()
    torch.testing.assert_close(multi, single)
    for gm, gs in zip(torch.autograd.grad(multi, [z1, z2], retain_graph=True),
                      torch.autograd.grad(single, [z1, z2], retain_graph=True)):
        torch.testing.assert_close(gm, gs)


def test_dclw_module_repr_and_bad_sigma():
    assert "sigma=0.5" in repr(DCLWLoss())
    for bad in (0.0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="`sigma`"):
            get_loss("dclw", sigma=bad)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: LF.siglip(rand(4, 3, seed=0), rand(5, 3, seed=0)), r"`text`.*\(4, 3\).*\(5, 3\)"),
        (lambda: LF.siglip(rand(4, 3, seed=0), rand(4, 2, seed=0)), r"\(4, 2\)"),
        (lambda: LF.siglip(rand(4, 3, seed=0), rand(4, 3, seed=0), scale=0.0), r"`scale`.*> 0"),
        (lambda: LF.siglip(rand(4, 3, seed=0), rand(4, 3, seed=0), bias=math.inf), r"`bias`"),
        (lambda: LF.siglip(rand(4, 3, seed=0), rand(4, 3, seed=0), reduction="x"), "reduction"),
        (lambda: SigLIPLoss(scale_init=-1.0), r"`scale`"),
        (lambda: LF.dclw(rand(1, 3, seed=0), rand(1, 3, seed=0)), "at least 2 samples"),
    ],
)
def test_bad_arguments_raise_one_line_value_errors(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)


CASE = Path(__file__).with_name("dist_case_siglip.py")  # the session's two-process launch runs it


@pytest.mark.distributed
def test_siglip_ring_over_two_processes_equals_one(tmp_path, run_two_ranks):
    """gloo, 2 processes x 4 pairs against 1 process x 8: the mean of the ring losses and the
    DDP-averaged gradients (images, texts, log-scale, bias) equal the one-process ones and those
    of the former ring that normalised every chunk on arrival; the ring that skips the peer does
    not (see dist_case_siglip.py)."""
    results = run_two_ranks(CASE, tmp_path)
    full, world = results[0]["full"], len(results)
    rings = [r["ring"] for r in results]
    tol = {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(torch.stack([r["loss"] for r in rings]).mean(), full["loss"], **tol)
    for rank, r in enumerate(rings):
        rows = slice(rank * 4, (rank + 1) * 4)
        # DDP divides each process's gradient by the world size
        torch.testing.assert_close(r["gx"] / world, full["gx"][rows], **tol)
        torch.testing.assert_close(r["gy"] / world, full["gy"][rows], **tol)
    for name in ("g_log_scale", "g_bias"):
        torch.testing.assert_close(torch.stack([r[name] for r in rings]).mean(), full[name], **tol)
    for r in results:  # normalised once before the exchange = normalised per chunk (the former)
        for name in ("loss", "gx", "gy", "g_log_scale", "g_bias"):
            torch.testing.assert_close(r["ring"][name], r["per_chunk"][name], rtol=1e-14,
                                       atol=1e-15)
    skipped = torch.stack([r["skipped"]["loss"] for r in results]).mean()
    assert (skipped - full["loss"]).abs() > 1e-3
