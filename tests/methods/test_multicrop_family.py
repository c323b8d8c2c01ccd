"""SwAV and DINO against their papers' pseudo-code written plainly here (float64, several SGD
steps, multi-crop: 2 global + 2 local views of another size), their declared schedules and
parameter groups, DINO's augmentation preset, and the engine's weight-decay schedule."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.augment import get_pipeline
from contrastive.engine.optim import build_optimizer, set_weight_decay
from contrastive.losses.clustering import sinkhorn_knopp
from contrastive.methods import DINO, SwAV
from contrastive.nn import cosine_momentum

STEP_TOL = dict(rtol=1e-9, atol=1e-12)  # float64 over a few steps: rounding stays ~1e-13


def _views(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 3, s, s, generator=g, dtype=torch.float64) for s in (12, 12, 8, 8)]


def _pair_ce(targets, logits, tau):
    """mean over (t, v != t) of mean_b -sum_k targets_t log softmax(logits_v / tau)."""
    terms = [-(targets[t] * F.log_softmax(logits[v] / tau, dim=1)).sum(1).mean()
             for t in range(len(targets)) for v in range(len(logits)) if v != t]
    return sum(terms) / len(terms)


def test_swav_matches_the_paper_over_steps(tiny):
    torch.manual_seed(0)
    method = SwAV(tiny(), dim=6, mlp_hidden=10, num_prototypes=7, temperature=0.1).double()
    f = copy.deepcopy(nn.Sequential(method.encoder, method.projector))
    protos = copy.deepcopy(method.prototypes)
    opt = torch.optim.SGD(method.parameters(), lr=0.2)
    opt_ref = torch.optim.SGD([*f.parameters(), *protos.parameters()], lr=0.2)
    for step in range(3):
        views = _views(seed=step)
        out = method({"views": views})
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        with torch.no_grad():
            protos.weight.copy_(F.normalize(protos.weight, dim=1))
        scores = [protos(F.normalize(f(x), dim=1)) for x in views]
        codes = [sinkhorn_knopp(s.detach(), epsilon=0.05, iterations=3) for s in scores[:2]]
        loss = _pair_ce(codes, scores, 0.1)
        opt_ref.zero_grad()
        loss.backward()
        opt_ref.step()
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
    for a, b in zip([*method.encoder.parameters(), *method.projector.parameters(),
                     *method.prototypes.parameters()], [*f.parameters(), *protos.parameters()]):
        torch.testing.assert_close(a, b, **STEP_TOL)


def test_swav_queue_joins_once_full_and_prototypes_group(tiny):
    torch.manual_seed(0)
    method = SwAV(tiny(), dim=6, mlp_hidden=10, num_prototypes=7, queue_size=10,
                  freeze_prototypes_steps=3).double()
    (group,) = method.param_groups()
    assert group.frozen_steps == 3 and group.params == [method.prototypes.weight]
    method({"views": _views(seed=0)})  # 5 rows queued, not used yet
    assert int(method.queue_rows) == 5
    method({"views": _views(seed=1)})  # 10 rows: full
    views = _views(seed=2)
    with torch.no_grad():
        kept = method.queue.ordered_keys().clone().view(10, 2, 6)
        out = method({"views": views})
        w = method.prototypes.weight
        scores = [method.prototypes(F.normalize(method.projector(method.encoder(x)), dim=1))
                  for x in views]
        codes = [sinkhorn_knopp(torch.cat([kept[:, t] @ w.T, scores[t]]))[-5:] for t in range(2)]
    torch.testing.assert_close(out["loss"], _pair_ce(codes, scores, 0.1), **STEP_TOL)


def test_swav_queue_starts_at_its_step(tiny):
    """Before ``queue_start_steps`` the queue is neither filled nor used (the official
    ``epoch_queue_starts``): the loss equals a queue-less SwAV's; from that step it fills."""
    def build(**kw):
        torch.manual_seed(0)
        return SwAV(tiny(), dim=6, mlp_hidden=10, num_prototypes=7, **kw).double()

    method, plain = build(queue_size=10, queue_start_steps=2), build()
    on = method.schedules()["queue_on"]
    assert [on(s, 9) for s in (0, 1, 2, 8)] == [0.0, 0.0, 1.0, 1.0]
    assert plain.schedules() == {}
    with torch.no_grad():
        for step in range(3):
            views = _views(seed=step)
            out = method(method.make_batch(views, step=step, total_steps=9))
            if step < 2:
                assert int(method.queue_rows) == 0, step
                torch.testing.assert_close(out["loss"], plain({"views": views})["loss"],
                                           **STEP_TOL)
    assert int(method.queue_rows) == 5
    with pytest.raises(ValueError, match="queue_start_steps"):
        SwAV(tiny(), queue_size=10, queue_start_steps=-1)


def test_dino_matches_the_paper_over_steps(tiny):
    torch.manual_seed(0)
    method = DINO(tiny(), out_dim=9, hidden_dim=10, bottleneck_dim=5, momentum=0.9,
                  teacher_temperature=0.07, warmup_teacher_temperature=0.04,
                  warmup_teacher_steps=2).double()
    student = copy.deepcopy(nn.Sequential(method.encoder, method.head))
    teacher = copy.deepcopy(student)
    center = torch.zeros(9, dtype=torch.float64)
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.3)
    opt_ref = torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=0.3)
    for step in range(3):
        views = _views(seed=step)
        out = method(method.make_batch(views, step=step, total_steps=3))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        m, tau_t = cosine_momentum(step, 3, 0.9), [0.04, 0.055, 0.07][step]
        with torch.no_grad():
            for pt, ps in zip(teacher.parameters(), student.parameters()):
                pt.copy_(m * pt + (1 - m) * ps)
            t_out = [teacher(x) for x in views[:2]]
        s_out = [student(x) for x in views]
        targets = [F.softmax((t - center) / tau_t, dim=1) for t in t_out]
        loss = _pair_ce(targets, s_out, 0.1)
        center = 0.9 * center + 0.1 * torch.cat(t_out).mean(0)
        opt_ref.zero_grad()
        loss.backward()
        opt_ref.step()
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
        torch.testing.assert_close(method.center, center, **STEP_TOL)
    for a, b in zip(method.teacher.parameters(), teacher.parameters()):
        torch.testing.assert_close(a, b, **STEP_TOL)


def test_dino_head_schedules_and_groups(tiny):
    method = DINO(tiny(), out_dim=9, hidden_dim=10, bottleneck_dim=5, weight_decay=0.04,
                  weight_decay_end=0.4, freeze_last_layer_steps=4)
    g = method.head.last_layer.parametrizations.weight.original0
    assert not g.requires_grad and torch.all(g == 1)  # norm_last_layer: unit-norm prototypes
    sched = method.schedules()
    assert sched["weight_decay"](0, 10) == pytest.approx(0.04)
    assert sched["weight_decay"](5, 10) == pytest.approx(0.22)
    assert sched["weight_decay"](10, 10) == pytest.approx(0.4)
    assert sched["teacher_temperature"](0, 10) == pytest.approx(0.04)  # no warm-up by default
    (group,) = method.param_groups()
    assert group.frozen_steps == 4 and group.params[0] is method.head.last_layer.parametrizations.weight.original1
    with pytest.raises(ValueError, match="weight_decay_end"):
        DINO(tiny(), out_dim=9, weight_decay=0.04)
    assert method.step_spans() == {"freeze_last_layer_steps": 4}  # no warm-up: none to warn of
    warmed = DINO(tiny(), out_dim=9, hidden_dim=10, bottleneck_dim=5,
                  warmup_teacher_temperature=0.02, warmup_teacher_steps=30)
    assert warmed.step_spans() == {"warmup_teacher_steps": 30, "freeze_last_layer_steps": 0}
    flat = DINO(tiny(), out_dim=9, hidden_dim=10, bottleneck_dim=5,
                warmup_teacher_temperature=0.04, warmup_teacher_steps=30)  # 0.04 -> 0.04
    assert "warmup_teacher_steps" not in flat.step_spans()


def test_weight_decay_schedule_reaches_only_the_decaying_groups():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = build_optimizer(net, "sgd", lr=0.1, weight_decay=0.04)
    set_weight_decay(opt, 0.3)
    wd = {g["name"]: g["weight_decay"] for g in opt.param_groups}
    assert wd == {"decay": 0.3, "no_decay": 0.0}
    state = opt.state_dict()["param_groups"]
    assert [g["decays"] for g in state] == [True, False]  # survives a resume


def test_dino_preset_views():
    p = get_pipeline("dino", image_size=224)
    g1, g2, *local = p.views
    assert (g1.size, g2.size, len(local), local[0].size) == (224, 224, 8, 96)
    assert (g1.blur_p, g2.blur_p, local[0].blur_p) == (1.0, 0.1, 0.5)
    assert (g1.solarize_p, g2.solarize_p, local[0].solarize_p) == (0.0, 0.2, 0.0)
    assert g1.scale == (0.4, 1.0) and local[0].scale == (0.05, 0.4)
    assert (g1.brightness, g1.saturation, g1.hue, g1.jitter_p, g1.grayscale_p) == (
        0.4, 0.2, 0.1, 0.8, 0.2)
    small = get_pipeline("dino", image_size=32, num_local=2)
    assert [v.size for v in small.views] == [32, 32, 14, 14]
    assert all(v.blur_p == 0.0 for v in small.views)
    assert math.isclose(small.views[1].solarize_p, 0.2)


def test_deep_infomax_matches_its_formula_and_uses_the_encoder_features(tiny):
    from contrastive.losses.mutual_info import dim_local_global
    from contrastive.methods import DeepInfoMax
    from contrastive.nn import create_encoder

    torch.manual_seed(0)
    enc = create_encoder("small_cnn")
    method = DeepInfoMax(enc, mi_units=16, estimator="infonce").double()
    x = _views(n=4)[0]
    local, glob = method.features(x)
    torch.testing.assert_close(glob, method.encoder(x), **STEP_TOL)  # the encoder's own output
    out = method({"views": [x]})
    lo = method.mi_local(local)
    g = method.mi_global(glob[:, :, None, None]).flatten(1)
    torch.testing.assert_close(out["loss"], dim_local_global(g, lo, estimator="infonce"),
                               **STEP_TOL)
    # the shortcut starts as a noisy identity when it widens (the code's initialisation)
    from contrastive.methods.deep_infomax import MIConvNet

    w = MIConvNet(4, 8).shortcut.weight[:, :, 0, 0]
    assert torch.all(torch.diagonal(w[:4]) == 1.0) and w[4:].abs().max() <= 0.01
    with pytest.raises(ValueError, match="local_stage"):
        DeepInfoMax(create_encoder("small_cnn"), local_stage=9)
