"""Our losses against lightly's implementations of the same methods, same inputs, float64.

lightly is not a dependency: it is installed for ``benchmarks/bench_train.py`` (the ``bench``
extra). CI installs the ``dev`` extra only, so this module skips there (the reason says so);
run it where ``pip install -e .[bench]`` was done.

Where the two define the same formula the values agree to float64 rounding (rtol 1e-10: the
sums run in other orders, ~1e-15 relative; a wrong weight, eps or normalisation moves them by
far more). Where they differ by definition, the relation is written out and checked:

- BYOL: ours is the paper's symmetric ``(2 - 2 cos(p1, z2)) + (2 - 2 cos(p2, z1))``; lightly's
  example takes ``0.5 * (NegativeCosineSimilarity(p1, z2) + ...(p2, z1))`` = the mean of
  ``-cos``: ours = 4 + 4 x lightly's (same gradient direction, 4x the scale).
- NNCLR: ours is the paper's eq. 2, one direction per view (the nearest neighbour of z1 is the
  anchor, the other view's predictions the candidates: N - 1 negatives); lightly's example
  uses ``NTXentLoss(nn, p)``, which contrasts both ways over the 2N embeddings (2N - 2
  negatives, nearest neighbours among them). Different losses: checked only that they differ.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

lightly_loss = pytest.importorskip(
    "lightly.loss", reason="lightly is not installed: it is the benchmarks' comparison peer "
    "(pip install -e .[bench]), not a dependency; CI installs .[dev] only")

from contrastive.losses import get_loss  # noqa: E402
from contrastive.losses.clustering import dino, dino_center, swav, swav_codes  # noqa: E402

RTOL, ATOL = 1e-10, 1e-12


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def test_barlow_twins_equals_lightly():
    z1, z2 = _randn(16, 12, seed=0), _randn(16, 12, seed=1) + 0.5 * _randn(16, 12, seed=0)
    ours = get_loss("barlow_twins", lambd=0.0051)(z1, z2)
    theirs = lightly_loss.BarlowTwinsLoss(lambda_param=0.0051)(z1, z2)
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL)


def test_vicreg_equals_lightly():
    z1, z2 = _randn(16, 12, seed=2), 0.3 * _randn(16, 12, seed=3)  # some dims below std 1
    ours = get_loss("vicreg")(z1, z2)
    theirs = lightly_loss.VICRegLoss(lambda_param=25.0, mu_param=25.0, nu_param=1.0,
                                     eps=1e-4)(z1, z2)
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL)


def test_simsiam_equals_lightly_and_byol_is_an_affine_map_of_it():
    p1, p2, z1, z2 = (_randn(8, 10, seed=s) for s in range(4, 8))
    ncs = lightly_loss.NegativeCosineSimilarity()
    lightly_sym = 0.5 * (ncs(p1, z2) + ncs(p2, z1))
    simsiam = get_loss("simsiam")
    torch.testing.assert_close(simsiam(p1, z2) / 2 + simsiam(p2, z1) / 2, lightly_sym,
                               rtol=RTOL, atol=ATOL)
    byol = get_loss("byol")
    torch.testing.assert_close(byol(p1, z2) + byol(p2, z1), 4 + 4 * lightly_sym,
                               rtol=RTOL, atol=ATOL)


def test_swav_equals_lightly_multicrop():
    """2 global + 2 local views, codes by Sinkhorn-Knopp (eps 0.05, 3 iterations) from each
    global view: ours computes them in float64 after a max shift, lightly directly; equal."""
    protos = F.normalize(_randn(20, 8, seed=8), dim=1)
    scores = [F.normalize(_randn(12, 8, seed=9 + v), dim=1) @ protos.T for v in range(4)]
    stacked = torch.stack(scores, dim=1)  # B x V x K
    codes = torch.stack([swav_codes(stacked[:, t], epsilon=0.05, iterations=3)
                         for t in range(2)], dim=1)
    ours = swav(stacked, codes, temperature=0.1)
    theirs = lightly_loss.SwaVLoss(temperature=0.1, sinkhorn_iterations=3,
                                   sinkhorn_epsilon=0.05)(scores[:2], scores[2:])
    torch.testing.assert_close(ours, theirs.reshape(()), rtol=RTOL, atol=ATOL)
    assert torch.equal(ours, swav(stacked, temperature=0.1, epsilon=0.05, iterations=3))


def test_dino_loss_and_centre_equal_lightly():
    """Centre c, teacher temperature 0.04, student 0.1, 2 global + 1 local views; then both
    centres move by the same EMA (momentum 0.9) of the teacher outputs."""
    teacher = [_randn(6, 16, seed=20 + t) for t in range(2)]
    student = [_randn(6, 16, seed=30 + v) for v in range(3)]
    ref = lightly_loss.DINOLoss(output_dim=16, warmup_teacher_temp=0.04, teacher_temp=0.04,
                                warmup_teacher_temp_epochs=0, student_temp=0.1,
                                center_momentum=0.9).double()
    centre = 0.1 * _randn(16, seed=40)
    ref.center.data = centre.reshape(ref.center.shape).clone()
    theirs = ref(teacher, student, teacher_temp=0.04)
    ours = dino(torch.stack(student, dim=1), torch.stack(teacher, dim=1), centre,
                student_temperature=0.1, teacher_temperature=0.04)
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL)
    new = dino_center(centre, torch.stack(teacher, dim=1), momentum=0.9, distributed=False)
    torch.testing.assert_close(new, ref.center.reshape(-1), rtol=RTOL, atol=ATOL)


def test_nnclr_losses_differ_by_definition():
    """Ours (paper eq. 2, one direction, N - 1 negatives) is not lightly's NT-Xent over 2N."""
    nn1, p2 = F.normalize(_randn(8, 6, seed=50), dim=1), F.normalize(_randn(8, 6, seed=51), dim=1)
    ours = get_loss("infonce", temperature=0.2, normalize=False)(nn1, p2)
    theirs = lightly_loss.NTXentLoss(temperature=0.2)(nn1, p2)
    # the paper's formula, written plainly: -log softmax over the row of nn1 . p2^T / tau
    plain = -torch.log_softmax(nn1 @ p2.T / 0.2, dim=1).diagonal().mean()
    torch.testing.assert_close(ours, plain, rtol=RTOL, atol=ATOL)
    assert not torch.allclose(ours, theirs, rtol=1e-3)
