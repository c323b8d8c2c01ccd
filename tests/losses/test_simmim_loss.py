"""SimMIM's loss (the registry's ``simmim``): a hand-computed case, the authors' image-domain
formula (microsoft/SimMIM ``models/simmim.py``, ``SimMIM.forward``) in float64, gradcheck, and
the errors."""

from __future__ import annotations

import pytest
import torch

from contrastive.losses import SimMIMLoss, get_loss
from contrastive.losses.reconstruction import masked_reconstruction
from contrastive.nn.masking import patchify


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_hand_computed_case():
    # two images of two patches of two values; image 0 masks patch 1, image 1 both patches
    target = torch.tensor([[[1.0, 2.0], [3.0, 5.0]], [[0.0, 1.0], [2.0, -2.0]]])
    pred = torch.tensor([[[9.0, 9.0], [4.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]]])
    mask = torch.tensor([[False, True], [True, True]])
    # image 0: (|4 - 3| + |1 - 5|) / 2 = 2.5 (patch 0 is visible: not counted);
    # image 1: ((1 + 0) / 2 + (2 + 2) / 2) / 2 = 1.25
    loss = get_loss("simmim", reduction="none")(pred, target, mask)
    torch.testing.assert_close(loss, torch.tensor([2.5, 1.25]))
    torch.testing.assert_close(get_loss("simmim")(pred, target, mask), torch.tensor(1.875))


def _code_loss(x, x_rec, mask, patch_size):
    """``SimMIM.forward`` after the decoder, as the code writes it (mask (N, h, w), 1 = masked)."""
    in_chans = x.shape[1]
    mask = mask.repeat_interleave(patch_size, 1).repeat_interleave(patch_size, 2).unsqueeze(1)
    loss_recon = torch.nn.functional.l1_loss(x, x_rec, reduction="none")
    return (loss_recon * mask).sum() / (mask.sum() + 1e-5) / in_chans


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_codes_formula_float64(seed):
    x = torch.randn(4, 3, 16, 16, generator=_gen(seed), dtype=torch.float64)
    x_rec = torch.randn(4, 3, 16, 16, generator=_gen(seed + 10), dtype=torch.float64)
    # the same number of masked patches per image (SimMIM's mask generator: always)
    mask = torch.rand(4, 16, generator=_gen(seed + 20)).argsort(1).argsort(1) < 10
    ours = masked_reconstruction(patchify(x_rec, 4), patchify(x, 4), mask, norm_pix=False,
                                 distance="l1")
    theirs = _code_loss(x, x_rec, mask.view(4, 4, 4).double(), 4)
    # the code's + 1e-5 in the count: a relative 1e-5 / 640 masked pixels here
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=0)
    assert not torch.allclose(ours, _code_loss(x, x_rec, (~mask).view(4, 4, 4).double(), 4))


def test_gradcheck_float64():
    pred = torch.randn(3, 6, 12, generator=_gen(3), dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 6, 12, generator=_gen(4), dtype=torch.float64, requires_grad=True)
    mask = torch.rand(3, 6, generator=_gen(5)) < 0.6
    for norm_pix in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, n=norm_pix: SimMIMLoss(norm_pix=n, reduction="none")(a, b, mask),
            (pred, target))


def test_defaults_and_errors():
    loss = get_loss("simmim")
    assert (loss.distance, loss.norm_pix) == ("l1", False) and "norm_pix=False" in repr(loss)
    assert get_loss("mae").distance == "l2"
    x = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="distance"):
        masked_reconstruction(x, x, torch.ones(2, 3, dtype=torch.bool), distance="l3")
    with pytest.raises(ValueError, match="SimMIMLoss: eps"):
        SimMIMLoss(eps=0)
