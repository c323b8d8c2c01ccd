"""iBOT / DINOv2 (``ibot``): 3 SGD steps against the codes' step written out in float64.

The reference is bytedance/ibot's ``iBOTLoss.forward`` (loops over teacher crop q and student
crop v: the class term for v != q, the masked-patch term for v == q, each averaged over its
pairs; ``update_center``) and, for DINOv2, ``sinkhorn_knopp_teacher`` (dinov2/loss/
dino_clstoken_loss.py, on the masked patch rows for the patch term) and ``KoLeoLoss`` (summed
over the global crops), with the EMA, the cosine momentum and the linear temperature warm-up
as the codes' schedules; the ViT's masked forward is timm's, its patch embeddings replaced by
the mask token before the position embedding (iBOT's ``prepare_tokens``).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from contrastive.methods import IBOT, get_method

B, STEPS, LR = 4, 3, 0.5
VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, dynamic_img_size=True)
CONFIGS = {
    # iBOT: running centres, one head, a temperature warm-up, a local crop, no KoLeo
    "ibot": dict(centering="mean", shared_head=True, koleo_weight=0.0,
                 warmup_teacher_temperature=0.04, teacher_temperature=0.07,
                 warmup_teacher_patch_temperature=0.05, teacher_patch_temperature=0.08,
                 warmup_teacher_steps=2),
    # DINOv2 vitl14-style: Sinkhorn-Knopp, separate heads, KoLeo 0.1, norm_last_layer
    "dinov2": dict(centering="sinkhorn", shared_head=False, patch_out_dim=10, koleo_weight=0.1,
                   teacher_temperature=0.07, teacher_patch_temperature=0.06,
                   norm_last_layer=True, ibot_weight=0.7, dino_weight=1.3),
    # DINOv2's default config: running centres, the patch centre over the masked patches only
    "dinov2_mean": dict(centering="mean", patch_center_tokens="masked", shared_head=True,
                        koleo_weight=0.1, teacher_temperature=0.07,
                        teacher_patch_temperature=0.06),
}


def build(**kw) -> IBOT:
    torch.manual_seed(0)
    base = dict(out_dim=12, hidden_dim=16, bottleneck_dim=8, momentum=0.9,
                student_temperature=0.1, encoder_kwargs=VIT)
    method = IBOT("timm:vit_tiny_patch16_224", **{**base, **kw}).double()
    with torch.no_grad():  # a non-zero mask token, so that a wrong placement shows
        method.mask_token.normal_(0, 0.5)
    return method


def data(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(STEPS):
        views = [torch.randn(B, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2)]
        views.append(torch.randn(B, 3, 8, 8, generator=g, dtype=torch.float64))
        masks = torch.rand(2 * B, 16, generator=g) < 0.35
        masks[0] = False  # an image without masks (half of them are, in the codes)
        masks[1, :3] = True
        steps.append((views, masks))
    return steps


def run_method(method: IBOT, steps) -> dict:
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=LR)
    losses = []
    for step, (views, masks) in enumerate(steps):
        method.draw_masks = lambda n, h, w, m=masks: m  # type: ignore[method-assign]
        out = method(method.make_batch(views, step=step, total_steps=STEPS))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].detach())
    return {"loss": losses, "token": method.mask_token.detach().clone(),
            "student": [p.detach().clone() for p in method._student_params()],
            "teacher": [p.detach().clone() for p in method.teacher.parameters()]}


def vit_tokens(vit, x, mask=None, token=None):
    x = vit.patch_embed(x)  # (N, H, W, D) on a dynamic-size ViT
    if mask is not None:
        x = x.flatten(1, 2)
        x = x * (~mask).unsqueeze(-1) + token * mask.unsqueeze(-1)
        x = x.reshape(x.shape[0], 4, 4, -1)
    return vit.norm(vit.blocks(vit._pos_embed(x)))


def sinkhorn_teacher(t, tau, iterations=3):  # DINOv2's sinkhorn_knopp_teacher, one process
    q = torch.exp(t / tau).t()
    n, k = q.shape[1], q.shape[0]
    q = q / q.sum()
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / n
    return (q * n).t()


def koleo_code(x, eps=1e-8):  # DINOv2's KoLeoLoss.forward
    x = F.normalize(x, eps=eps, p=2, dim=-1)
    dots = x @ x.t()
    n = x.shape[0]
    dots.view(-1)[:: n + 1].fill_(-1)
    nearest = dots.argmax(dim=1)
    return -torch.log(F.pairwise_distance(x, x[nearest], 2, eps=eps) + eps).mean()


def _linear_warmup(step, warm, start, end):  # the codes' np.linspace warm-up, per step
    return end if step >= warm else start + (end - start) * step / warm


def run_reference(cfg: dict, steps) -> dict:
    method = build(**cfg)
    enc, head = copy.deepcopy(method.encoder), copy.deepcopy(method.head)
    phead = head if method.patch_head is None else copy.deepcopy(method.patch_head)
    token = method.mask_token.detach().clone().requires_grad_(True)
    t_enc, t_head = copy.deepcopy(enc), copy.deepcopy(head)
    t_phead = t_head if method.patch_head is None else copy.deepcopy(phead)
    del method
    s_mods = [enc, head] + ([] if cfg["shared_head"] else [phead])
    t_mods = [t_enc, t_head] + ([] if cfg["shared_head"] else [t_phead])
    center, center2 = torch.zeros(12, dtype=torch.float64), 0.0
    w1, w2, wk = cfg.get("dino_weight", 1.0), cfg.get("ibot_weight", 1.0), cfg["koleo_weight"]
    losses = []
    for step, (views, masks) in enumerate(steps):
        m = 1 - (1 - 0.9) * (math.cos(math.pi * step / STEPS) + 1) / 2
        warm = cfg.get("warmup_teacher_steps", 0)
        tau = _linear_warmup(step, warm, cfg.get("warmup_teacher_temperature",
                                                 cfg["teacher_temperature"]),
                             cfg["teacher_temperature"])
        tau2 = _linear_warmup(step, warm, cfg.get("warmup_teacher_patch_temperature", 0.04),
                              cfg["teacher_patch_temperature"])
        with torch.no_grad():
            for tm, sm in zip(t_mods, s_mods):
                for pt, ps in zip(tm.parameters(), sm.parameters()):
                    pt.mul_(m).add_((1 - m) * ps)
            gl = torch.cat(views[:2])
            tt = vit_tokens(t_enc, gl)
            t_cls, t_patch = t_head(tt[:, 0]), t_phead(tt[:, 1:])
        ss = vit_tokens(enc, gl, masks, token)
        s_cls = torch.cat([head(ss[:, 0]), head(vit_tokens(enc, views[2])[:, 0])]) / 0.1
        s_patch = phead(ss[:, 1:]) / 0.1
        if cfg["centering"] == "mean":
            tc = F.softmax((t_cls - center) / tau, dim=-1)
            tp = F.softmax((t_patch - center2) / tau2, dim=-1)
        else:
            tc = sinkhorn_teacher(t_cls, tau)
            tp = torch.zeros_like(t_patch)
            tp[masks] = sinkhorn_teacher(t_patch[masks], tau2)
        tc_c, tp_c, sc_c, sp_c = tc.chunk(2), tp.chunk(2), s_cls.chunk(3), s_patch.chunk(2)
        loss1 = loss2 = 0.0
        n1 = n2 = 0
        for q in range(2):
            for v in range(3):
                if v == q:
                    ce = torch.sum(-tp_c[q] * F.log_softmax(sp_c[v], dim=-1), dim=-1)
                    mk = masks.chunk(2)[v].double()
                    loss2 = loss2 + (torch.sum(ce * mk, -1) / mk.sum(-1).clamp(min=1.0)).mean()
                    n2 += 1
                else:
                    ce = torch.sum(-tc_c[q] * F.log_softmax(sc_c[v], dim=-1), dim=-1)
                    loss1 = loss1 + ce.mean()
                    n1 += 1
        loss = loss1 / n1 * w1 + loss2 / n2 * w2
        if wk:
            loss = loss + wk * sum(koleo_code(p) for p in ss[:, 0].chunk(2))
        if cfg["centering"] == "mean":
            center = center * 0.9 + t_cls.mean(0) * 0.1
            # iBOT: every patch; DINOv2 (ibot_patch_loss.py): the masked rows' mean
            seen = t_patch[masks].mean(0) if cfg.get("patch_center_tokens") == "masked" \
                else t_patch.mean(1).mean(0)
            center2 = center2 * 0.9 + seen * 0.1
        params = [p for mod in s_mods for p in mod.parameters() if p.requires_grad] + [token]
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(LR * g)
        losses.append(loss.detach())
    return {"loss": losses, "token": token.detach(),
            "student": [p.detach() for mod in s_mods for p in mod.parameters()],
            "teacher": [p.detach() for mod in t_mods for p in mod.parameters()]}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_three_sgd_steps_equal_the_codes_float64(name, close_f64):
    steps = data()
    ours, ref = run_method(build(**CONFIGS[name]), steps), run_reference(CONFIGS[name], steps)
    for a, b in zip(ours["loss"], ref["loss"]):
        close_f64(a, b)
    assert len(ours["student"]) == len(ref["student"])
    for key in ("student", "teacher", "token"):
        for a, b in zip(*((r[key] if key != "token" else [r[key]]) for r in (ours, ref))):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert ours["loss"][0] != ours["loss"][-1]


def test_the_reference_sees_a_wrong_mask_token_placement():
    """The check above can fail: masks shifted by one patch change the losses."""
    steps = data()
    cfg = CONFIGS["ibot"]
    shifted = [(v, m.roll(1, dims=1)) for v, m in steps]
    ours, ref = run_method(build(**cfg), shifted), run_reference(cfg, steps)
    assert abs(float(ours["loss"][0] - ref["loss"][0])) > 1e-6


def test_presets_and_registry():
    assert type(get_method("ibot", encoder="timm:vit_tiny_patch16_224", out_dim=8,
                           hidden_dim=8, bottleneck_dim=4, encoder_kwargs=VIT)) is IBOT
    assert IBOT.presets["dinov2"]["centering"] == "sinkhorn"
    assert IBOT.presets["dinov2"]["koleo_weight"] == 0.1
    assert IBOT.presets["vit_small"]["shared_head"] and IBOT.presets["vit_small"]["koleo_weight"] == 0
    with torch.device("meta"):  # every preset builds (no memory): names and keywords valid
        built = {name: IBOT.from_preset(name) for name in IBOT.presets}
    assert built["dinov2"].encoder.patch_embed.patch_size == (14, 14)
    assert built["dinov2"].patch_head is not None and built["dinov2"].center.shape == (131072,)
    assert built["dinov2_in1k"].patch_head is None and built["dinov2_in1k"].base_momentum == 0.992
    assert built["cifar"].encoder.patch_embed.grid_size == (8, 8)
    assert all(m.encoder.dynamic_img_size for m in built.values())  # local crops
    # DINOv2's optimiser groups: ssl_default_config.yaml's layerwise_decay 0.9 and
    # patch_embed_lr_mult 0.2 over ViT-L's 24 blocks; vitl14.yaml's layerwise_decay 1.0
    groups = {g.name: g.lr_scale for g in built["dinov2_in1k"].param_groups()}
    assert len(groups) == 26 and groups["vit_layer24"] == pytest.approx(0.9)
    assert groups["vit_patch_embed"] == pytest.approx(0.9 ** 25 * 0.2)
    assert groups["vit_layer0"] == pytest.approx(0.9 ** 25)
    assert [(g.name, g.lr_scale) for g in built["dinov2"].param_groups()] == [
        ("vit_patch_embed", 0.2)]
    assert all(built[n].patch_center_tokens == "masked" for n in ("dinov2", "dinov2_in1k"))
    assert built["vit_small"].param_groups() == []  # iBOT: one lr, no frozen layer by default


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="centering"):
        build(centering="centre")
    with pytest.raises(ValueError, match="mask_ratio"):
        build(mask_ratio=(0.5, 0.1))
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        IBOT("small_cnn")
    fixed = build(encoder_kwargs={**VIT, "dynamic_img_size": False})
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        fixed(fixed.make_batch([torch.randn(2, 3, 16, 16).double()] * 2
                               + [torch.randn(2, 3, 8, 8).double()]))
    method = build()
    with pytest.raises(ValueError, match="global crops must have one size"):
        method(method.make_batch([torch.randn(2, 3, 16, 16).double(),
                                  torch.randn(2, 3, 8, 8).double()]))


def test_draw_masks_follows_the_settings():
    method = build(mask_probability=0.5, mask_ratio=(0.1, 0.5))
    torch.manual_seed(3)
    masks = method.draw_masks(8, 4, 4)
    assert masks.shape == (8, 16) and masks.dtype == torch.bool
    assert int((masks.sum(1) > 0).sum()) <= 4  # half the images at most
    assert int(masks.sum(1).max()) <= 8  # ratio 0.5 of 16 patches at most
    torch.manual_seed(3)
    assert torch.equal(method.draw_masks(8, 4, 4), masks)  # follows torch's seed


def test_the_reference_sees_the_patch_centre_over_every_patch():
    """The check above can fail: DINOv2's masked-patch centre is not iBOT's all-patch one (the
    centre enters the targets from the second step)."""
    steps = data()
    ref = run_reference(CONFIGS["dinov2_mean"], steps)
    ours = run_method(build(**{**CONFIGS["dinov2_mean"], "patch_center_tokens": "all"}), steps)
    assert abs(float(ours["loss"][0] - ref["loss"][0])) < 1e-9
    assert abs(float(ours["loss"][2] - ref["loss"][2])) > 1e-6


@pytest.mark.parametrize("masked_rows", [True, False])
def test_masked_patch_centre_is_the_mean_of_the_masked_teacher_rows(masked_rows):
    """DINOv2's ``iBOTPatchLoss.update_center`` on one process: c <- 0.9 c + 0.1 * mean of the
    teacher head's rows at the masked patches; with no masked patch the centre stays."""
    from contrastive.nn.masked_vit import masked_tokens

    method = build(centering="mean", patch_center_tokens="masked")
    with torch.no_grad():
        method.center_patch.normal_()
    before = method.center_patch.clone()
    views, masks = data()[0]
    masks = masks if masked_rows else torch.zeros_like(masks)
    method.draw_masks = lambda n, h, w: masks  # type: ignore[method-assign]
    method(method.make_batch(views))
    if not masked_rows:
        torch.testing.assert_close(method.center_patch, before, rtol=1e-14, atol=1e-15)
        return
    teacher = method.teacher.module  # updated at the start of the step, then used
    with torch.no_grad():
        rows = teacher["head"](masked_tokens(teacher["encoder"], torch.cat(views[:2]))[:, 1:])
    expected = 0.9 * before + 0.1 * rows[masks].mean(0)
    torch.testing.assert_close(method.center_patch, expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(expected, 0.9 * before + 0.1 * rows.mean((0, 1)))


# --- DINOv2's optimiser groups: layer-wise lr decay and the patch-embedding factor -----------

DEEP = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, reg_tokens=2,
            init_values=1e-5, dynamic_img_size=True)


def dinov2_lr_scale(name: str, decay: float, patch: float) -> float:
    """DINOv2's ``get_vit_lr_decay_rate`` (+ ``patch_embed_lr_mult``), written out for a 2-block
    ViT (L = 2) inside the method: layer 0 -> decay^3, block i -> decay^(2 - i), rest 1."""
    if name.startswith("encoder.patch_embed."):
        return decay ** 3 * patch
    if name in ("encoder.cls_token", "encoder.reg_token", "encoder.pos_embed", "mask_token"):
        return decay ** 3
    if name.startswith("encoder.blocks.0."):
        return decay ** 2
    if name.startswith("encoder.blocks.1."):
        return decay
    assert name.startswith(("encoder.norm.", "head.")), name
    return 1.0


def test_layer_decay_groups_give_dinov2_lr_scales_after_set_lr():
    from contrastive.engine.optim import build_optimizer, set_lr, set_weight_decay

    method = build(encoder_kwargs=DEEP, layer_decay=0.8, patch_embed_lr_scale=0.3,
                   freeze_last_layer_steps=2, norm_last_layer=False)
    optimizer = build_optimizer(method, "adamw", lr=1.0, weight_decay=0.04)
    set_lr(optimizer, 2.0)
    set_weight_decay(optimizer, 0.3)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    names = dict(method.named_parameters())
    trainable = {n: p for n, p in names.items() if p.requires_grad}
    assert set(map(id, trainable.values())) == set(group_of)  # every trainable one, once
    assert {n for n in trainable if n.startswith("encoder.blocks.1.ls")}  # gammas present
    for name, p in trainable.items():
        g = group_of[id(p)]
        assert g["lr"] == pytest.approx(2.0 * dinov2_lr_scale(name, 0.8, 0.3), rel=1e-12), name
        # no decay on biases / norms / layer-scale gammas, the weight decay schedule on every
        # other weight (pos_embed, tokens, patch and last layers too)
        assert g["weight_decay"] == (0.0 if p.ndim <= 1 else 0.3), name
    # the (1, D) mask token decays, as iBOT's masked_embed and DINOv2's mask_token do
    assert group_of[id(names["mask_token"])]["weight_decay"] == 0.3
    assert group_of[id(names["encoder.patch_embed.proj.weight"])]["lr"] == pytest.approx(
        2.0 * 0.8 ** 3 * 0.3)
    last = group_of[id(names["head.last_layer.parametrizations.weight.original1"])]
    assert last["frozen_steps"] == 2 and last["lr"] == 2.0  # the frozen last layer, scale 1


def test_no_layer_decay_keeps_the_groups_as_before():
    from contrastive.engine.optim import param_groups
    from contrastive.methods.dino import last_layer_groups

    method = build(encoder_kwargs=DEEP, freeze_last_layer_steps=3)
    assert method.param_groups() == last_layer_groups([method.head], 3)
    assert method.step_spans()["freeze_last_layer_steps"] == 3
    ours = param_groups(method, 0.04)
    method.param_groups = lambda: last_layer_groups([method.head], 3)  # type: ignore[method-assign]
    before = param_groups(method, 0.04)
    assert [(g["name"], [id(p) for p in g["params"]], {k: v for k, v in g.items()
                                                      if k != "params"}) for g in ours] == \
        [(g["name"], [id(p) for p in g["params"]], {k: v for k, v in g.items()
                                                   if k != "params"}) for g in before]
    # the patch factor alone: one group, the patch embedding's
    only = build(encoder_kwargs=DEEP, patch_embed_lr_scale=0.2).param_groups()
    assert [(g.name, g.lr_scale, len(g.params)) for g in only] == [("vit_patch_embed", 0.2, 2)]


@pytest.mark.parametrize("kw", [dict(layer_decay=0.0), dict(layer_decay=1.5),
                                dict(layer_decay=float("nan")),
                                dict(patch_embed_lr_scale=-0.1),
                                dict(patch_embed_lr_scale=float("inf"))])
def test_bad_layer_decay_is_a_one_line_error(kw):
    with pytest.raises(ValueError, match="layer_decay must be in .0, 1.*patch_embed_lr_scale") \
            as err:
        build(**kw)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="patch_center_tokens"):
        build(patch_center_tokens="unmasked")


def test_dinov2_presets_clip_per_part_freeze_by_lr_and_uniform_drop_path():
    """DINOv2's train.py / ssl_default_config.yaml in the presets: the gradient clipped per
    student part, the last layer frozen by a zero lr, drop path 0.3 (vitl14: 0.4) in every one
    of ViT-L's 24 blocks (timm's own grows linearly from 0); iBOT's clip each parameter apart
    (its utils.clip_gradients) and keep the other old ways."""
    from timm.layers import DropPath

    with torch.device("meta"):
        built = {name: IBOT.from_preset(name) for name in ("dinov2_in1k", "dinov2", "vit_small")}
    for name, rate in (("dinov2_in1k", 0.3), ("dinov2", 0.4)):
        m = built[name]
        assert m.clip_mode == "part" and m.freeze_last_layer_by == "lr"
        paths = [getattr(b, f"drop_path{i}") for b in m.encoder.blocks for i in (1, 2)]
        assert len(paths) == 48 and all(type(d) is DropPath and d.drop_prob == rate
                                        for d in paths), name
    assert IBOT.presets["dinov2_cifar"]["clip_mode"] == "part"
    assert IBOT.presets["dinov2_cifar"]["freeze_last_layer_by"] == "lr"
    small = built["vit_small"]
    assert small.clip_mode == "parameter" and small.freeze_last_layer_by == "grad"
    assert IBOT.presets["cifar"]["clip_mode"] == "parameter"
    rates = [b.drop_path1.drop_prob for b in small.encoder.blocks[1:]]
    assert type(small.encoder.blocks[0].drop_path1) is not DropPath and rates[-1] == \
        pytest.approx(0.1) and rates[0] < 0.02  # iBOT's: timm's linear growth to 0.1


@pytest.mark.parametrize("shared_head", [True, False])
def test_clip_parts_are_dinov2s_student_parts(shared_head):
    """backbone (the ViT and the mask token), dino_head, ibot_head when separate: every
    trainable parameter in exactly one part (none left over), none of the teacher's."""
    from contrastive.engine.step import clip_groups

    method = build(shared_head=shared_head, patch_out_dim=10, clip_mode="part")
    parts = method.clip_parts()
    assert list(parts) == ["backbone", "dino_head"] + ([] if shared_head else ["ibot_head"])
    ids = {name: {id(p) for p in ps} for name, ps in parts.items()}
    assert ids["backbone"] == {id(p) for p in method.encoder.parameters()} | \
        {id(method.mask_token)}
    assert ids["dino_head"] == {id(p) for p in method.head.parameters()}
    groups = clip_groups(list(method.parameters()), parts)
    trainable = [p for p in method.parameters() if p.requires_grad]
    assert len(groups) == len(parts) and sum(map(len, groups)) == len(trainable)
    assert not {id(p) for p in method.teacher.parameters()} & set().union(*ids.values())


def test_freeze_last_layer_by_lr_reaches_the_optimiser_group():
    from contrastive.engine.optim import build_optimizer

    for by in ("lr", "grad"):
        method = build(freeze_last_layer_steps=2, freeze_last_layer_by=by)
        opt = build_optimizer(method, "adamw", lr=1.0, weight_decay=0.04)
        last = [g for g in opt.param_groups if g["name"].startswith("last_layer")]
        assert last and all(g["frozen_steps"] == 2 for g in last)
        assert all(g.get("frozen_by_lr", False) == (by == "lr") for g in last)
        assert all("frozen_by_lr" not in g for g in opt.param_groups if g not in last)
    with pytest.raises(ValueError, match="freeze_last_layer_by must be one of"):
        build(freeze_last_layer_by="zero")


@pytest.mark.parametrize("method", ["dino", "ibot"])
def test_the_teacher_has_no_drop_path_the_student_keeps_it(method):
    """DINO's, iBOT's and DINOv2's teachers are built without drop path (main_dino.py,
    main_ibot.py, dinov2/models build_model: drop_path_rate on the student only) and run in
    train mode: a copied DropPath would drop the teacher's residual branches at random. The
    student at drop path 0.5 in every block (drop_path_uniform) stays stochastic in train mode;
    the teacher is deterministic, equal to the student's eval-mode forward at the same weights,
    and its state dict keys are the student's."""
    from contrastive.methods import DINO

    torch.manual_seed(0)
    kwargs = dict(encoder="timm:vit_tiny_patch16_224", out_dim=16,
                  encoder_kwargs=dict(img_size=16, patch_size=4, embed_dim=16, depth=2,
                                      num_heads=2, drop_path_rate=0.5, drop_path_uniform=True))
    m = (DINO(hidden_dim=16, bottleneck_dim=8, **kwargs) if method == "dino"
         else IBOT(hidden_dim=16, bottleneck_dim=8, **kwargs)).train()
    teacher = m.teacher.module[0] if method == "dino" else m.teacher.module["encoder"]
    assert teacher.training and m.encoder.training
    x = torch.randn(8, 3, 16, 16)
    with torch.no_grad():
        s1, s2 = m.encoder(x), m.encoder(x)
        t1, t2 = teacher(x), teacher(x)
        m.encoder.eval()
        s_eval = m.encoder(x)
    assert not torch.equal(s1, s2)  # the student drops paths
    assert torch.equal(t1, t2)
    torch.testing.assert_close(t1, s_eval, rtol=1e-6, atol=1e-6)
    assert list(teacher.state_dict()) == list(m.encoder.state_dict())


def test_dino_vit_small_student_drops_paths_at_the_codes_rate():
    """main_dino.py: --drop_path_rate 0.1 (linear over the blocks, as timm's), the student only."""
    from contrastive.methods import DINO

    with torch.device("meta"):
        m = DINO.from_preset("vit_small")
    rates = [b.drop_path1.drop_prob if hasattr(b.drop_path1, "drop_prob") else 0.0
             for b in m.encoder.blocks]
    assert rates[-1] == pytest.approx(0.1) and rates[0] == 0.0
    assert all(type(b.drop_path1) is torch.nn.Identity for b in m.teacher.module[0].blocks)
