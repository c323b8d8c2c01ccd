"""The fine-tuning controls for a pretrained start (``contrastive/engine/kits/finetune.py``,
issue 49 step 3): the backbone's lr multiplier, its warm start (held still for N steps) and
frozen BatchNorm statistics; off without ``--init``."""

from __future__ import annotations

from pathlib import Path

import torch

from contrastive.engine import train
from contrastive.engine.kits.finetune import (
    WITHOUT_INIT,
    FinetuneSettings,
    apply_finetune,
    resolve_finetune,
)
from contrastive.engine.kits.init import BackboneInit
from contrastive.engine.optim import build_optimizer, set_lr
from contrastive.engine.safe_state import load_torch_bytes
from tests.engine.test_init import _Cfg, _moco, _pipeline, _weights


def _built(settings: FinetuneSettings):
    init = BackboneInit()
    with init.building("small_cnn"):
        method = _moco(_Cfg(), None)
    apply_finetune(method, init.backbones, settings)
    return method, init.backbones


def test_the_multiplier_reaches_exactly_the_backbones_groups():
    method, (backbone,) = _built(FinetuneSettings(lr_scale=0.25, frozen_steps=3))
    opt = build_optimizer(method, "sgd", lr=1.0, weight_decay=1e-4)
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


def test_without_init_the_controls_are_off_and_change_nothing():
    cfg = _Cfg()
    assert resolve_finetune(cfg, pretrained=False) == WITHOUT_INIT
    assert (cfg.backbone_lr_scale, cfg.backbone_frozen_steps, cfg.freeze_bn_stats) == (1.0, 0,
                                                                                       False)
    torch.manual_seed(0)
    plain = _moco(cfg, None)
    torch.manual_seed(0)
    method, _ = _built(WITHOUT_INIT)
    assert type(method).param_groups is type(plain).param_groups
    a, b = build_optimizer(plain, "sgd", lr=1.0, weight_decay=0.0), \
        build_optimizer(method, "sgd", lr=1.0, weight_decay=0.0)
    assert [g["name"] for g in a.param_groups] == [g["name"] for g in b.param_groups]
    assert all(torch.equal(x, y) for x, y in zip(plain.state_dict().values(),
                                                 method.state_dict().values()))


def _checkpoints(run: Path) -> dict[int, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    found = {}
    for f in run.rglob("model.safetensors"):
        step = int("".join(c for c in f.parent.name if c.isdigit()))
        found[step] = load_file(str(f))
    return found


def test_warm_start_frozen_bn_and_the_multiplier_through_a_resumed_run(tmp_path,
                                                                       fresh_accelerate):
    """With --init: the backbone (and its BatchNorm statistics) equal the file for the first 2
    steps while the heads move from step 1; then the backbone moves, its statistics never; a
    resumed run keeps the backbone's lr multiplier."""
    path = _weights(tmp_path)
    from safetensors.torch import load_file

    file = load_file(str(path))
    cfg = dict(init=str(path), lr=0.05, steps=3, backbone_lr_scale=0.5, backbone_frozen_steps=2,
               keep_last=5)
    run = tmp_path / "run"
    train(_Cfg(output_dir=str(run), max_steps=2, **cfg), _moco, _pipeline, recipe="t")
    result = train(_Cfg(output_dir=str(run), resume="auto", **cfg), _moco, _pipeline,
                   recipe="t")
    states = _checkpoints(run)
    assert sorted(states) == [1, 2, 3]
    head = [k for k in states[1] if k.startswith("head.") or k.startswith("projector.")]
    for step, state in states.items():
        backbone = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        stats = [k for k in file if "running" in k or "num_batches" in k]
        assert stats and all(torch.equal(backbone[k], file[k]) for k in stats), step
        same = all(torch.equal(backbone[k], file[k]) for k in file if k not in stats)
        assert same == (step <= 2), step
    assert head, list(states[1])[:20]
    # the heads train while the backbone is held still
    assert any(not torch.equal(states[1][k], states[2][k]) for k in head)
    groups = load_torch_bytes((result.checkpoint / "optimizer.bin").read_bytes(),
                              result.checkpoint / "optimizer.bin")["param_groups"]
    scales = {g["name"]: g.get("lr_scale", 1.0) for g in groups}
    assert scales["backbone"] == 0.5 and scales["decay"] == 1.0
