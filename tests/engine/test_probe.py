"""The online linear probe: logged, resumable bit-exactly, and invisible to the method."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from contrastive.engine import ImageConfig, train
from contrastive.engine.kits.image_probe import OnlineProbe

# small_cnn has batch norm: a train-mode probe forward would move its running statistics
TINY = dict(data="shapes:n=64,size=16", encoder="small_cnn", image_size=16, batch_size=16,
            epochs=2, num_workers=0, progress=False, mixed_precision="no", save_every_steps=2,
            save_every_epochs=0, log_every=1, probe_lr=0.5)


def _method(cfg, data):
    from contrastive.methods import SimCLR

    return SimCLR(encoder=cfg.encoder, dim=8, mlp_hidden=16, temperature=0.5)


def _pipeline(cfg):
    from contrastive.augment import get_pipeline

    return get_pipeline("simclr", image_size=cfg.image_size)


def _run(out, **kw):
    return train(ImageConfig(output_dir=str(out), **{**TINY, **kw}), _method, _pipeline,
                 recipe="probe-test")


def _probe_records(out):
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["probe_top1"]) for r in lines if "probe_top1" in r]


def test_the_probe_does_not_change_the_method(tmp_path, fresh_accelerate):
    """Encoder, heads and optimiser after 4 steps are bit-identical with the probe on and off."""
    _run(tmp_path / "off", max_steps=4)
    _run(tmp_path / "on", max_steps=4, online_probe=True)
    ckpt = "checkpoints/step_00000004"
    off, on = (load_file(str(tmp_path / r / ckpt / "model.safetensors")) for r in ("off", "on"))
    assert off.keys() == on.keys() and all(torch.equal(off[k], on[k]) for k in off)
    assert (tmp_path / "on" / ckpt / "probe.pt").is_file()
    assert not (tmp_path / "off" / ckpt / "probe.pt").exists()
    assert _probe_records(tmp_path / "off") == []
    records = _probe_records(tmp_path / "on")
    assert [s for s, _ in records] == [1, 2, 3, 4] and all(0 <= t <= 100 for _, t in records)


def test_the_probe_resumes_bit_exactly(tmp_path, fresh_accelerate):
    _run(tmp_path / "straight", max_steps=4, online_probe=True)
    _run(tmp_path / "resumed", max_steps=2, online_probe=True)
    _run(tmp_path / "resumed", max_steps=4, online_probe=True, resume="auto")
    ckpt = "checkpoints/step_00000004/probe.pt"
    a, b = (torch.load(tmp_path / r / ckpt, weights_only=True) for r in ("straight", "resumed"))
    assert all(torch.equal(a["head"][k], b["head"][k]) for k in a["head"])
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    assert all(torch.equal(a["optimizer"]["state"][i]["momentum_buffer"],
                           b["optimizer"]["state"][i]["momentum_buffer"])
               for i in a["optimizer"]["state"])
    assert _probe_records(tmp_path / "straight") == _probe_records(tmp_path / "resumed")
    assert a["head"]["weight"].abs().sum() > 0  # it learned something


def test_probe_predicts_before_it_learns_and_learns_separable_classes():
    g = torch.Generator().manual_seed(0)
    probe = OnlineProbe(4, 3, lr=0.5)
    y = torch.arange(48) % 3
    x = torch.eye(4)[y] * 3 + 0.3 * torch.randn(48, 4, generator=g)
    probe.step(x, y)
    assert probe.pop_top1() == pytest.approx(100.0 / 3)  # zero head: every logit ties -> class 0
    for _ in range(30):
        probe.step(x, y)
    probe.pop_top1()
    probe.step(x, torch.where(y == 0, -1, y))  # unknown labels are not counted
    assert probe.pop_top1() == 100.0 and probe.pop_top1() is None


def test_the_probe_curve_is_drawn(tmp_path, fresh_accelerate):
    pytest.importorskip("matplotlib")
    from contrastive.eval.plot import plot_curves

    _run(tmp_path / "run", max_steps=2, online_probe=True)
    png = plot_curves(tmp_path / "run", tmp_path / "probe.png", keys=["loss", "probe_top1"])
    assert png.read_bytes()[:4] == b"\x89PNG"
