"""I-JEPA: the multi-block masks against the authors' collator (facebookresearch/ijepa
``src/masks/multiblock.py``), seeded as theirs; the target branch (EMA, no gradient, layer norm);
three SGD steps against the authors' forward written out (``src/train.py``,
``src/models/vision_transformer.py``) in float64, with their momentum schedule; the refused
accumulation, the presets and the errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from contrastive.methods import IJEPA, get_method
from contrastive.nn import linear_momentum
from contrastive.nn.masking import MultiBlock, block_size, multiblock_masks

VIT = dict(img_size=16, patch_size=2, embed_dim=16, depth=1, num_heads=2, class_token=False,
           global_pool="avg", fc_norm=False)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tiny(**kw) -> IJEPA:
    torch.manual_seed(0)
    return IJEPA("timm:vit_tiny_patch16_224", **{"predictor_dim": 8, "predictor_depth": 1,
                                                 "min_keep": 4, **kw}, encoder_kwargs=VIT)


def _code_block_size(generator, scale, aspect_ratio_scale, height, width):
    """``MaskCollator._sample_block_size`` as the code writes it (lines 55-72)."""
    _rand = torch.rand(1, generator=generator).item()
    min_s, max_s = scale
    mask_scale = min_s + _rand * (max_s - min_s)
    max_keep = int(height * width * mask_scale)
    min_ar, max_ar = aspect_ratio_scale
    aspect_ratio = min_ar + _rand * (max_ar - min_ar)
    h = int(round(math.sqrt(max_keep * aspect_ratio)))
    w = int(round(math.sqrt(max_keep / aspect_ratio)))
    while h >= height:
        h -= 1
    while w >= width:
        w -= 1
    return (h, w)


def test_block_sizes_are_the_codes_seeded_by_the_counter():
    for step in range(40):  # the code: g.manual_seed(self.step()); pred size, then enc size
        ours, code = _gen(step), _gen(step)
        for scale, aspect in (((0.15, 0.2), (0.75, 1.5)), ((0.85, 1.0), (1.0, 1.0))):
            assert block_size(ours, scale, aspect, 16, 16) == _code_block_size(
                code, scale, aspect, 16, 16)


def _grid(indices, n_patches=256):
    out = torch.zeros(*indices.shape[:-1], n_patches, dtype=torch.bool)
    return out.scatter(-1, indices, True)


def test_masks_have_the_configured_blocks_and_the_context_avoids_the_targets():
    """The ViT-H/14 grid (16 x 16): each target a whole h x w rectangle of scale 0.15-0.2 and
    aspect 0.75-1.5 (h / w up to rounding), off the last row and column; the context inside one
    square block, without any target patch, cut to the batch's smallest; sizes shared by the
    batch."""
    for step in range(12):
        m = multiblock_masks(8, 16, 16, sizes=_gen(step), positions=_gen(100 + step))
        targets = _grid(m.targets).view(4, 8, 16, 16)
        rows, cols = targets.any(3), targets.any(2)
        h, w = int(rows[0, 0].sum()), int(cols[0, 0].sum())
        assert (rows.sum(-1) == h).all() and (cols.sum(-1) == w).all()  # one size a batch
        assert (targets.flatten(2).sum(-1) == h * w).all()  # full rectangles
        assert int(256 * 0.15) - 5 <= h * w <= int(256 * 0.2) + 5  # rounding of the sides
        assert 0.75 - 0.25 <= h / w <= 1.5 + 0.25
        assert not rows[..., -1].any() and not cols[..., -1].any()  # randint(0, H - h)
        context = _grid(m.context).view(8, 16, 16)
        assert not (context.unsqueeze(0) & targets).any()
        assert m.context.shape[1] > 10  # min_keep
        assert (m.context.diff(dim=1) > 0).all()  # ascending, as torch.nonzero gives them
        c_rows, c_cols = context.any(2), context.any(1)
        assert (c_rows.sum(1) <= 15).all() and (c_cols.sum(1) <= 15).all()


def test_a_grid_too_small_for_min_keep_is_refused_when_built():
    """The smallest target block the draws give on the 8 x 8 grid is 9 patches: min_keep 8
    builds, min_keep 9 is refused by the constructor (one line), not at a random later step."""
    smallest = min(h * w for h, w in (block_size(_gen(s), (0.15, 0.2), (0.75, 1.5), 8, 8)
                                      for s in range(500)))
    assert smallest == 9
    tiny(min_keep=smallest - 1)
    with pytest.raises(ValueError, match="min_keep=9: lower min_keep"):
        tiny(min_keep=smallest)


def test_a_crowded_context_drops_the_last_targets_constraint():
    """Targets covering the context block: after ``patience`` failed draws the last target
    stops constraining it (the code's ``tries``), so the context still keeps > min_keep."""
    m = multiblock_masks(4, 4, 4, sizes=_gen(0), positions=_gen(1), num_targets=4,
                         target_scale=(0.5, 0.5), target_aspect=(1.0, 1.0),
                         context_scale=(1.0, 1.0), min_keep=3, patience=2)
    assert m.context.shape[1] > 3  # a 2 x 2 target and a 3 x 3 context on a 4 x 4 grid


def test_same_seed_same_masks_and_every_process_draws_them():
    a, b, other = tiny(), tiny(), IJEPA("timm:vit_tiny_patch16_224", predictor_dim=8,
                                        predictor_depth=1, min_keep=4, encoder_kwargs=VIT)
    for _ in range(3):
        ma, mb, mo = a.draw_masks(4), b.draw_masks(4), other.draw_masks(4)
        assert torch.equal(ma.context, mb.context) and torch.equal(ma.targets, mb.targets)
        assert mo.targets.shape == ma.targets.shape  # the counter seeds the sizes
    assert not torch.equal(mo.targets, ma.targets)  # another seed: other positions
    assert int(a.mask_step) == 3
    # a checkpoint carries the counter and the seed: a resumed method draws the next masks
    resumed = IJEPA("timm:vit_tiny_patch16_224", predictor_dim=8, predictor_depth=1,
                    min_keep=4, encoder_kwargs=VIT)
    resumed.load_state_dict(a.state_dict())
    assert torch.equal(resumed.draw_masks(4).targets, a.draw_masks(4).targets)


def test_the_target_branch_has_no_gradient_and_follows_by_ema():
    model = tiny()
    x = torch.randn(4, 3, 16, 16, generator=_gen(1))
    with torch.no_grad():
        for p in model.encoder.parameters():
            p.add_(0.1)
    before = [p.clone() for p in model.target.parameters()]
    out = model(model.make_batch([x], momentum=0.25))
    out["loss"].backward()
    assert all(not p.requires_grad and p.grad is None for p in model.target.parameters())
    for t, b, e in zip(model.target.parameters(), before, model.encoder.parameters()):
        torch.testing.assert_close(t, 0.25 * b + 0.75 * e)
    # the loss does not move with the target's gradient path: a layer-normed, detached target
    assert out["embeddings"].shape == (4, 16) and not out["embeddings"].requires_grad


def _vit(vit, x, masks=None):
    """``VisionTransformer.forward`` (lines 401-425) on timm's parts (no class token)."""
    x = vit.patch_embed(x)
    x = x + vit.pos_embed
    if masks is not None:
        x = _apply_masks(x, masks)
    for blk in vit.blocks:
        x = blk(x)
    return vit.norm(x)


def _apply_masks(x, masks):
    all_x = []
    for m in masks:
        mask_keep = m.unsqueeze(-1).repeat(1, 1, x.size(-1))
        all_x += [torch.gather(x, dim=1, index=mask_keep)]
    return torch.cat(all_x, dim=0)


def _repeat_interleave_batch(x, B, repeat):
    N = len(x) // B
    return torch.cat([torch.cat([x[i * B:(i + 1) * B] for _ in range(repeat)], dim=0)
                      for i in range(N)], dim=0)


def _predictor(pred, x, masks_x, masks):
    """``VisionTransformerPredictor.forward`` (lines 285-326) on our predictor's parameters."""
    B = len(x) // len(masks_x)
    x = pred.embed(x)
    x_pos_embed = pred.pos_embed.repeat(B, 1, 1)
    x = x + _apply_masks(x_pos_embed, masks_x)
    _, N_ctxt, D = x.shape
    pos_embs = pred.pos_embed.repeat(B, 1, 1)
    pos_embs = _apply_masks(pos_embs, masks)
    pos_embs = _repeat_interleave_batch(pos_embs, B, repeat=len(masks_x))
    pred_tokens = pred.mask_token.repeat(pos_embs.size(0), pos_embs.size(1), 1)
    pred_tokens = pred_tokens + pos_embs
    x = x.repeat(len(masks), 1, 1)
    x = torch.cat([x, pred_tokens], dim=1)
    for blk in pred.blocks:
        x = blk(x)
    x = pred.norm(x)
    return pred.pred(x[:, N_ctxt:])


def _by_hand(ref, imgs, masks_enc, masks_pred):
    """``train_step``'s forward_target, forward_context and loss_fn (train.py lines 295-319)."""
    with torch.no_grad():
        h = _vit(ref.target.module, imgs)
        h = F.layer_norm(h, (h.size(-1),))
        B = len(h)
        h = _apply_masks(h, masks_pred)
        h = _repeat_interleave_batch(h, B, repeat=len(masks_enc))
    z = _vit(ref.encoder, imgs, masks_enc)
    z = _predictor(ref.predictor, z, masks_enc, masks_pred)
    return F.smooth_l1_loss(z, h)


def test_three_sgd_steps_equal_the_authors_forward_float64(sgd_matches_reference):
    m0, total = 0.5, 4  # a fast EMA, so that the target's part shows
    model = tiny(momentum=m0).double()
    ref = copy.deepcopy(model)

    def losses(step):
        x = torch.randn(4, 3, 16, 16, generator=_gen(30 + step), dtype=torch.float64)
        masks = multiblock_masks(4, 8, 8, sizes=_gen(step), positions=_gen(50 + step),
                                 min_keep=4)
        model.draw_masks = lambda n: masks  # type: ignore[method-assign]
        if step:  # the code's EMA after step - 1: m = ema0 + i (1 - ema0) / T, i = step - 1
            m = m0 + (step - 1) * (1 - m0) / total
            with torch.no_grad():
                for q, k in zip(ref.encoder.parameters(), ref.target.parameters()):
                    k.data.mul_(m).add_((1. - m) * q.detach().data)
        batch = model.make_batch([x], step=step, total_steps=total)
        assert batch["momentum"] == linear_momentum(step, total, m0)
        return (model(batch)["loss"],
                _by_hand(ref, x, [masks.context], list(masks.targets)))

    sgd_matches_reference(model, ref, losses)


def test_accumulation_and_caching_are_refused_in_one_line():
    """A batch shares one block size (one counter step) and cuts its contexts to its smallest:
    two micro-batches would draw two sizes (two counter steps) and cut each half apart."""
    from contrastive.engine.grad_cache import GradCacheError, check_grad_cache

    model = tiny()
    with pytest.raises(GradCacheError, match="one block size per batch"):
        check_grad_cache(model, 0, 2)
    with pytest.raises(GradCacheError, match="no backbone"):
        check_grad_cache(model, 4, 1)
    whole = multiblock_masks(8, 16, 16, sizes=_gen(0), positions=_gen(9))
    halves = [multiblock_masks(4, 16, 16, sizes=_gen(s), positions=_gen(9)) for s in (0, 1)]
    assert halves[1].targets.shape[-1] != whole.targets.shape[-1]  # another target size


def test_presets_follow_the_code():
    p = IJEPA.presets["vit_huge14"]
    assert (p["encoder"], p["predictor_depth"], p["predictor_dim"], p["num_targets"]) == (
        "timm:vit_huge_patch14_224", 12, 384, 4)
    assert (p["target_scale"], p["target_aspect"], p["context_scale"], p["min_keep"]) == (
        (0.15, 0.2), (0.75, 1.5), (0.85, 1.0), 10)
    assert (p["momentum"], p["weight_decay"], p["weight_decay_end"]) == (0.996, 0.04, 0.4)
    model = get_method("ijepa", preset="cifar")
    assert model.grid == 8 and model.predictor.pred.out_features == 192
    assert model.predictor.blocks[0].attn.num_heads == 3  # the encoder's, as helper.py
    assert not model.encoder.pos_embed.requires_grad  # fixed sin-cos, as the code's
    wd = model.schedules()["weight_decay"]
    assert wd(0, 10) == pytest.approx(0.4 + (0.04 - 0.4) * 0.5 * (1 + math.cos(math.pi / 10)))
    assert wd(9, 10) == pytest.approx(0.4)


def test_outputs_and_errors_name_the_problem():
    x = torch.randn(2, 3, 16, 16, generator=_gen(4))
    out = tiny()(tiny().make_batch([x], momentum=0.9))
    assert out["loss"].shape == () and out["context_patches"] > 4
    with pytest.raises(ValueError, match="no class or register token"):
        IJEPA("timm:vit_tiny_patch16_224", encoder_kwargs=dict(img_size=16, patch_size=2))
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        IJEPA("small_cnn")
    with pytest.raises(ValueError, match="min_keep=20"):
        tiny(min_keep=20).draw_masks(2)
    with pytest.raises(ValueError, match="target_scale"):
        tiny(target_scale=(0.3, 0.2))
    with pytest.raises(KeyError, match="momentum"):
        tiny()({"views": [x]})
    with pytest.raises(ValueError, match="1 tensors"):
        tiny()({"views": [x, x], "momentum": 0.9})
    assert isinstance(tiny().draw_masks(2), MultiBlock)
