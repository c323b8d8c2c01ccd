"""iBOT's patch loss and KoLeo against float64 formulas written from the papers' code, gradcheck,
and lightly's ``IBOTPatchLoss`` / ``KoLeoLoss`` on the same inputs (skipped without lightly)."""

from __future__ import annotations

import math

import pytest
import torch

from contrastive.losses import get_loss
from contrastive.losses.dinov2 import ibot_patch, koleo
from contrastive.nn.masking import block_masks


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _masks(n: int, seed: int) -> torch.Tensor:
    import random

    m = block_masks(n, 4, 4, ratio=0.4, ratio_var=0.2, rng=random.Random(seed))
    m[-1] = False  # an image without masks counts in the mean with 0 (iBOT's clamp(min=1))
    return m


def _ibot_by_hand(s, t, mask, center, tau_s, tau_t):
    """bytedance/ibot main_ibot.py iBOTLoss, loss2, one (student view, teacher view) pair."""
    n = s.shape[0]
    total = 0.0
    for b in range(n):
        per = []
        for j in range(s.shape[1]):
            if mask[b, j]:
                q = torch.softmax((t[b, j] - center) / tau_t, -1)
                per.append(-(q * torch.log_softmax(s[b, j] / tau_s, -1)).sum())
        total = total + (sum(per) / len(per) if per else 0.0)
    return total / n


def test_ibot_patch_equals_the_codes_formula_float64():
    s, t, c = _randn(5, 16, 7, seed=0), _randn(5, 16, 7, seed=1), _randn(7, seed=2)
    mask = _masks(5, 3)
    ours = ibot_patch(s, t, mask, c, student_temperature=0.1, teacher_temperature=0.07)
    torch.testing.assert_close(ours, _ibot_by_hand(s, t, mask, c, 0.1, 0.07), rtol=1e-12,
                               atol=1e-12)
    per = ibot_patch(s, t, mask, c, reduction="none")
    assert per[-1] == 0 and per.shape == (5,)


def test_ibot_patch_gradcheck():
    s = _randn(3, 6, 5, seed=4).requires_grad_()
    t = _randn(3, 6, 5, seed=5).requires_grad_()
    mask = torch.rand(3, 6, generator=torch.Generator().manual_seed(6)) > 0.5
    assert torch.autograd.gradcheck(lambda a, b: ibot_patch(a, b, mask, reduction="none"), (s, t))


def _koleo_by_hand(x, eps=1e-8):
    u = x / x.norm(dim=1, keepdim=True).clamp_min(eps)
    out = []
    for i in range(u.shape[0]):
        d = [(u[i] - u[j]).norm() for j in range(u.shape[0]) if j != i]
        j = min((k for k in range(u.shape[0]) if k != i), key=lambda k: (u[i] - u[k]).norm())
        out.append(-math.log(float((u[i] - u[j] + eps).norm()) + eps))
        assert float((u[i] - u[j]).norm()) == pytest.approx(float(min(d)))
    return torch.tensor(out, dtype=torch.float64)


def test_koleo_equals_the_formula_and_gradcheck():
    x = _randn(7, 5, seed=7)
    torch.testing.assert_close(koleo(x, reduction="none"), _koleo_by_hand(x), rtol=1e-12,
                               atol=1e-12)
    assert torch.autograd.gradcheck(lambda a: koleo(a, reduction="none"),
                                    (x.clone().requires_grad_(),))
    spread, close = _randn(8, 4, seed=8), _randn(1, 4, seed=9) + 1e-3 * _randn(8, 4, seed=10)
    assert koleo(spread) < koleo(close)  # it penalises near neighbours
    with pytest.raises(ValueError, match="at least 2 rows"):
        koleo(x[:1])


def test_equal_to_lightly_float64():
    lightly_loss = pytest.importorskip("lightly.loss", reason="lightly is not installed")
    x = _randn(9, 6, seed=11)
    torch.testing.assert_close(get_loss("koleo")(x), lightly_loss.KoLeoLoss()(x), rtol=1e-12,
                               atol=1e-12)
    s, t = _randn(4, 16, 7, seed=12), _randn(4, 16, 7, seed=13)
    mask = _masks(4, 14)
    theirs = lightly_loss.IBOTPatchLoss(output_dim=7, teacher_temp=0.04, student_temp=0.1).double()
    expected = theirs(t[mask], s[mask], mask.reshape(4, 4, 4))  # centre 0 on the first call
    ours = get_loss("ibot_patch", teacher_temperature=0.04)(s, t, mask)
    # lightly computes the per-image weights 1 / count in float32 (the reciprocal of an integer
    # count, torch's default dtype) and makes the teacher temperature a float32 tensor: 1e-8
    # relative (measured 1.1e-8); a wrong weighting or temperature moves it by far more
    torch.testing.assert_close(ours, expected, rtol=1e-7, atol=0)
    assert not torch.isclose(get_loss("ibot_patch")(s, t, mask), expected, rtol=1e-3)


def test_bad_temperatures_are_refused():
    with pytest.raises(ValueError, match="temperatures"):
        get_loss("ibot_patch", student_temperature=0.0)
