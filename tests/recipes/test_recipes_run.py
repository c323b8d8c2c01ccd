"""Every recipe trains a few steps end to end, on tiny generated data (in this process, as its
program runs: tests/recipes/test_resume.py and test_bad_input.py run them as programs)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from contrastive.engine import parse_config
from contrastive.engine.schedules import lr_at, scaled_lr

ALL_RECIPES = ["dcl_cifar", "moco_cifar", "moco_r50", "mocov1_r50", "mocov3_r50",
               "mocov3_vit_small",
               "simclr_cifar", "simclr_r50"]
REQUIRED = {"step", "epoch", "loss", "lr", "pos_acc", "images_per_s", "embedding_std"}


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_recipe_runs_and_leaves_encoder_and_metrics(name, tmp_path, rx):
    out = tmp_path / "run"
    rx.run_recipe_here(name, "--max-steps", "3", "--output-dir", str(out))
    records = [r for r in rx.read_metrics(out) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert REQUIRED <= set(r), REQUIRED - set(r)
        assert math.isfinite(r["loss"]) and r["images_per_s"] > 0
        assert 0 < r["embedding_std"] < 1
    config = json.loads((out / "config.json").read_text())
    assert config["encoder"] == "small_cnn" and config["recipe"] == name
    assert (out / "checkpoints" / "step_00000003" / "meta.json").is_file()

    # encoder.pt: safe to load, and loads into create_encoder(name) with no key left over
    payload = torch.load(out / "encoder.pt", weights_only=True)
    assert payload["encoder"] == "small_cnn"
    # the pretraining normalisation travels with the weights, so evaluation uses it by default
    pipeline = rx.load_recipe(name).build_pipeline(parse_config(
        getattr(rx.load_recipe(name), _config_class(rx, name)), ["--data", "shapes"]))
    assert payload["mean"] == pytest.approx(list(pipeline.mean))
    assert payload["std"] == pytest.approx(list(pipeline.std))
    from contrastive.eval.checkpoint import load_encoder

    loaded = load_encoder(out / "encoder.pt")
    assert loaded.setting("mean") == payload["mean"] and loaded.setting("image_size") == payload["image_size"]
    from contrastive.nn import create_encoder

    enc = create_encoder(payload["encoder"], **payload.get("encoder_kwargs", {}))
    enc.load_state_dict(payload["state_dict"], strict=True)

    # the logged lr follows the schedule function of the recipe's config, and every schedule
    # the recipe's method declares (EMA momentum) is logged with its value (wiring check)
    cfg = parse_config(getattr(rx.load_recipe(name), _config_class(rx, name)),
                       ["--data", "shapes", "--batch-size", "16", "--epochs", "2",
                        *rx.SMALL[name]])
    spe = 64 // 16
    method = rx.build_alone(rx.load_recipe(name), cfg)
    peak = scaled_lr(cfg.lr, 16, cfg.lr_scaling)
    for r in records:
        expected = lr_at(r["step"] - 1, steps_per_epoch=spe, epochs=2, peak=peak,
                         schedule=cfg.lr_schedule, warmup_epochs=cfg.warmup_epochs,
                         min_lr=cfg.min_lr, milestones=cfg.lr_milestones, gamma=cfg.lr_gamma,
                         per=cfg.schedule_per)
        assert r["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
        sched = method.schedule_values(r["step"] - 1, spe * 2)
        assert ("momentum" in sched) == name.startswith("moco")
        for key, value in sched.items():
            assert r[key] == pytest.approx(value, rel=1e-12)


def _config_class(rx, name: str) -> str:
    import dataclasses

    mod = rx.load_recipe(name)
    (cls,) = [v for v in vars(mod).values() if dataclasses.is_dataclass(v) and v.__module__ ==
              mod.__name__]
    return cls.__name__


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_help_lists_every_field_with_its_default(name, capsys, rx):
    import dataclasses

    mod = rx.load_recipe(name)
    cls = getattr(mod, _config_class(rx, name))
    with pytest.raises(SystemExit) as exc:
        parse_config(cls, ["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(cls):
        assert f"--{f.name.replace('_', '-')}" in text, f.name
    for flag in ("--data", "--output-dir", "--epochs", "--max-steps", "--batch-size",
                 "--num-workers", "--seed", "--resume", "--encoder", "--mixed-precision"):
        assert flag in text
    assert f"(default: {cls().epochs})" in text
