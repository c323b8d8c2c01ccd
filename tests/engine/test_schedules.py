"""lr schedules: plain functions of the step, equal to timm's and the official MoCo formulas."""

from __future__ import annotations

import math

import pytest
import torch

from contrastive.engine.schedules import cosine_lr, lr_at, scaled_lr, schedule_time, step_lr


def test_cosine_with_warmup_equals_timm():
    from timm.scheduler import CosineLRScheduler

    total, warmup, peak, floor = 100, 10, 0.5, 0.01
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    timm_sched = CosineLRScheduler(opt, t_initial=total - warmup, lr_min=floor, warmup_t=warmup,
                                   warmup_lr_init=0.0, warmup_prefix=True, t_in_epochs=False)
    for t in range(total):
        ours = cosine_lr(t, total, peak, warmup, floor)
        assert ours == pytest.approx(timm_sched._get_lr(t)[0], rel=1e-12, abs=1e-15), t


def test_lr_at_matches_official_mocov3_per_iteration_formula():
    # main_moco.py (MoCo v3): epoch + i / iters_per_epoch, warmup lr * e / W, then half cosine
    epochs, warmup, spe, lr = 20, 4, 7, 2.4
    for step in range(epochs * spe):
        e = step / spe
        if e < warmup:
            ref = lr * e / warmup
        else:
            ref = lr * 0.5 * (1.0 + math.cos(math.pi * (e - warmup) / (epochs - warmup)))
        got = lr_at(step, steps_per_epoch=spe, epochs=epochs, peak=lr, warmup_epochs=warmup)
        assert got == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_per_epoch_cosine_matches_official_mocov2():
    # official MoCo v2 (--cos): lr *= 0.5 * (1 + cos(pi * epoch / epochs)) once per epoch
    epochs, spe, lr = 10, 5, 0.03
    for step in range(epochs * spe):
        epoch = step // spe
        ref = lr * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))
        assert lr_at(step, steps_per_epoch=spe, epochs=epochs, peak=lr, per="epoch") == \
            pytest.approx(ref, rel=1e-12)


def test_step_schedule_matches_official_mocov1():
    # official MoCo v1: for milestone in schedule: lr *= 0.1 if epoch >= milestone
    epochs, spe, lr, milestones = 200, 3, 0.03, (120, 160)
    for step in range(0, epochs * spe, 7):
        epoch = step // spe
        ref = lr
        for ms in milestones:
            ref *= 0.1 if epoch >= ms else 1.0
        got = lr_at(step, steps_per_epoch=spe, epochs=epochs, peak=lr, schedule="step",
                    milestones=milestones, per="epoch")
        assert got == pytest.approx(ref, rel=1e-12)
    assert step_lr(119.99, 1.0, (120, 160)) == 1.0
    assert step_lr(120, 1.0, (120, 160)) == pytest.approx(0.1)


def test_scaling_rules():
    assert scaled_lr(0.3, 4096, "linear") == pytest.approx(4.8)
    # SimCLR README: 0.075 with sqrt scaling == 0.3 with linear scaling at batch 4096
    assert scaled_lr(0.075, 4096, "sqrt") == pytest.approx(scaled_lr(0.3, 4096, "linear"))
    assert scaled_lr(0.075, 256, "sqrt") == pytest.approx(1.2)  # sqrt(256), not sqrt(256 / 256)
    assert scaled_lr(0.03, 512, "none") == 0.03
    with pytest.raises(ValueError, match="lr_scaling"):
        scaled_lr(0.1, 256, "cubic")


def test_constant_and_bad_names():
    assert lr_at(5, steps_per_epoch=2, epochs=4, peak=0.2, schedule="constant") == 0.2
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_at(0, steps_per_epoch=1, epochs=1, peak=1.0, schedule="exponential")
    with pytest.raises(ValueError, match="schedule_per"):
        schedule_time(0, 1, "batch")


def test_linear_decay_with_warmup_in_steps_is_berts():
    """transformers.get_linear_schedule_with_warmup: lr * t / W, then lr * (T - t) / (T - W)."""
    from contrastive.engine import linear_lr

    peak, total, warm = 1e-3, 100, 10
    for step in (0, 5, 10, 40, 99, 100):
        want = peak * step / warm if step < warm else peak * (total - step) / (total - warm)
        got = lr_at(step, steps_per_epoch=7, epochs=1, peak=peak, schedule="linear",
                    warmup_steps=warm, total_steps=total)
        assert got == pytest.approx(want, abs=1e-15)
        assert linear_lr(step, total, peak, warm) == pytest.approx(want, abs=1e-15)


def test_a_budget_in_steps_sets_the_cosine_length_and_warmups_add():
    # --steps 50 with a 3-step epoch: the cosine ends at step 50, whatever --epochs says
    got = lr_at(50, steps_per_epoch=3, epochs=1000, peak=1.0, warmup_steps=5, total_steps=50)
    assert got == pytest.approx(0.0, abs=1e-12)
    mid = lr_at(27, steps_per_epoch=3, epochs=1000, peak=1.0, warmup_steps=5, total_steps=50)
    assert mid == pytest.approx(0.5 * (1 + math.cos(math.pi * 22 / 45)))
    # --warmup-epochs 1 (3 steps) + --warmup-steps 2: 5 warm-up steps
    assert lr_at(4, steps_per_epoch=3, epochs=10, peak=1.0, warmup_epochs=1,
                 warmup_steps=2) == pytest.approx(4 / 5)
    # without a budget or warm-up in steps, the epoch path is unchanged (bit for bit)
    assert lr_at(7, steps_per_epoch=3, epochs=10, peak=1.0, warmup_epochs=1) == \
        cosine_lr(7 / 3, 10, 1.0, 1)
