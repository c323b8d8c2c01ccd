"""lr schedules: plain functions of the step, equal to timm's and the official MoCo formulas."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from contrastive.engine.schedules import (
    cosine_lr,
    lr_at,
    scaled_lr,
    schedule_time,
    step_lr,
    warmup_warning,
)


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


def test_warmup_warning_names_the_numbers_and_matches_lr_at():
    """dino_vit_small --steps 100 keeps 10 warm-up epochs (of 1251 ImageNet steps at batch
    1024): the warning says the whole run is warm-up, as lr_at computes it."""
    level, text = warmup_warning(steps=100, steps_per_epoch=1251, warmup_epochs=10)
    assert level == logging.WARNING and text == ("lr warm-up of 12510 steps (--warmup-epochs 10 x 1251 steps/epoch) >= "
                    "--steps 100: the whole run is warm-up, the lr never reaches its peak; pass "
                    "--warmup-epochs 0 --warmup-steps N with N < 100")
    lrs = [lr_at(t, steps_per_epoch=1251, epochs=100, peak=1.0, warmup_epochs=10,
                 total_steps=100) for t in range(100)]
    assert max(lrs) == pytest.approx(99 / 12510)  # still rising at the last step
    # a warm-up in epochs that fits: said (INFO), with its share of the run
    assert warmup_warning(steps=1000, steps_per_epoch=195, warmup_epochs=2) == (logging.INFO,
        "lr warm-up of 390 steps (--warmup-epochs 2 x 195 steps/epoch) with --steps 1000: the "
        "warm-up is in epochs, 39% of the run; to set it in steps pass --warmup-epochs 0 "
        "--warmup-steps N")
    # both kinds add, as in lr_at
    assert warmup_warning(steps=10, steps_per_epoch=4, warmup_epochs=2, warmup_steps=2)[1] \
        .startswith("lr warm-up of 10 steps (--warmup-steps 2 + --warmup-epochs 2 x 4 "
                    "steps/epoch) >= --steps 10")
    # in steps only: a warning exactly when the warm-up covers the run (lr_at's boundary)
    assert warmup_warning(steps=10, steps_per_epoch=4, warmup_epochs=0, warmup_steps=10) == (
        logging.WARNING, "lr warm-up of 10 steps (--warmup-steps 10) >= --steps 10: the whole "
        "run is warm-up, the lr never reaches its peak; pass --warmup-steps N with N < 10")
    assert warmup_warning(steps=10, steps_per_epoch=4, warmup_epochs=0, warmup_steps=9) is None
    assert lr_at(9, steps_per_epoch=4, epochs=3, peak=1.0, warmup_steps=9,
                 total_steps=10) == pytest.approx(1.0)
    assert lr_at(9, steps_per_epoch=4, epochs=3, peak=1.0, warmup_steps=10,
                 total_steps=10) == pytest.approx(0.9)
    # a budget in epochs: nothing to say (--warmup-epochs > --epochs is a config error)
    assert warmup_warning(steps=0, steps_per_epoch=4, warmup_epochs=10) is None
