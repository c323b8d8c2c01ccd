"""SimMIM: the mask (the code's ``MaskGenerator``), the mask token in place of exactly the masked
patches, the loss on exactly the masked pixels, three SGD steps against the authors' forward
written out (microsoft/SimMIM ``models/simmim.py``) in float64, exact accumulation, the presets
and the errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from contrastive.methods import SimMIM, get_method


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tiny(**kw) -> SimMIM:
    torch.manual_seed(0)
    return SimMIM("timm:vit_tiny_patch16_224", **{"mask_patch_size": 8, **kw},
                  encoder_kwargs=dict(img_size=16, patch_size=4, embed_dim=16, depth=1,
                                      num_heads=2))


def _code_mask(noise, rand_size, scale, ratio):
    """``MaskGenerator.__call__`` per image, its permutation the descending order of ``noise``
    (the largest scores masked, as ours ranks them), stacked: (N, h, w) float, 1 = masked."""
    masks = []
    for row in noise:
        token_count = rand_size ** 2
        mask_count = int(math.ceil(token_count * ratio))
        mask_idx = torch.argsort(row, descending=True)[:mask_count]
        mask = torch.zeros(token_count, dtype=torch.float64)
        mask[mask_idx] = 1
        mask = mask.reshape(rand_size, rand_size)
        masks.append(mask.repeat_interleave(scale, 0).repeat_interleave(scale, 1))
    return torch.stack(masks)


def test_masks_are_the_codes_mask_generator():
    model = SimMIM("timm:vit_tiny_patch16_224", mask_patch_size=8,
                   encoder_kwargs=dict(img_size=32, patch_size=4, embed_dim=16, depth=1,
                                       num_heads=2))
    noise = torch.rand(5, 16, generator=_gen(0), dtype=torch.float64)
    ours = model.draw_masking(5, torch.device("cpu"), noise=noise)
    assert ours.shape == (5, 64) and ours.dtype == torch.bool
    torch.testing.assert_close(ours.view(5, 8, 8).double(), _code_mask(noise, 4, 2, 0.6))
    assert (ours.sum(1) == 10 * 4).all()  # ceil(16 x 0.6) units of 2 x 2 patches
    drawn = model.draw_masking(200, torch.device("cpu")).view(200, 4, 2, 4, 2)
    assert (drawn == drawn[:, :, :1, :, :1]).all()  # whole units
    assert (drawn.float().mean(0) - 0.625).abs().max() < 0.15  # every unit is drawn


def test_the_mask_token_replaces_exactly_the_masked_patches():
    model = tiny()
    x = torch.randn(3, 3, 16, 16, generator=_gen(1))
    mask = model.draw_masking(3, x.device)
    seen = {}
    model.encoder.blocks.register_forward_pre_hook(lambda m, a: seen.setdefault("in", a[0]))
    model.draw_masking = lambda n, device: mask  # type: ignore[method-assign]
    model(model.make_batch([x]))
    vit = model.encoder
    with torch.no_grad():
        patches = vit.patch_embed(x)
        pos = vit.pos_embed[:, 1:]
        expected = torch.where(mask.unsqueeze(-1), model.mask_token + pos, patches + pos)
    tokens = seen["in"][:, 1:]
    torch.testing.assert_close(tokens, expected)
    assert not torch.allclose(tokens[mask], (patches + pos)[mask])  # the token is not a patch


def test_the_loss_reads_exactly_the_masked_pixels():
    x = torch.randn(3, 3, 16, 16, generator=_gen(2))
    mask = tiny().draw_masking(3, x.device)
    pixels = mask.view(3, 4, 4).repeat_interleave(4, 1).repeat_interleave(4, 2).unsqueeze(1)
    losses = []
    for shift_where in (None, ~pixels, pixels):
        model = tiny()
        model.draw_masking = lambda n, device: mask  # type: ignore[method-assign]
        if shift_where is not None:  # move the reconstruction at visible / masked pixels
            model.decoder.register_forward_hook(lambda m, a, out, w=shift_where: out + 3.0 * w)
        losses.append(float(model(model.make_batch([x]))["loss"].detach()))
    assert losses[1] == losses[0] and losses[2] > losses[0] + 1.0


def _by_hand(model: SimMIM, x, mask):
    """``VisionTransformerForSimMIM.forward`` and ``SimMIM.forward`` on the model's parameters
    (timm's ViT in place of the code's: patch_embed, cls_token, pos_embed, blocks, norm)."""
    vit = model.encoder
    z = vit.patch_embed(x)
    B, L, _ = z.shape
    mask_token = model.mask_token.view(1, 1, -1).expand(B, L, -1)
    w = mask.flatten(1).unsqueeze(-1).type_as(mask_token)
    z = z * (1 - w) + mask_token * w
    cls_tokens = vit.cls_token.expand(B, -1, -1)
    z = torch.cat((cls_tokens, z), dim=1)
    z = z + vit.pos_embed
    for blk in vit.blocks:
        z = blk(z)
    z = vit.norm(z)
    z = z[:, 1:]
    B, L, C = z.shape
    H = W = int(L ** 0.5)
    z = z.permute(0, 2, 1).reshape(B, C, H, W)
    x_rec = model.decoder(z)
    p, in_chans = model.patch_size, x.shape[1]
    mask = mask.repeat_interleave(p, 1).repeat_interleave(p, 2).unsqueeze(1).contiguous()
    loss_recon = F.l1_loss(x, x_rec, reduction="none")
    return (loss_recon * mask).sum() / (mask.sum() + 1e-5) / in_chans


def test_three_sgd_steps_equal_the_authors_forward_float64(sgd_matches_reference):
    model = tiny().double()
    ref = copy.deepcopy(model)

    def losses(step):
        x = torch.randn(4, 3, 16, 16, generator=_gen(30 + step), dtype=torch.float64)
        noise = torch.rand(4, 4, generator=_gen(20 + step), dtype=torch.float64)
        model.draw_masking = lambda n, device: SimMIM.draw_masking(  # type: ignore
            model, n, device, noise=noise)
        return (model(model.make_batch([x]))["loss"],
                _by_hand(ref, x, _code_mask(noise, 2, 2, 0.6)))

    # the code's + 1e-5 in its count of masked pixels: a relative 1e-5 / 576 here
    sgd_matches_reference(model, ref, losses, loss_tol=(1e-7, 0), param_tol=(1e-6, 1e-9),
                          moved=1e-2)


def test_accumulation_is_exact_per_sample_loss():
    """Two halves' mean loss and mean gradient equal the whole batch's (same masks): what
    --grad-accum-steps computes; holds because every image masks the same number of pixels."""
    x = torch.randn(6, 3, 16, 16, generator=_gen(3), dtype=torch.float64)
    mask = tiny().draw_masking(6, x.device)

    def loss_grads(rows):
        model = tiny().double()
        model.draw_masking = lambda n, device: mask[rows]  # type: ignore[method-assign]
        loss = model(model.make_batch([x[rows]]))["loss"]
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    whole, g = loss_grads(slice(None))
    (a, ga), (b, gb) = loss_grads(slice(0, 3)), loss_grads(slice(3, 6))
    torch.testing.assert_close((a + b) / 2, whole, rtol=1e-13, atol=0)
    for u, v, w in zip(ga, gb, g):
        torch.testing.assert_close((u + v) / 2, w, rtol=1e-10, atol=1e-14)


def test_tokens_skip_weight_decay_as_the_code():
    model = tiny()
    (group,) = model.param_groups()
    assert group.weight_decay == 0.0
    assert {id(p) for p in group.params} == {id(model.encoder.cls_token),
                                             id(model.encoder.pos_embed)}
    assert model.mask_token.abs().max() <= 0.02  # truncated at one std, as the code


def test_presets_follow_the_code():
    p = SimMIM.presets["vit_base"]
    assert (p["encoder"], p["mask_ratio"], p["mask_patch_size"]) == (
        "timm:vit_base_patch16_224", 0.6, 32)
    assert p["encoder_kwargs"] == dict(init_values=0.1, drop_path_rate=0.1)
    model = get_method("simmim", preset="cifar")
    assert (model.num_patches, model.patch_size, model.mask_grid, model.mask_scale) == (
        64, 4, 4, 2)
    assert model.decoder[0].out_channels == 48 and model.decoder[1].upscale_factor == 4


def test_outputs_and_errors_name_the_problem():
    x = torch.randn(2, 3, 16, 16, generator=_gen(4))
    for where in ("masked", "all", "visible"):
        out = tiny(loss_on=where)(tiny().make_batch([x]))
        assert out["loss"].shape == () and out["embeddings"].shape == (2, 16)
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        SimMIM("small_cnn")
    with pytest.raises(ValueError, match="mask_ratio"):
        tiny(mask_ratio=1.0)
    with pytest.raises(ValueError, match="loss_on"):
        tiny(loss_on="nowhere")
    with pytest.raises(ValueError, match="mask_patch_size 6"):
        tiny(mask_patch_size=6)
    with pytest.raises(ValueError, match="1 tensors"):
        tiny()({"views": [x, x]})
