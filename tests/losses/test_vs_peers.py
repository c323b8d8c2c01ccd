"""SigLIP against open_clip's ``SigLipLoss`` and DCL / DCLW against lightly's ``DCLLoss`` /
``DCLWLoss``: same inputs, float64, values and gradients.

Neither peer is a dependency: ``pip install -e .[compare]`` installs both (test-only); each test
is skipped with its reason when its peer is absent.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from contrastive.losses import functional as LF
from contrastive.losses import get_loss

SKIP = "is not installed: a test-only comparison peer (pip install -e .[compare])"


def rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("log_t,b", [(math.log(10.0), -10.0), (0.7, 0.4)])
def test_siglip_equals_open_clip(log_t, b):
    open_clip_loss = pytest.importorskip("open_clip.loss", reason=f"open-clip-torch {SKIP}")
    x, y = rand(6, 5, seed=1), rand(6, 5, seed=2)
    t1 = torch.tensor(log_t, dtype=torch.float64, requires_grad=True)
    b1 = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    t2 = t1.detach().clone().requires_grad_()
    b2 = b1.detach().clone().requires_grad_()
    ours = LF.siglip(x, y, scale=t1.exp(), bias=b1)
    # open_clip takes the normalised features and the exponentiated scale (as its model returns)
    theirs = open_clip_loss.SigLipLoss()(
        F.normalize(x, dim=1), F.normalize(y, dim=1), t2.exp(), b2
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    g_ours = torch.autograd.grad(ours, [x, y, t1, b1])
    g_theirs = torch.autograd.grad(theirs, [x, y, t2, b2])
    for a, c in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


def test_siglip_module_equals_open_clip_at_the_paper_init():
    open_clip_loss = pytest.importorskip("open_clip.loss", reason=f"open-clip-torch {SKIP}")
    x, y = rand(4, 3, seed=3), rand(4, 3, seed=4)
    ours = get_loss("siglip").double()(x, y)
    theirs = open_clip_loss.SigLipLoss()(
        F.normalize(x, dim=1), F.normalize(y, dim=1),
        torch.tensor(10.0, dtype=torch.float64), torch.tensor(-10.0, dtype=torch.float64),
    )
    # the module's log_scale parameter is float32 log(10): 1e-9 relative from the float64 init
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=0)


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")  # lightly's
@pytest.mark.parametrize("weighted", [False, True], ids=["dcl", "dclw"])
def test_dcl_and_dclw_equal_lightly(weighted):
    lightly_loss = pytest.importorskip("lightly.loss", reason=f"lightly {SKIP}")
    z1, z2 = rand(6, 5, seed=5), rand(6, 5, seed=6)
    tau = 0.2
    if weighted:
        # lightly detaches the weight: compare with detach_weight=True, gradients included
        ours = LF.dclw(z1, z2, temperature=tau, sigma=0.5, detach_weight=True)
        theirs = lightly_loss.DCLWLoss(temperature=tau, sigma=0.5)(z1, z2)
    else:
        ours = LF.dcl(z1, z2, temperature=tau)
        theirs = lightly_loss.DCLLoss(temperature=tau)(z1, z2)
    # lightly: 0.5 * (mean over the z1 anchors + mean over the z2 anchors) = our mean over 2N
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-12, atol=1e-12)
    for a, c in zip(torch.autograd.grad(ours, [z1, z2]), torch.autograd.grad(theirs, [z1, z2])):
        torch.testing.assert_close(a, c.to(a.dtype), rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")  # lightly's
def test_the_speed_benchmark_times_equal_losses():
    """benchmarks/bench_peer_losses.py on a tiny batch: every timed pair gives the same fp32
    loss (the script's own gate), one row per loss and precision."""
    import argparse
    import importlib.util
    from pathlib import Path

    pytest.importorskip("lightly.loss", reason=f"lightly {SKIP}")
    pytest.importorskip("open_clip.loss", reason=f"open-clip-torch {SKIP}")
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_peer_losses.py"
    spec = importlib.util.spec_from_file_location("bench_peer_losses", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.measure(argparse.Namespace(batches=[8], dim=16, siglip_dim=16, rounds=1,
                                            iters=1, json=True,
                                            losses=["dcl", "siglip", "msn"]))
    fp32 = [r for r in rows if r["precision"] == "fp32"]
    assert [r["loss"] for r in fp32] == ["DCL", "DCLW", "SigLIP", "MSN", "PMSN"]
    for r in fp32:  # PMSN's KL runs the other way round in lightly (msn_pairs)
        if r["loss"] != "PMSN":
            assert r["loss_ours"] == pytest.approx(r["loss_peer"], rel=1e-5), r
