"""I-JEPA's loss (the registry's ``ijepa``): a hand-computed case, the authors' ``F.smooth_l1_loss``
(facebookresearch/ijepa ``src/train.py`` line 311) in float64, the paper's l2, gradcheck, the
errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from contrastive.losses import IJEPALoss, get_loss
from contrastive.losses.regression import ijepa


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_hand_computed_case():
    # two rows of one patch of two channels; errors 0.5, 3 | -2, 0
    p = torch.tensor([[[1.5, 4.0]], [[0.0, 1.0]]])
    z = torch.tensor([[[1.0, 1.0]], [[2.0, 1.0]]])
    # smooth l1 (beta 1): 0.5^2 / 2 = 0.125, 3 - 0.5 = 2.5 | 2 - 0.5 = 1.5, 0
    torch.testing.assert_close(get_loss("ijepa", reduction="none")(p, z),
                               torch.tensor([(0.125 + 2.5) / 2, 1.5 / 2]))
    torch.testing.assert_close(get_loss("ijepa")(p, z), torch.tensor((1.3125 + 0.75) / 2))
    # beta 4: 0.5^2 / 8, 3^2 / 8 | 2^2 / 8, 0
    torch.testing.assert_close(ijepa(p, z, beta=4.0, reduction="none"),
                               torch.tensor([(0.25 + 9) / 16, 4 / 16]))
    # the paper's l2: squared errors
    torch.testing.assert_close(ijepa(p, z, distance="l2", reduction="sum"),
                               torch.tensor((0.25 + 9) / 2 + 4 / 2))


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_codes_smooth_l1_float64(seed):
    g = _gen(seed)
    p = torch.randn(8, 5, 6, generator=g, dtype=torch.float64) * 2
    z = torch.randn(8, 5, 6, generator=g, dtype=torch.float64)
    ours = IJEPALoss()(p, z)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, F.smooth_l1_loss(p, z), rtol=1e-14, atol=0)
    torch.testing.assert_close(ijepa(p, z, distance="l2"), F.mse_loss(p, z), rtol=1e-14, atol=0)


@pytest.mark.parametrize("distance", ["smooth_l1", "l2"])
def test_gradcheck_float64(distance):
    g = _gen(2)
    p = torch.randn(3, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(3, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ijepa(a, b, distance=distance), (p, z))


def test_bf16_inputs_give_float32():
    p, z = (t.bfloat16() for t in IJEPALoss.example_inputs(generator=_gen(3)))
    assert IJEPALoss()(p, z).dtype == torch.float32


def test_errors_name_the_problem():
    p = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="same non-empty shape"):
        ijepa(p, p[:, :2])
    with pytest.raises(ValueError, match=r"\(N, K, D\)"):
        ijepa(p[0], p[0])
    with pytest.raises(ValueError, match="distance"):
        ijepa(p, p, distance="l1")
    with pytest.raises(ValueError, match="beta"):
        get_loss("ijepa", beta=0.0)
