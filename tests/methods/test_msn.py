"""MSN / PMSN (contrastive/methods/msn.py): the patch drop removes exactly the drawn patches of
the random views and none of the focal views'; SGD steps equal a float64 transcription of the
authors' train_step (facebookresearch/msn src/msn_train.py, src/deit.py forward /
forward_features, src/losses.py); the schedules are the code's; accumulation and caching are
refused. Two processes: test_msn_distributed.py."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from contrastive.engine.grad_cache import GradCacheError, check_grad_cache
from contrastive.methods import MSN, get_method

VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, dynamic_img_size=True)
SMALL = dict(hidden_dim=12, out_dim=8, num_prototypes=6, encoder_kwargs=VIT)
STEP_TOL = dict(rtol=1e-9, atol=1e-12)  # float64


def _load_by_path(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference():
    """The authors' loss, transcribed (tests/losses/msn_reference.py), loaded by path."""
    return _load_by_path(Path(__file__).parents[1] / "losses" / "msn_reference.py")


def _method(seed=0, **kw) -> MSN:
    torch.manual_seed(seed)
    return MSN("timm:vit_tiny_patch16_224", **{**SMALL, **kw}).double()


def _views(seed=0, b=4):
    g = torch.Generator().manual_seed(seed)
    sizes = (16, 16, 8, 8)  # target, one random view, two focal views
    return [torch.randn(b, 3, s, s, generator=g, dtype=torch.float64) for s in sizes]


def test_patch_drop_removes_exactly_the_drawn_patches_of_the_random_views():
    """With the drawn subset fixed, changing a dropped patch's pixels of the random view leaves
    its head output unchanged, changing a kept one does not; the focal views (another size)
    keep every patch. The subset: floor(L (1 - patch_drop)) distinct patches, one for the
    batch."""
    method = _method(patch_drop=0.25).eval()  # eval: BN running stats, rows independent
    keep = method.draw_keep(3, 16)
    assert keep.shape == (3, 12) and len(set(keep[0].tolist())) == 12 and (keep == keep[0]).all()
    kept = keep[0].tolist()
    method.draw_keep = lambda n, length: keep[:1].expand(n, -1)  # type: ignore[method-assign]
    views = _views(b=3)
    base = method._anchors(views[1:])

    def poke(view, patch):  # new pixels in one 4 x 4 patch of view 1 (random) or 2 (focal)
        changed = [v.clone() for v in views[1:]]
        r, c = divmod(patch, views[view].shape[-1] // 4)
        changed[view - 1][:, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 1.0
        return method._anchors(changed)

    dropped = next(p for p in range(16) if p not in kept)
    torch.testing.assert_close(poke(1, dropped), base, rtol=0, atol=0)
    assert (poke(1, kept[0])[:3] - base[:3]).abs().max() > 1e-6
    for patch in range(4):  # the 8-px focal view's 4 patches all count
        assert (poke(2, patch)[3:6] - base[3:6]).abs().max() > 1e-6


def authors_steps(method: MSN, batches, total: int, lr: float) -> dict:
    """msn_train.py's train_step (one process), from ``method``'s initial weights: deit.py's
    forward (crops grouped by size, patch_drop on the first group only) and forward_features
    (patch drop after the position embedding, class token kept, the fc head inside), the
    loss of src/losses.py, SGD, then the teacher's momentum update with the code's schedule."""
    ref = _reference()
    vit, fc = copy.deepcopy(method.encoder), copy.deepcopy(method.head)
    target_vit, target_fc = copy.deepcopy(vit), copy.deepcopy(fc)
    prototypes = method.prototypes.detach().clone().requires_grad_()
    params = [*vit.parameters(), *fc.parameters(), prototypes]
    opt = torch.optim.SGD(params, lr=lr)
    m0, inc = method.base_momentum, (1.0 - method.base_momentum) / (total * 1.25)
    momentum_scheduler = (m0 + inc * i for i in range(int(total * 1.25) + 1))

    def forward_features(net, head, x, patch_drop):
        x = net._pos_embed(net.patch_embed(x))  # cls token + position embedding (timm's)
        if patch_drop > 0:
            T_H = int(np.floor((x.shape[1] - 1) * (1. - patch_drop)))
            perm = 1 + torch.randperm(x.shape[1] - 1)[:T_H]  # keep class token
            idx = torch.cat([torch.zeros(1, dtype=perm.dtype, device=perm.device), perm])
            x = x[:, idx, :]
        x = net.norm(net.blocks(x))[:, 0]
        return head(x)

    def forward(net, head, x, patch_drop=0.):
        idx_crops = torch.cumsum(torch.unique_consecutive(
            torch.tensor([inp.shape[-1] for inp in x]), return_counts=True)[1], 0)
        start_idx, out = 0, []
        for end_idx in idx_crops:
            out.append(forward_features(net, head, torch.cat(x[start_idx:end_idx]), patch_drop))
            patch_drop = 0.
            start_idx = end_idx
        return torch.cat(out)

    losses = []
    for step, imgs in enumerate(batches):
        torch.manual_seed(100 + step)
        opt.zero_grad()
        z = forward(vit, fc, imgs[1:], patch_drop=method.patch_drop)
        with torch.no_grad():
            h = forward(target_vit, target_fc, imgs[:1])
        ploss, me_max = ref.authors_loss(z, h, prototypes, len(imgs) - 1, T=0.25, sinkhorn=True)
        loss = ploss + 1.0 * me_max
        loss.backward()
        opt.step()
        with torch.no_grad():
            m = next(momentum_scheduler)
            for q, k in zip([*vit.parameters(), *fc.parameters()],
                            [*target_vit.parameters(), *target_fc.parameters()]):
                k.data.mul_(m).add_((1. - m) * q.detach().data)
        losses.append(loss.detach())
    return {"loss": torch.stack(losses), "params": [*vit.parameters(), *fc.parameters(),
                                                    prototypes]}


def test_sgd_steps_equal_the_authors_train_step():
    method, total, lr = _method(patch_drop=0.25, momentum=0.9), 4, 0.5
    batches = [_views(seed=s) for s in range(total)]
    want = authors_steps(method, batches, total, lr)
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=lr)
    losses = []
    for step, views in enumerate(batches):
        torch.manual_seed(100 + step)
        out = method(method.make_batch(views, step=step, total_steps=total))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].detach())
    torch.testing.assert_close(torch.stack(losses), want["loss"], **STEP_TOL)
    got = [*method.encoder.parameters(), *method.head.parameters(), method.prototypes]
    for a, b in zip(got, want["params"]):
        torch.testing.assert_close(a, b, **STEP_TOL)
    assert (want["loss"][2:] - want["loss"][1]).abs().min() > 1e-6  # the steps moved


def test_schedules_are_the_code_s():
    """momentum_scheduler (0.996 + i (1 - 0.996) / (1.25 T), the update after step i: here the
    update that opens step i + 1) and CosineWDSchedule (T_max = int(1.25 T), stepped before
    the optimiser step: step s uses its value after s + 1 calls)."""
    method, total = _method(weight_decay=0.04, weight_decay_end=0.4), 1000
    t_max = int(1.25 * total)
    for step in (0, 1, 2, 500, 999):
        values = method.schedule_values(step, total)
        m_code = 0.996 + max(step - 1, 0) * (1 - 0.996) / (total * 1.25)
        progress = (step + 1) / t_max
        wd_code = min(0.4, 0.4 + (0.04 - 0.4) * 0.5 * (1. + math.cos(math.pi * progress)))
        assert values["momentum"] == pytest.approx(m_code, rel=1e-12)
        assert values["weight_decay"] == pytest.approx(wd_code, rel=1e-12)
    assert [g.name for g in method.param_groups()] == ["prototypes"]
    assert method.param_groups()[0].weight_decay == 0.0  # the code's WD_exclude


def test_pmsn_flag_and_bad_settings(tiny):
    views = _views()
    msn, pmsn = _method(), _method(prior="power_law")
    a = msn(msn.make_batch(views, step=0, total_steps=4))
    torch.manual_seed(0)
    b = pmsn(pmsn.make_batch(views, step=0, total_steps=4))
    assert (a["regularizer"] - b["regularizer"]).abs() > 1e-6
    assert isinstance(get_method("msn", encoder="timm:vit_tiny_patch16_224", **SMALL), MSN)
    with pytest.raises(ValueError, match="prior must be one of"):
        _method(prior="zipf")
    with pytest.raises(ValueError, match="patch_drop"):
        _method(patch_drop=1.0)
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        MSN(tiny())


def test_engine_refuses_grad_cache_and_accumulation():
    method = _method()
    with pytest.raises(GradCacheError, match="--grad-accum-steps 2 with MSN: its loss couples"):
        check_grad_cache(method, 0, 2)
    with pytest.raises(GradCacheError, match="no backbone the engine can cache"):
        check_grad_cache(method, 2, 1)
    assert check_grad_cache(method, 0, 1) == "plain"
