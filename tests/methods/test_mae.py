"""MAE: the loss against the code's ``forward_loss`` in float64 and gradcheck, against lightly's
pieces, three SGD steps against the authors' forward written out, the presets against the
paper / code, and the errors."""

from __future__ import annotations

import copy

import pytest
import torch

from contrastive.losses import get_loss
from contrastive.losses.reconstruction import masked_reconstruction
from contrastive.methods import MAE, get_method
from contrastive.nn.masking import patchify, random_masking


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _code_loss(imgs, pred, mask, p, norm_pix=True):
    """facebookresearch/mae ``forward_loss``, mask 1 = removed (float), as the code writes it."""
    target = patchify(imgs, p)
    if norm_pix:
        mean = target.mean(dim=-1, keepdim=True)
        var = target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.e-6) ** .5
    loss = ((pred - target) ** 2).mean(dim=-1)
    return (loss * mask).sum() / mask.sum()


@pytest.mark.parametrize("norm_pix", [True, False])
def test_loss_equals_the_codes_forward_loss_float64(norm_pix):
    imgs = torch.randn(5, 3, 16, 16, generator=_gen(0), dtype=torch.float64)
    pred = torch.randn(5, 16, 48, generator=_gen(1), dtype=torch.float64)
    _, _, mask = random_masking(5, 16, 0.75, generator=_gen(2))
    ours = masked_reconstruction(pred, patchify(imgs, 4), mask, norm_pix=norm_pix)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, _code_loss(imgs, pred, mask.double(), 4, norm_pix),
                               rtol=1e-13, atol=1e-14)
    # only masked patches count: changing a visible prediction changes nothing
    moved = pred.clone()
    moved[~mask] += 5.0
    torch.testing.assert_close(masked_reconstruction(moved, patchify(imgs, 4), mask,
                                                     norm_pix=norm_pix), ours)


def test_loss_gradcheck_float64():
    pred = torch.randn(3, 6, 12, generator=_gen(3), dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 6, 12, generator=_gen(4), dtype=torch.float64, requires_grad=True)
    _, _, mask = random_masking(3, 6, 0.5, generator=_gen(5))
    assert torch.autograd.gradcheck(
        lambda a, b: masked_reconstruction(a, b, mask, reduction="none"), (pred, target))


def test_loss_equals_lightlys_pieces():
    utils = pytest.importorskip("lightly.models.utils", reason="lightly is not installed")
    imgs = torch.randn(4, 3, 16, 16, generator=_gen(6), dtype=torch.float64)
    pred = torch.randn(4, 16, 48, generator=_gen(7), dtype=torch.float64)
    _, _, mask = random_masking(4, 16, 0.75, generator=_gen(8))
    idx_mask = mask.nonzero()[:, 1].reshape(4, -1)  # each row's masked positions
    # lightly's MAE example: MSE on the masked patches, targets normalised per patch
    target = utils.normalize_mean_var(utils.get_at_index(utils.patchify(imgs, 4), idx_mask))
    theirs = torch.nn.functional.mse_loss(utils.get_at_index(pred, idx_mask), target)
    torch.testing.assert_close(get_loss("mae")(pred, patchify(imgs, 4), mask), theirs,
                               rtol=1e-12, atol=1e-14)


def tiny(ratio: float = 0.75, **kw) -> MAE:
    torch.manual_seed(0)
    return MAE("timm:vit_tiny_patch16_224", mask_ratio=ratio, decoder_dim=8, decoder_depth=1,
               decoder_heads=2, encoder_kwargs=dict(img_size=16, patch_size=4, embed_dim=16,
                                                    depth=1, num_heads=2), **kw)


def _by_hand(model: MAE, imgs, noise):
    """The authors' forward_encoder / forward_decoder / forward_loss on the model's parameters."""
    vit, dec = model.encoder, model.decoder
    x = vit.patch_embed(imgs) + vit.pos_embed[:, 1:, :]
    n, length, d = x.shape
    len_keep = int(length * (1 - model.mask_ratio))
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    x = torch.gather(x, 1, ids_shuffle[:, :len_keep].unsqueeze(-1).repeat(1, 1, d))
    mask = torch.ones(n, length, dtype=x.dtype)
    mask[:, :len_keep] = 0
    mask = torch.gather(mask, 1, ids_restore)
    cls = (vit.cls_token + vit.pos_embed[:, :1, :]).expand(n, -1, -1)
    x = torch.cat([cls, x], dim=1)
    for blk in vit.blocks:
        x = blk(x)
    x = dec.embed(vit.norm(x))
    tokens = dec.mask_token.repeat(n, ids_restore.shape[1] + 1 - x.shape[1], 1)
    x_ = torch.cat([x[:, 1:, :], tokens], dim=1)
    x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
    x = torch.cat([x[:, :1, :], x_], dim=1)
    x = x + torch.cat([torch.zeros_like(dec.pos_embed[:, :1]), dec.pos_embed], dim=1)
    for blk in dec.blocks:
        x = blk(x)
    pred = dec.pred(dec.norm(x))[:, 1:, :]
    return _code_loss(imgs, pred, mask, model.patch_size)


def test_three_sgd_steps_equal_the_authors_forward_float64(sgd_matches_reference):
    model = tiny().double()
    ref = copy.deepcopy(model)

    def losses(step):
        noise = torch.rand(4, 16, generator=_gen(20 + step), dtype=torch.float64)
        images = torch.randn(4, 3, 16, 16, generator=_gen(30 + step), dtype=torch.float64)
        model.draw_masking = lambda n, device: random_masking(  # type: ignore[method-assign]
            n, 16, 0.75, noise=noise)
        return model(model.make_batch([images]))["loss"], _by_hand(ref, images, noise)

    sgd_matches_reference(model, ref, losses)


def test_mae_init_and_fixed_position_embeddings():
    model = tiny()
    assert not model.encoder.pos_embed.requires_grad  # fixed sin-cos, as the code
    assert model.encoder.pos_embed[0, 0].abs().sum() == 0  # class-token row
    assert "pos_embed" not in dict(model.decoder.named_parameters())
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            bound = (6 / (m.in_features + m.out_features)) ** 0.5  # Xavier-uniform
            assert m.weight.abs().max() <= bound and (m.bias == 0).all()


def test_loss_on_switch_and_forward_outputs():
    imgs = torch.randn(3, 3, 16, 16, generator=_gen(9))
    for where in ("masked", "all", "visible"):
        out = tiny(loss_on=where)(MAE.make_batch(tiny(), [imgs]))
        assert out["loss"].shape == () and out["embeddings"].shape == (3, 16)
    with pytest.raises(ValueError, match="loss_on"):
        tiny(loss_on="nowhere")


def test_presets_follow_the_paper_and_code():
    for name in ("vit_base", "vit_large"):
        p = MAE.presets[name]
        assert (p["mask_ratio"], p["decoder_dim"], p["decoder_depth"], p["decoder_heads"],
                p["norm_pix"]) == (0.75, 512, 8, 16, True)
    model = get_method("mae", preset="cifar")
    assert model.num_patches == 64 and model.patch_size == 4
    assert model.encoder.num_features == 192


def test_errors_name_the_problem():
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        MAE("small_cnn")
    with pytest.raises(ValueError, match="mask_ratio"):
        tiny(ratio=1.0)
    model = tiny()
    x = torch.zeros(2, 3, 16, 16)
    with pytest.raises(ValueError, match="1 tensors"):
        model({"views": [x, x]})


def test_accumulation_is_exact_per_sample_loss():
    """The big-batch road (issue 54 step 5): MAE's loss is a per-image mean over the same number
    of masked patches for every image, so two micro-batches' mean loss and mean gradient equal
    the whole batch's (the same masks): --grad-accum-steps reaches the paper's 4096 exactly.
    (The equality needs every image to mask the same number of patches, as MAE's fixed ratio
    does.)"""
    x = torch.randn(6, 3, 16, 16, generator=_gen(3), dtype=torch.float64)
    noise = torch.rand(6, 16, generator=_gen(4), dtype=torch.float64)

    def loss_grads(rows):
        model = tiny().double()
        model.draw_masking = lambda n, device: random_masking(  # type: ignore[method-assign]
            n, 16, 0.75, noise=noise[rows])
        loss = model(model.make_batch([x[rows]]))["loss"]
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters() if p.requires_grad]

    whole, g = loss_grads(slice(None))
    (a, ga), (b, gb) = loss_grads(slice(0, 3)), loss_grads(slice(3, 6))
    torch.testing.assert_close((a + b) / 2, whole, rtol=1e-13, atol=0)
    for u, v, w in zip(ga, gb, g, strict=True):
        torch.testing.assert_close((u + v) / 2, w, rtol=1e-10, atol=1e-14)
    assert not torch.allclose(a, b)  # the halves differ: the equality is not of equal parts
