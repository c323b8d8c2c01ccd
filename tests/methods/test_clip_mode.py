"""DINO's and iBOT's ``clip_mode`` (``Method.clip_parts`` through ``clip_parts_by``): "parameter"
clips each trainable parameter's gradient apart as the authors' ``utils.clip_gradients``
(facebookresearch/dino and bytedance/ibot: ``clip_coef = clip / (param_norm + 1e-6)``, the
gradient multiplied by it when < 1), through the engine's :class:`Updater`; such a clip commutes
with dropping the frozen last layer's gradients (the codes clip, then
``cancel_gradients_last_layer``; the engine drops, then clips); "all" stays the default."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from contrastive.engine.optim import build_optimizer, hold_frozen_groups
from contrastive.engine.step import Updater
from contrastive.methods import DINO, IBOT
from contrastive.methods.base import CLIP_MODES

CLIP = 0.5
VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, dynamic_img_size=True)


def dino(**kw) -> DINO:
    torch.manual_seed(0)
    base = dict(out_dim=12, hidden_dim=16, bottleneck_dim=8, norm_last_layer=False,
                encoder_kwargs=dict(widths=[4, 4, 8, 8]))
    return DINO("small_cnn", **{**base, **kw}).double()


def ibot(**kw) -> IBOT:
    torch.manual_seed(0)
    base = dict(out_dim=12, hidden_dim=16, bottleneck_dim=8, shared_head=False, patch_out_dim=10,
                norm_last_layer=False, encoder_kwargs=VIT)
    return IBOT("timm:vit_tiny_patch16_224", **{**base, **kw}).double()


def _accelerator():
    from accelerate import Accelerator

    from contrastive.engine import reset_accelerate_state

    reset_accelerate_state()
    return Accelerator(cpu=True)


def _fill_grads(method) -> list[torch.nn.Parameter]:
    """Random gradients on the student's trainable parameters, their norms spread over
    0.05 - 5 so that some are clipped to CLIP and some are not; the trainable parameters."""
    g = torch.Generator().manual_seed(3)
    params = [p for p in method.parameters() if p.requires_grad]
    for i, p in enumerate(params):
        grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        p.grad = grad / grad.norm() * 10 ** (-1.3 + 2 * (i % 5) / 4)
    return params


def _updater(method, direct: bool = True) -> tuple[Updater, torch.optim.Optimizer]:
    acc = _accelerator()
    opt = acc.prepare(build_optimizer(method, "sgd", lr=0.0, weight_decay=0.0))
    up = Updater(method, opt, acc, method=method)
    up.direct = direct
    return up, opt


@pytest.mark.parametrize("build", [dino, ibot], ids=["dino", "ibot"])
@pytest.mark.parametrize("direct", [True, False], ids=["torch", "accelerate"])
def test_per_parameter_clip_is_the_codes_clip_gradients(build, direct):
    """Each gradient g after ``Updater.clip``: g * clip / (|g| + 1e-6) where that is < 1, else g
    (the codes' loop written out); the teacher has no gradients and is not among the parts."""
    method = build(clip_mode="parameter")
    params = _fill_grads(method)
    before = [p.grad.clone() for p in params]
    up, _ = _updater(method, direct)
    assert up.clip_lists is not None and len(up.clip_lists) == len(params)
    assert all(len(part) == 1 for part in up.clip_lists)
    up.clip(CLIP)
    clipped = 0
    for p, g in zip(params, before):
        coef = CLIP / (g.norm(p=2) + 1e-6)
        want = g * coef if coef < 1 else g
        clipped += bool(coef < 1)
        torch.testing.assert_close(p.grad, want, rtol=1e-14, atol=0)
    assert 0 < clipped < len(params)  # both cases met
    assert max(float(p.grad.norm()) for p in params) <= CLIP + 1e-9
    teacher = {id(p) for p in method.teacher.parameters()}
    assert not teacher & {id(p) for part in up.clip_lists for p in part}


@pytest.mark.parametrize("build", [dino, ibot], ids=["dino", "ibot"])
def test_per_parameter_clip_differs_from_all_together(build):
    """The same gradients clipped together (the engine's default) come out otherwise."""
    grads = {}
    for mode in ("parameter", "all"):
        method = build(clip_mode=mode)
        params = _fill_grads(method)
        up, _ = _updater(method)
        assert (up.clip_lists is None) == (mode == "all")
        up.clip(CLIP)
        grads[mode] = [p.grad.clone() for p in params]
    assert not all(torch.equal(a, b) for a, b in zip(grads["parameter"], grads["all"]))


@pytest.mark.parametrize("build", [dino, ibot], ids=["dino", "ibot"])
def test_per_parameter_clip_commutes_with_dropping_the_frozen_last_layer(build):
    """The codes' order (clip every gradient, then ``cancel_gradients_last_layer``) equals the
    engine's (``hold_frozen_groups`` drops the frozen last layer's gradients, then the clip),
    bit for bit, when each parameter is clipped apart; all together, the dropped gradients
    would have counted in the codes' norm and the two orders differ."""
    for mode, same in (("parameter", True), ("all", False)):
        out = []
        for engine_order in (False, True):
            method = build(clip_mode=mode, freeze_last_layer_steps=1)
            params = _fill_grads(method)
            up, opt = _updater(method)
            last = {id(p) for p in method.param_groups()[0].params}
            assert last and method.param_groups()[0].name == "last_layer"
            if engine_order:
                hold_frozen_groups(opt, 0)  # step 0 < 1 frozen step: the gradients dropped
                up.clip(CLIP)
            else:
                up.clip(CLIP)
                for p in params:
                    if id(p) in last:
                        p.grad = None
            assert all((p.grad is None) == (id(p) in last) for p in params)
            out.append([p.grad for p in params if p.grad is not None])
        equal = all(torch.equal(a, b) for a, b in zip(*out))
        assert equal == same, mode


def test_defaults_presets_and_bad_input():
    """The bare methods clip all parameters together (no parts, as before); the presets of the
    authors' settings clip each parameter (DINO vit_small, iBOT vit_small and cifar) or each
    part (DINOv2); DINO's cifar (solo-learn's, no clipping) keeps the default; a wrong mode is a
    one-line error naming the choices."""
    for cls in (DINO, IBOT):
        assert inspect.signature(cls).parameters["clip_mode"].default == "all"
    assert dino().clip_parts() == {} and ibot().clip_parts() == {}
    plain = Updater(dino(), SimpleNamespace(), SimpleNamespace(
        gradient_accumulation_steps=1, distributed_type="other"))
    assert plain.clip_lists is None
    modes = {name: kw.get("clip_mode", "all") for name, kw in DINO.presets.items()}
    assert modes == {"vit_small": "parameter", "cifar": "all"}
    modes = {name: kw.get("clip_mode", "all") for name, kw in IBOT.presets.items()}
    assert modes == {"vit_small": "parameter", "cifar": "parameter", "dinov2_in1k": "part",
                     "dinov2": "part", "dinov2_cifar": "part"}
    for build, name in ((dino, "DINO"), (ibot, "iBOT")):
        with pytest.raises(ValueError, match=f"{name}: clip_mode must be one of") as err:
            build(clip_mode="per_parameter")
        assert "\n" not in str(err.value) and str(CLIP_MODES) in str(err.value)


@pytest.mark.parametrize("build", [dino, ibot], ids=["dino", "ibot"])
def test_parts_cover_each_trainable_student_parameter_once(build):
    """"parameter": one part per trainable student parameter (the weight-norm scale with
    norm_last_layer=False included, a fixed one left out), "part": the student's parts."""
    method = build(clip_mode="parameter")
    parts = method.clip_parts()
    trainable = [p for p in method.parameters() if p.requires_grad]
    assert sorted(id(ps[0]) for ps in parts.values()) == sorted(id(p) for p in trainable)
    assert all(len(ps) == 1 for ps in parts.values())
    fixed = build(clip_mode="parameter", norm_last_layer=True)
    assert len(fixed.clip_parts()) == len(parts) - (1 if build is dino else 2)
    method.clip_mode = "part"
    assert list(method.clip_parts()) == (["encoder", "head"] if build is dino else
                                         ["backbone", "dino_head", "ibot_head"])
