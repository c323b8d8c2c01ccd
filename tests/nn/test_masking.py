"""The masking pieces against their definitions: MAE's random masking (ratio, per-sample, the
kept set = the smallest noise, restore inverts exactly), iBOT's block masks (count bound,
rectangles of bounded aspect, the mean ratio), patchify's layout, and the masked ViT against
timm's forward and a hand-written MAE / iBOT encoder (and lightly's wrapper when installed)."""

from __future__ import annotations

import random

import pytest
import torch

from contrastive.nn.masked_vit import check_vit, masked_tokens
from contrastive.nn.masking import (
    block_mask,
    block_masks,
    patchify,
    random_masking,
    unpatchify,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("length,ratio", [(64, 0.75), (196, 0.75), (10, 0.5), (7, 0.9)])
def test_random_masking_keeps_the_smallest_noise_and_the_ratio(length, ratio):
    noise = torch.rand(5, length, generator=_gen())
    keep, restore, mask = random_masking(5, length, ratio, noise=noise)
    kept = max(1, int(length * (1 - ratio)))
    assert keep.shape == (5, kept) and mask.shape == (5, length) and mask.dtype == torch.bool
    assert (mask.sum(1) == length - kept).all()
    smallest = noise.topk(kept, dim=1, largest=False).indices
    assert (keep.sort(1).values == smallest.sort(1).values).all()
    assert not mask.gather(1, keep).any()  # kept positions are not masked
    assert (restore.argsort(1)[:, :kept] == keep).all()  # restore is the inverse order


def test_restore_puts_kept_and_removed_tokens_back_exactly():
    n, length, d = 4, 16, 3
    x = torch.randn(n, length, d, generator=_gen(1))
    keep, restore, mask = random_masking(n, length, 0.75, generator=_gen(2))
    order = restore.argsort(1)  # MAE's ids_shuffle
    shuffled = torch.gather(x, 1, order.unsqueeze(-1).expand(-1, -1, d))
    assert torch.equal(shuffled[:, :keep.shape[1]],
                       torch.gather(x, 1, keep.unsqueeze(-1).expand(-1, -1, d)))
    back = torch.gather(shuffled, 1, restore.unsqueeze(-1).expand(-1, -1, d))
    assert torch.equal(back, x)
    # MAE's decoder input: kept tokens then fillers, unshuffled: fillers exactly where masked
    filled = torch.cat([shuffled[:, :keep.shape[1]],
                        torch.full((n, length - keep.shape[1], d), 7.0)], dim=1)
    filled = torch.gather(filled, 1, restore.unsqueeze(-1).expand(-1, -1, d))
    assert torch.equal(filled[~mask], x[~mask]) and (filled[mask] == 7.0).all()


def test_random_masking_differs_per_sample_and_refuses_bad_input():
    _, _, mask = random_masking(8, 64, 0.75, generator=_gen(3))
    assert len({tuple(m.tolist()) for m in mask}) == 8
    with pytest.raises(ValueError, match="ratio must be in"):
        random_masking(2, 8, 1.0)
    with pytest.raises(ValueError, match="noise must be"):
        random_masking(2, 8, 0.5, noise=torch.rand(2, 9))


class _Scripted(random.Random):
    """An rng whose draws are given: uniform() returns ``uniforms`` in turn, randint ``ints``."""

    def __init__(self, uniforms, ints):
        super().__init__(0)
        self.uniforms, self.ints = list(uniforms), list(ints)

    def uniform(self, a, b):
        return self.uniforms.pop(0)

    def randint(self, a, b):
        value = self.ints.pop(0)
        assert a <= value <= b
        return value


@pytest.mark.parametrize("area,log_aspect,hw", [(16, 0.0, (4, 4)), (16, -1.2, (2, 7)),
                                                (16, 1.2, (7, 2))])
def test_block_mask_places_a_block_of_the_drawn_area_and_aspect(area, log_aspect, hw):
    """h = round(sqrt(A r)), w = round(sqrt(A / r)), at (top, left) = the two randint draws."""
    h, w = hw
    m = block_mask(14, 14, h * w, rng=_Scripted([area, log_aspect], [2, 3]))
    expected = torch.zeros(14, 14, dtype=torch.bool)
    expected[2:2 + h, 3:3 + w] = True
    assert torch.equal(m, expected)


def test_block_mask_refuses_a_block_that_overshoots_and_stops_after_ten_tries():
    # area 16 as 4 x 4 = 16 > count 10: refused ten times, nothing masked
    m = block_mask(14, 14, 10, rng=_Scripted([16, 0.0] * 10, [0, 0] * 10))
    assert not m.any()


@pytest.mark.parametrize("grid,ratio", [((14, 14), 0.3), ((8, 8), 0.4), ((8, 8), 0.1)])
def test_block_mask_never_exceeds_the_count_and_comes_close(grid, ratio):
    rng = random.Random(1)
    h, w = grid
    count = ratio * h * w
    sums = torch.tensor([int(block_mask(h, w, count, rng=rng).sum()) for _ in range(300)])
    assert (sums <= count).all() and (sums > 0).all()
    assert sums.float().mean() > 0.7 * count  # the loop fills most of the budget


def test_block_masks_batch_ratio_range_and_errors():
    rng = random.Random(2)
    masks = block_masks(64, 14, 14, ratio=0.3, ratio_var=0.2, rng=rng)
    assert masks.shape == (64, 196) and masks.dtype == torch.bool
    frac = masks.float().mean(1)
    assert (frac <= 0.5).all() and frac.std() > 0.05  # ratios drawn in [0.1, 0.5]
    assert block_masks(0, 4, 4).shape == (0, 16)
    with pytest.raises(ValueError, match="ratio_var <= ratio"):
        block_masks(2, 4, 4, ratio=0.1, ratio_var=0.2)


def test_patchify_layout_and_inverse():
    images = torch.randn(2, 3, 8, 12, generator=_gen(4))
    p = 4
    patches = patchify(images, p)
    assert patches.shape == (2, 6, 48)
    # patch (i, j) in row-major order; inside it (row a, column b, channel c)
    i, j, a, b, c = 1, 2, 3, 1, 2
    assert patches[1, i * 3 + j, (a * p + b) * 3 + c] == images[1, c, i * p + a, j * p + b]
    assert torch.equal(unpatchify(patches, p, 8, 12), images)
    with pytest.raises(ValueError, match="multiple of the patch size"):
        patchify(torch.zeros(1, 3, 10, 8), 4)


def test_patchify_equals_lightly():
    utils = pytest.importorskip("lightly.models.utils", reason="lightly is not installed")
    images = torch.randn(3, 3, 16, 16, generator=_gen(5))
    assert torch.equal(patchify(images, 4), utils.patchify(images, 4))


def _vit(**kw):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, num_classes=0,
                             depth=2, embed_dim=24, num_heads=2, **kw).double().eval()


def _by_hand(vit, images, keep=None, mask=None, token=None):
    """MAE's forward_encoder / iBOT's prepare_tokens written out on timm's parameters."""
    x = vit.patch_embed(images)
    if mask is not None:
        x = torch.where(mask[..., None], token, x)
    x = x + vit.pos_embed[:, 1:]
    if keep is not None:
        x = torch.stack([x[r, keep[r]] for r in range(x.shape[0])])
    cls = (vit.cls_token + vit.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
    x = torch.cat([cls, x], dim=1)
    for blk in vit.blocks:
        x = blk(x)
    return vit.norm(x)


def test_masked_tokens_without_masks_is_timms_forward_features():
    vit = _vit()
    images = torch.randn(3, 3, 16, 16, generator=_gen(6), dtype=torch.float64)
    torch.testing.assert_close(masked_tokens(vit, images), vit.forward_features(images))


def test_masked_tokens_drop_and_mask_token_match_the_papers_encoders():
    vit = _vit()
    images = torch.randn(3, 3, 16, 16, generator=_gen(7), dtype=torch.float64)
    keep, _, mask = random_masking(3, 16, 0.75, generator=_gen(8))
    out = masked_tokens(vit, images, keep=keep)
    assert out.shape == (3, 1 + 4, 24)
    torch.testing.assert_close(out, _by_hand(vit, images, keep=keep), rtol=1e-12, atol=1e-12)
    token = torch.randn(24, generator=_gen(9), dtype=torch.float64)
    out = masked_tokens(vit, images, mask=mask, mask_token=token)
    assert out.shape == (3, 17, 24)
    torch.testing.assert_close(out, _by_hand(vit, images, mask=mask, token=token),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="not both"):
        masked_tokens(vit, images, keep=keep, mask=mask, mask_token=token)
    with pytest.raises(ValueError, match="mask must be"):
        masked_tokens(vit, images, mask=mask[:, :5], mask_token=token)


def test_masked_tokens_equal_lightlys_masked_vit():
    mvt = pytest.importorskip("lightly.models.modules.masked_vision_transformer_timm",
                              reason="lightly is not installed")
    vit = _vit()
    theirs = mvt.MaskedVisionTransformerTIMM(vit=vit, weight_initialization="skip",
                                             pos_embed_initialization="skip").double()
    images = torch.randn(2, 3, 16, 16, generator=_gen(10), dtype=torch.float64)
    keep, _, mask = random_masking(2, 16, 0.75, generator=_gen(11))
    idx_keep = torch.cat([torch.zeros(2, 1, dtype=torch.long), keep + 1], dim=1)  # + class
    torch.testing.assert_close(masked_tokens(vit, images, keep=keep),
                               theirs.encode(images, idx_keep=idx_keep), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        theirs.mask_token.normal_()
    full = torch.cat([torch.zeros(2, 1, dtype=torch.bool), mask], dim=1)
    torch.testing.assert_close(
        masked_tokens(vit, images, mask=mask, mask_token=theirs.mask_token.reshape(-1)),
        theirs.encode(images, mask=full), rtol=1e-12, atol=1e-12)


def test_check_vit_names_the_problem():
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        check_vit(torch.nn.Linear(2, 2), "MAE")
    check_vit(_vit(), "MAE")
