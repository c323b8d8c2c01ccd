"""The fine-tuning controls for a pretrained start (``contrastive/engine/kits/finetune.py``,
issue 49 step 3): the backbone's lr multiplier and warm start, declared to the optimiser by the
kit (``DataAdapter.param_groups``), and frozen BatchNorm statistics; off without ``--init``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from contrastive.engine import run, train
from contrastive.engine.kits.base import KitOptionError
from contrastive.engine.kits.finetune import (
    WITH_INIT,
    WITHOUT_INIT,
    FinetuneSettings,
    backbone_groups,
    freeze_backbone_bn,
    resolve_finetune,
)
from contrastive.engine.kits.image import ImageAdapter
from contrastive.engine.kits.init import BackboneInit
from contrastive.engine.optim import build_optimizer, hold_frozen_groups, set_lr
from contrastive.engine.safe_state import load_torch_bytes
from contrastive.methods.base import ParamGroup
from contrastive.nn import create_encoder
from tests.engine.test_init import _Cfg, _moco, _pipeline, _weights


def _built(settings: FinetuneSettings):
    """A MoCo v2 on ``small_cnn`` built as a run builds it, its backbone group and BN freeze."""
    init = BackboneInit()
    with init.building("small_cnn"):
        method = _moco(_Cfg(), None)
    freeze_backbone_bn(method, init.backbones, settings)
    return method, init.backbones, backbone_groups(init.backbones, settings)


def test_the_multiplier_reaches_exactly_the_backbones_groups():
    method, (backbone,), groups = _built(FinetuneSettings(lr_scale=0.25, frozen_steps=3))
    opt = build_optimizer(method, "sgd", lr=1.0, weight_decay=1e-4, extra_groups=groups)
    set_lr(opt, 0.4)
    mine = {id(p) for p in backbone.parameters()}
    for g in opt.param_groups:
        in_backbone = {id(p) in mine for p in g["params"]}
        assert len(in_backbone) == 1, g["name"]  # a group is all backbone or none of it
        if in_backbone == {True}:
            assert g["name"].startswith("backbone") and g["frozen_steps"] == 3
            assert abs(g["lr"] - 0.1) < 1e-12
        else:
            assert g["lr"] == 0.4 and "frozen_steps" not in g
    assert sum(len(g["params"]) for g in opt.param_groups if g["name"].startswith("backbone")) \
        == len(mine)


class _Net(nn.Module):
    """A backbone, a head, and a method group of its own (the backbone's first bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = create_encoder("small_cnn")
        self.head = nn.Linear(self.encoder.num_features, 4)
        self.own = next(p for p in self.encoder.parameters() if p.ndim == 1)

    def param_groups(self) -> list[ParamGroup]:
        return [ParamGroup("own", [self.own], lr_scale=0.5)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).pow(2).mean()


def test_a_methods_group_keeps_its_parameters_and_two_extra_groups_may_not_share():
    net = _Net()
    groups = backbone_groups([net.encoder], FinetuneSettings(lr_scale=0.1))
    opt = build_optimizer(net, "sgd", lr=1.0, weight_decay=0.0, extra_groups=groups)
    where = {id(p): g["name"] for g in opt.param_groups for p in g["params"]}
    assert where[id(net.own)] == "own_no_decay"
    assert {where[id(p)] for p in net.encoder.parameters() if p is not net.own} == \
        {"backbone", "backbone_no_decay"}
    assert {where[id(p)] for p in net.head.parameters()} == {"decay", "no_decay"}
    with pytest.raises(ValueError, match="two declared groups"):
        build_optimizer(net, "sgd", lr=1.0, weight_decay=0.0, extra_groups=groups * 2)


def test_the_warm_start_holds_the_backbone_from_the_first_step_while_the_head_moves():
    """The loop's order (backward, hold_frozen_groups(step), step) for steps 0, 1 and 2 of a
    2-step warm start: the backbone is bit-unchanged for two steps, then moves; the head moves
    from the first."""
    torch.manual_seed(0)
    net = _Net()
    groups = backbone_groups([net.encoder], FinetuneSettings(lr_scale=0.5, frozen_steps=2))
    opt = build_optimizer(net, "sgd", lr=0.1, weight_decay=1e-4, extra_groups=groups)
    x = torch.randn(8, 3, 16, 16)
    weights = [p for p in net.encoder.parameters() if p is not net.own]
    for step in range(3):
        before = [p.detach().clone() for p in weights], net.head.weight.detach().clone()
        opt.zero_grad()
        net(x).backward()
        hold_frozen_groups(opt, step)
        opt.step()
        backbone_still = all(torch.equal(a, p) for a, p in zip(before[0], weights))
        assert backbone_still == (step < 2), step
        assert not torch.equal(before[1], net.head.weight), step


class _WithCopy(nn.Module):
    """A plain nn.Sequential backbone, its momentum-style copy, and a head with BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.key = copy.deepcopy(self.encoder).requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).mean() + self.key(x).mean()


def test_frozen_bn_statistics_stay_in_the_backbone_and_its_copies_not_in_the_heads():
    torch.manual_seed(0)
    net = _WithCopy()
    freeze_backbone_bn(net, [net.encoder], WITH_INIT)
    stats = {k: v.clone() for k, v in net.state_dict().items() if "running" in k}
    net.train()
    for _ in range(2):
        net(torch.randn(8, 3, 8, 8)).backward()
    after = net.state_dict()
    moved = {k for k in stats if not torch.equal(after[k], stats[k])}
    assert moved == {"head.1.running_mean", "head.1.running_var"}
    assert net.encoder[1].weight.grad is not None  # the affine weights still train
    assert not net.encoder[1].training and net.head[1].training


def test_without_init_the_controls_are_off_and_change_nothing():
    cfg = _Cfg()
    assert resolve_finetune(cfg, pretrained=False) == WITHOUT_INIT
    assert (cfg.backbone_lr_scale, cfg.backbone_frozen_steps, cfg.freeze_bn_stats) == (1.0, 0,
                                                                                       False)
    torch.manual_seed(0)
    plain = _moco(cfg, None)
    torch.manual_seed(0)
    method, backbones, groups = _built(WITHOUT_INIT)
    assert groups == [] and ImageAdapter(_pipeline(cfg)).param_groups(cfg, method) == []
    assert not any(getattr(m, "_bn_stats_frozen", False) for m in method.modules())
    a, b = build_optimizer(plain, "sgd", lr=1.0, weight_decay=0.0), \
        build_optimizer(method, "sgd", lr=1.0, weight_decay=0.0, extra_groups=groups)
    assert [g["name"] for g in a.param_groups] == [g["name"] for g in b.param_groups]
    assert all(torch.equal(x, y) for x, y in zip(plain.state_dict().values(),
                                                 method.state_dict().values()))


@pytest.mark.parametrize("flag", [["--backbone-lr-scale", "-1"], ["--backbone-lr-scale", "nan"],
                                  ["--backbone-frozen-steps", "-2"]])
def test_a_bad_value_is_one_line_before_the_run_folder(tmp_path, capsys, fresh_accelerate, flag):
    with pytest.raises(SystemExit) as stop:
        run(_Cfg, _moco, _pipeline, argv=[*flag, "--output-dir", str(tmp_path / "run")],
            name="t")
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"t.py: error: {flag[0]} must be"), err
    assert not (tmp_path / "run").exists()


def test_controls_without_a_backbone_to_apply_them_to_are_one_line():
    with pytest.raises(KitOptionError) as e:
        backbone_groups([], FinetuneSettings(lr_scale=0.5))
    assert "\n" not in str(e.value) and "--backbone-lr-scale" in str(e.value)


def _checkpoints(run: Path) -> dict[int, Path]:
    return {int("".join(c for c in f.parent.name if c.isdigit())): f.parent
            for f in run.rglob("model.safetensors")}


def _groups(checkpoint: Path) -> dict[str, dict]:
    state = load_torch_bytes((checkpoint / "optimizer.bin").read_bytes(),
                             checkpoint / "optimizer.bin")
    return {g["name"]: g for g in state["param_groups"]}


def test_warm_start_frozen_bn_and_the_multiplier_through_a_resumed_run(tmp_path,
                                                                       fresh_accelerate):
    """With --init, through the engine's loop: the backbone equals the file for the first 2
    steps while the heads move, then moves; its BatchNorm statistics, and those of the
    momentum copy, never move; stopped at step 2 and resumed, the run keeps the backbone
    group's multiplier and warm start (and trains the backbone at 0.5 x the lr)."""
    path = _weights(tmp_path)
    file = load_file(str(path))
    stats = [k for k in file if "running" in k or "num_batches" in k]
    cfg = dict(init=str(path), lr=0.05, steps=3, backbone_lr_scale=0.5, backbone_frozen_steps=2,
               keep_last=5)
    out = tmp_path / "run"
    train(_Cfg(output_dir=str(out), max_steps=2, **cfg), _moco, _pipeline, recipe="t")
    train(_Cfg(output_dir=str(out), resume="auto", **cfg), _moco, _pipeline, recipe="t")
    found = _checkpoints(out)
    assert sorted(found) == [1, 2, 3]
    states = {step: load_file(str(p / "model.safetensors")) for step, p in found.items()}
    head = [k for k in states[1] if k.startswith(("head.", "projector."))]
    assert head and stats, list(states[1])[:20]
    for step, state in states.items():
        for prefix in ("encoder.", "key_net.module.0."):
            copy = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            assert all(torch.equal(copy[k], file[k]) for k in stats), (step, prefix)
        backbone = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        same = all(torch.equal(backbone[k], file[k]) for k in file if k not in stats)
        assert same == (step <= 2), step
    assert any(not torch.equal(states[1][k], states[2][k]) for k in head)  # backbone held
    before, after = _groups(found[2]), _groups(found[3])  # saved before / after the resume
    for name in ("backbone", "backbone_no_decay"):
        assert (before[name]["lr_scale"], before[name]["frozen_steps"]) == (0.5, 2)
        assert (after[name]["lr_scale"], after[name]["frozen_steps"]) == (0.5, 2)
        assert after[name]["lr"] == pytest.approx(0.5 * after["decay"]["lr"], rel=1e-12)
    assert after["decay"]["lr"] > 0 and "lr_scale" not in after["decay"]
