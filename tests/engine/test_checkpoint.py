"""Checkpoint manager: atomic saves, pruning, compatibility checks, verified resumes."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch import nn

from contrastive.engine.checkpoint import (
    CheckpointManager,
    IncompatibleCheckpointError,
    ResumeMismatchError,
    TrainState,
    check_compatible,
    find_latest,
    model_signature,
    read_meta,
    resolve_resume,
)


class _Toy(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, width), nn.BatchNorm1d(width))
        self.register_buffer("queue", torch.randn(5, width))


@pytest.fixture
def accelerator():
    from accelerate import Accelerator

    from contrastive.engine import reset_accelerate_state

    reset_accelerate_state()
    yield Accelerator(cpu=True)
    reset_accelerate_state()


def _setup(accelerator, root, keep_last=2, width=4):
    torch.manual_seed(0)
    model = _Toy(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = accelerator.prepare(model, opt)
    state = TrainState()
    meta = {"config": {"lr": 0.1, "encoder": "toy"}, "signature": model_signature(model)}
    return model, opt, state, CheckpointManager(accelerator, model, opt, state, root,
                                                keep_last=keep_last, meta=meta)


def _train_step(model, opt):
    loss = model.net(torch.randn(8, 3)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    model.queue.add_(1.0)


def test_save_layout_pruning_and_exact_reload(accelerator, tmp_path):
    model, opt, state, ckpt = _setup(accelerator, tmp_path / "checkpoints")
    for step in range(1, 4):
        _train_step(model, opt)
        state.step, state.micro_in_epoch = step, step
        path = ckpt.save()
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step_00000002", "step_00000003"]  # keep_last=2
    meta = read_meta(path)
    assert meta["step"] == 3 and meta["micro_in_epoch"] == 3 and meta["world_size"] == 1
    from safetensors.torch import load_file

    assert set(load_file(str(path / "model.safetensors"))) == set(model.state_dict())

    saved = {k: v.clone() for k, v in model.state_dict().items()}
    expected_next = (torch.rand(4), random.random())  # the random stream right after the save
    _train_step(model, opt)  # move on, then come back
    ckpt.load(path)
    assert state.step == 3
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert torch.equal(torch.rand(4), expected_next[0]) and random.random() == expected_next[1]


def test_rng_not_restored_fails_loudly(accelerator, tmp_path):
    from contrastive.engine.checkpoint import CheckpointFileError

    model, opt, state, ckpt = _setup(accelerator, tmp_path / "checkpoints")
    _train_step(model, opt)
    state.step = 1
    path = ckpt.save()
    (path / "random_states_0.pt").unlink()  # listed in meta.json: refused, naming the file
    with pytest.raises(CheckpointFileError, match=r"random_states_0.pt is missing"):
        ckpt.load(path)
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"]["random_states_0.pt"]  # not listed: loads, but the stream differs
    (path / "meta.json").write_text(json.dumps(meta))
    torch.rand(10)
    with pytest.raises(ResumeMismatchError, match="random number generator"):
        ckpt.load(path)


def test_files_are_safe_formats_listed_with_hashes(accelerator, tmp_path):
    """Nothing in a checkpoint needs pickle: safetensors, JSON, and torch files that load with
    weights_only=True; meta.json lists every other file with its size and SHA-256."""
    import hashlib

    model, opt, state, ckpt = _setup(accelerator, tmp_path / "checkpoints")
    _train_step(model, opt)
    state.step = 1
    path = ckpt.save()
    names = sorted(p.name for p in path.iterdir())
    assert names == ["meta.json", "model.safetensors", "optimizer.bin", "random_states_0.pt"]
    files = read_meta(path)["files"]
    assert sorted(files) == [n for n in names if n != "meta.json"]
    for name, entry in files.items():
        data = (path / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    for name in ("optimizer.bin", "random_states_0.pt"):
        torch.load(path / name, weights_only=True)  # no pickled objects, no numpy arrays


def test_crash_during_save_keeps_previous_checkpoint(accelerator, tmp_path, monkeypatch):
    from contrastive.engine import checkpoint as ck

    root = tmp_path / "checkpoints"
    model, opt, state, ckpt = _setup(accelerator, root)
    state.step = 1
    good = ckpt.save()
    real_write = ck._write

    def crash(path, data):  # dies half-way through writing the model
        if path.name == "model.safetensors":
            real_write(path, data[: len(data) // 2])
            raise KeyboardInterrupt
        real_write(path, data)

    monkeypatch.setattr(ck, "_write", crash)
    state.step = 2
    with pytest.raises(KeyboardInterrupt):
        ckpt.save()
    assert find_latest(root) == good and resolve_resume("auto", tmp_path) == good
    ckpt.cleanup_partial()
    assert [p.name for p in root.iterdir()] == ["step_00000001"]


def test_signature_and_config_checks(accelerator, tmp_path):
    model, opt, state, ckpt = _setup(accelerator, tmp_path / "checkpoints")
    state.step = 1
    meta = read_meta(ckpt.save())
    same = model_signature(model)
    cfg = {"lr": 0.1, "encoder": "toy", "max_steps": 9}
    assert check_compatible(meta, same, cfg, world_size=1) == []  # operational field ignored
    other = model_signature(_Toy(width=6))
    with pytest.raises(IncompatibleCheckpointError, match=r"different model.*shape"):
        check_compatible(meta, other, cfg, world_size=1)
    with pytest.raises(IncompatibleCheckpointError, match=r"lr: 0.1 -> 0.2.*allow-config-change"):
        check_compatible(meta, same, {**cfg, "lr": 0.2}, world_size=1)
    assert check_compatible(meta, same, {**cfg, "lr": 0.2}, world_size=2,
                            allow_config_change=True) == [
        "lr: 0.1 -> 0.2", "processes: 1 -> 2 (RNG states cannot be restored exactly)"]


def test_resolve_resume(tmp_path):
    assert resolve_resume("", tmp_path) is None
    assert resolve_resume("auto", tmp_path) is None
    ck = tmp_path / "checkpoints" / "step_00000010"
    ck.mkdir(parents=True)
    (ck / "meta.json").write_text(json.dumps({}))
    (tmp_path / "checkpoints" / "step_00000020").mkdir()  # incomplete: no meta.json
    assert resolve_resume("auto", tmp_path) == ck
    assert resolve_resume(str(tmp_path), tmp_path) == ck
    assert resolve_resume(str(ck), tmp_path) == ck
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_resume(str(tmp_path / "checkpoints" / "step_00000020"), tmp_path)


def test_altered_file_is_refused_naming_it(accelerator, tmp_path):
    """A file changed after the save (bit rot, a truncated copy, a swap) no longer matches the
    size/SHA-256 in meta.json: refused before it is parsed, in one line naming it."""
    from contrastive.engine.checkpoint import CheckpointFileError

    model, opt, state, ckpt = _setup(accelerator, tmp_path / "checkpoints")
    _train_step(model, opt)
    state.step = 1
    path = ckpt.save()
    data = bytearray((path / "optimizer.bin").read_bytes())
    data[-30] ^= 1
    (path / "optimizer.bin").write_bytes(bytes(data))
    with pytest.raises(CheckpointFileError) as e:
        ckpt.load(path)
    assert "optimizer.bin does not match the size/SHA-256" in str(e.value)
    assert "\n" not in str(e.value)


def _checkpoint_after_a_step(accelerator, model, opt, tmp_path):
    """One training step, then a checkpoint in tmp_path / "c": (manager, state, meta, path)."""
    state = TrainState()
    meta = {"config": {"lr": 0.1}, "signature": model_signature(model)}
    ckpt = CheckpointManager(accelerator, model, opt, state, tmp_path / "c", keep_last=1,
                             meta=meta)
    _train_step(model, opt)
    state.step = 1
    return ckpt, state, meta, ckpt.save()


def test_a_resume_keeps_this_runs_declared_group_settings(accelerator, tmp_path, caplog):
    """torch's load_state_dict takes the saved groups' keys: a checkpoint whose last layer was
    frozen by its gradient for 3 steps (an older version, or other flags) would silently keep
    that. The run's own settings (frozen by lr for 5 steps) are given back after the verified
    load, with a warning naming the group; the optimiser state itself is the saved one."""
    import logging

    torch.manual_seed(0)
    model = _Toy()
    groups = [{"params": list(model.net[0].parameters()), "name": "last", "frozen_steps": 3},
              {"params": list(model.net[1].parameters()), "name": "rest"}]
    model, opt = accelerator.prepare(model, torch.optim.SGD(groups, lr=0.1, momentum=0.9))
    ckpt, state, _, path = _checkpoint_after_a_step(accelerator, model, opt, tmp_path)
    momentum = opt.state[model.net[0].weight]["momentum_buffer"].clone()
    last = opt.param_groups[0]
    last["frozen_steps"], last["frozen_by_lr"] = 5, True  # this run's build
    caplog.set_level(logging.WARNING)
    ckpt.load(path)
    last = opt.param_groups[0]
    assert last["frozen_steps"] == 5 and last["frozen_by_lr"] is True
    assert "frozen_by_lr" not in opt.param_groups[1] and last["name"] == "last"
    assert torch.equal(opt.state[model.net[0].weight]["momentum_buffer"], momentum)
    assert any("last: {'frozen_steps': 3} -> {'frozen_steps': 5, 'frozen_by_lr': True}"
               in r.getMessage() for r in caplog.records)
    caplog.clear()
    state.step = 2
    ckpt.load(ckpt.save())  # saved with this run's settings: nothing to say
    assert not [r for r in caplog.records if "param-group settings" in r.getMessage()]


def test_a_loop_checkpoint_resumed_by_a_fused_run_steps_fused(accelerator, tmp_path, caplog):
    """A checkpoint of torch's per-parameter loop (every run before the fused default) resumed
    by a run built fused: the groups keep this run's kernel (torch's load_state_dict would put
    the saved ``fused: None`` back, under an optimiser built to step a GradScaler's scaled
    gradients itself), the state is the saved one, and the change is logged."""
    import logging

    from contrastive.engine.optim import build_optimizer, optimizer_kernel

    def build(fused: bool):
        torch.manual_seed(0)
        model = _Toy()
        return accelerator.prepare(model, build_optimizer(model, "adamw", lr=0.1,
                                                          weight_decay=0.1, fused=fused))

    model, opt = build(False)
    _, _, meta, path = _checkpoint_after_a_step(accelerator, model, opt, tmp_path)
    exp_avg = opt.state[model.net[0].weight]["exp_avg"].clone()
    model2, opt2 = build(True)
    caplog.set_level(logging.WARNING)
    CheckpointManager(accelerator, model2, opt2, TrainState(), tmp_path / "c", keep_last=1,
                      meta=meta).load(path)
    assert optimizer_kernel(opt2) == "fused"
    assert torch.equal(opt2.state[model2.net[0].weight]["exp_avg"], exp_avg)
    warned = [r.getMessage() for r in caplog.records if "param-group settings" in r.getMessage()]
    assert warned and "'fused': None} -> {'fused': True}" in warned[0]
    _train_step(model2, opt2)  # and it steps


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_a_resume_keeps_this_runs_optimiser_flags(accelerator, tmp_path, caplog, name):
    """--allow-config-change with another --weight-decay / --sgd-momentum / --nesterov /
    --betas: the trainer logs 'resuming with a changed setting', so the run must use the new
    values; torch's load_state_dict would silently put the checkpoint's back (the lr alone is
    rewritten every step by set_lr). A group whose weight decay follows a schedule ("decays",
    DINO's 0.04 -> 0.4) is rewritten by set_weight_decay every step: not reported."""
    import logging

    from contrastive.engine.optim import build_optimizer, set_weight_decay

    def build(wd: float, momentum: float, betas: tuple[float, float]):
        torch.manual_seed(0)
        model = _Toy()
        opt = build_optimizer(model, name, lr=0.1, weight_decay=wd, momentum=momentum,
                              nesterov=momentum > 0.85, betas=betas)
        return accelerator.prepare(model, opt)

    model, opt = build(0.1, 0.9, (0.9, 0.999))
    ckpt, state, meta, path = _checkpoint_after_a_step(accelerator, model, opt, tmp_path)
    model2, opt2 = build(0.5, 0.8, (0.8, 0.99))  # this run's flags
    ckpt2 = CheckpointManager(accelerator, model2, opt2, TrainState(), tmp_path / "c",
                              keep_last=1, meta=meta)
    caplog.set_level(logging.WARNING)
    ckpt2.load(path)
    decay = next(g for g in opt2.param_groups if g["name"] == "decay")
    assert decay["weight_decay"] == 0.5
    if name == "sgd":
        assert decay["momentum"] == 0.8 and decay["nesterov"] is False
    else:
        assert tuple(decay["betas"]) == (0.8, 0.99)
    warned = [r.getMessage() for r in caplog.records if "param-group settings" in r.getMessage()]
    assert len(warned) == 1 and "decay: {'weight_decay': 0.1" in warned[0]
    assert "\n" not in warned[0]
    caplog.clear()
    set_weight_decay(opt2, 0.3)  # a schedule's value, saved with the group's "decays"
    state2 = ckpt2.state
    state2.step = 2
    again = ckpt2.save()
    model3, opt3 = build(0.5, 0.8, (0.8, 0.99))
    CheckpointManager(accelerator, model3, opt3, TrainState(), tmp_path / "c", keep_last=1,
                      meta=meta).load(again)
    assert not [r for r in caplog.records if "param-group settings" in r.getMessage()]
