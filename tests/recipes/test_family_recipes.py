"""The method families' recipes: the CIFAR ones train a few steps end to end as programs on
tiny generated data (SwAV and DINO with multi-crop); the ImageNet ones build the paper's model
from their defaults; every stateful part (BYOL's target, NNCLR's support set, SwAV's queue,
DINO's teacher and centre) resumes bit-exactly."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from contrastive.engine import data_info, parse_config
from contrastive.eval.checkpoint import load_encoder, read_checkpoint

CIFAR = ["byol_cifar", "simsiam_cifar", "barlow_twins_cifar", "vicreg_cifar", "supcon_cifar",
         "nnclr_cifar", "swav_cifar", "dino_cifar"]
IMAGENET = ["byol_r50", "simsiam_r50", "barlow_twins_r50", "vicreg_r50", "swav_r50",
            "supcon_r50", "nnclr_r50"]
SHRINK = {  # small heads for the tiny runs
    "byol_cifar": ["--dim", "16", "--mlp-hidden", "32"],
    "simsiam_cifar": ["--dim", "16", "--proj-hidden", "32", "--pred-hidden", "8"],
    "barlow_twins_cifar": ["--dim", "32", "--mlp-hidden", "32"],
    "barlow_twins_r50": ["--dim", "32", "--mlp-hidden", "32", "--warmup-epochs", "0.5"],
    "vicreg_cifar": ["--dim", "32", "--mlp-hidden", "32"],
    "supcon_cifar": ["--dim", "16", "--mlp-hidden", "32"],
    "nnclr_cifar": ["--dim", "16", "--proj-hidden", "32", "--pred-hidden", "32",
                    "--support-size", "64"],
    "swav_cifar": ["--dim", "16", "--mlp-hidden", "32", "--num-prototypes", "20",
                   "--queue-size", "32", "--queue-start-steps", "1",  # full at step 3
                   "--freeze-prototypes-steps", "1", "--local-crops", "2",
                   "--local-size", "8"],
    "dino_cifar": ["--out-dim", "32", "--hidden-dim", "32", "--bottleneck-dim", "16",
                   "--local-crops", "2", "--local-size", "8"],
}
TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder",
        "small_cnn", "--batch-size", "16", "--epochs", "2", "--num-workers", "0", "--progress",
        "false", "--log-every", "1", "--mixed-precision", "no", "--seed", "0",
        "--warmup-epochs", "0.5", "--knn-every", "0"]


def _run(rx, name, out, *args):
    rx.run_recipe_here(name, *TINY, *SHRINK[name], *args, "--output-dir", str(out), tiny=False)


@pytest.mark.parametrize("name", CIFAR)
def test_cifar_recipe_trains_and_logs(name, tmp_path, rx):
    out = tmp_path / "run"
    _run(rx, name, out, "--max-steps", "3")
    records = [r for r in rx.read_metrics(out) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and 0 < r["embedding_std"] < 1 for r in records)
    if name == "byol_cifar":  # the declared schedule reaches the batch and the log
        assert records[0]["momentum"] == pytest.approx(0.99)
    payload = torch.load(out / "encoder.pt", weights_only=True)
    assert payload["encoder"] == "small_cnn"
    if name in ("dino_cifar", "byol_cifar"):
        _exports_the_evaluated_backbone(name, out, payload["state_dict"])


def _exports_the_evaluated_backbone(name, out, exported):
    """encoder.pt and the eval tools' reading of a checkpoint folder hold the backbone the paper
    evaluates: DINO's teacher (its momentum copy, which differs from the student after three
    steps), BYOL's online encoder (not its target)."""
    step = out / "checkpoints" / "step_00000003"
    state = load_file(str(step / "model.safetensors"))
    part = {"dino_cifar": "teacher.module.0.", "byol_cifar": "encoder."}[name]
    other = {"dino_cifar": "encoder.", "byol_cifar": "target.module.0."}[name]
    assert set(exported) == {k[len(part):] for k in state if k.startswith(part)}
    for k, v in exported.items():
        assert torch.equal(v, state[part + k]), k
    assert any(not torch.equal(v, state[other + k]) for k, v in exported.items()
               if v.is_floating_point())  # the other copy differs: the test can tell them apart
    raw = read_checkpoint(step)
    assert raw.state_key == ("teacher.module.0" if name == "dino_cifar" else "")
    loaded = load_encoder(step).encoder.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in exported.items())


@pytest.mark.parametrize("name", IMAGENET)
def test_imagenet_recipe_builds_the_papers_model(name, rx):
    mod = rx.load_recipe(name)
    cls = next(v for k, v in vars(mod).items() if isinstance(v, type) and hasattr(v, "lr")
               and v.__module__ == mod.__name__)
    cfg = parse_config(cls, ["--data", "shapes"])
    assert cfg.encoder == "torchvision:resnet50" and cfg.image_size == 224
    small = parse_config(cls, ["--data", "shapes", "--encoder", "small_cnn"])
    method = rx.build_alone(mod, small)
    expected = {"byol_r50": ("BYOL", 0.996), "simsiam_r50": ("SimSiam", None),
                "barlow_twins_r50": ("BarlowTwins", None), "vicreg_r50": ("VICReg", None),
                "swav_r50": ("SwAV", None), "supcon_r50": ("SupCon", None),
                "nnclr_r50": ("NNCLR", None)}[name]
    assert type(method).__name__ == expected[0]
    if expected[1] is not None:
        assert method.schedules()["momentum"](0, 100) == pytest.approx(expected[1])
    if name == "simsiam_r50":  # the predictor keeps the peak lr: 0.05 x 512 / 256
        assert method.param_groups()[0].lr == pytest.approx(0.1)


@pytest.mark.parametrize("name", ["byol_cifar", "nnclr_cifar", "swav_cifar", "dino_cifar"])
def test_stateful_family_members_resume_bit_exactly(name, tmp_path, rx):
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(rx, name, full, "--max-steps", "6")
    _run(rx, name, cut, "--max-steps", "3")
    _run(rx, name, cut, "--max-steps", "6", "--resume", "auto")
    a = load_file(str(full / "checkpoints" / "step_00000006" / "model.safetensors"))
    b = load_file(str(cut / "checkpoints" / "step_00000006" / "model.safetensors"))
    assert set(a) == set(b)
    state = {"byol_cifar": "target.", "nnclr_cifar": "support.", "swav_cifar": "queue.",
             "dino_cifar": "center"}[name]
    assert any(k.startswith(state) for k in a)  # the method's state is in the checkpoint
    if name == "swav_cifar":  # the queue started at step 1 and was full (and used) from step 3
        assert int(a["queue_rows"]) == 32
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after the resume"


def test_dino_vit_recipe_declares_the_official_schedules(rx, monkeypatch):
    mod = rx.load_recipe("dino_vit_small")
    cfg = parse_config(mod.DINOViTSmall, ["--data", "shapes", "--encoder", "small_cnn",
                                          "--encoder-kwargs", "{}", "--out-dim", "32", "--warmup-teacher-epochs", "3",
                                          "--teacher-temperature", "0.07"])
    method = mod.build_method(cfg, data_info(cfg, 10 * cfg.batch_size))  # 10 steps per epoch
    sched = method.schedules()
    assert sched["weight_decay"](0, 100) == pytest.approx(0.04)
    assert sched["weight_decay"](100, 100) == pytest.approx(0.4)
    assert sched["teacher_temperature"](0, 100) == pytest.approx(0.04)
    assert sched["teacher_temperature"](30, 100) == pytest.approx(0.07)
    assert method.param_groups()[0].frozen_steps == 10  # the first epoch
    assert cfg.optimizer == "adamw" and cfg.clip_grad_norm == 3.0


def test_dino_cifar_freezes_the_last_layer_for_solo_learns_first_epoch(rx, monkeypatch):
    """solo-learn's DINO (``solo/methods/dino.py``: ``freeze_last_layer`` default 1, which its
    ``scripts/pretrain/cifar/dino.yaml`` leaves): the prototypes' gradients dropped for the first
    epoch; no gradient clip (``clip_grad`` default 0); ``--freeze-last-layer-epochs 0`` turns it
    off."""
    mod = rx.load_recipe("dino_cifar")
    base = ["--data", "shapes", "--encoder", "small_cnn", "--out-dim", "32"]
    cfg = parse_config(mod.DINOCifar, base)
    method = mod.build_method(cfg, data_info(cfg, 7 * cfg.batch_size))  # 7 steps per epoch
    (group,) = method.param_groups()
    assert group.name == "last_layer" and group.frozen_steps == 7 and group.frozen_by == "grad"
    assert {id(p) for p in group.params} == {
        id(p) for p in method.head.last_layer.parameters() if p.requires_grad}
    cfg = parse_config(mod.DINOCifar, [*base, "--freeze-last-layer-epochs", "0"])
    assert rx.build_alone(mod, cfg).param_groups() == [] and cfg.clip_grad_norm == 0


# the papers' / official code's ImageNet settings (see each recipe's docstring for the sources)
PAPER = {
    "supcon_r50": dict(batch_size=6144, optimizer="lars", lr=0.4, lr_scaling="linear",
                       weight_decay=1e-3, warmup_epochs=12, epochs=350, dim=128,
                       mlp_hidden=2048, temperature=0.1, base_temperature=1.0),
    "nnclr_r50": dict(batch_size=4096, optimizer="lars", lr=0.3, lr_scaling="linear",
                      weight_decay=1e-6, warmup_epochs=10, epochs=1000, dim=256,
                      proj_hidden=2048, pred_hidden=4096, support_size=98304, temperature=0.1),
    "barlow_twins_r50": dict(batch_size=2048, optimizer="lars", lr=0.2, lr_scaling="linear",
                             bias_lr_scale=0.024, min_lr=0.001, weight_decay=1.5e-6,
                             warmup_epochs=10, epochs=1000, dim=8192, mlp_hidden=8192,
                             lambd=0.0051),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_imagenet_recipe_defaults_are_the_papers(name, rx):
    mod = rx.load_recipe(name)
    cls = next(v for k, v in vars(mod).items() if isinstance(v, type) and hasattr(v, "lr")
               and v.__module__ == mod.__name__)
    cfg = parse_config(cls, ["--data", "shapes"])
    for field, value in PAPER[name].items():
        assert getattr(cfg, field) == value, field
    method = rx.build_alone(mod, parse_config(cls, ["--data", "shapes", "--encoder", "small_cnn"]))
    if name == "supcon_r50":  # the code's scale_by_temperature: loss x 0.1
        assert method.factor == pytest.approx(0.1) and method.needs == ("views", "labels")
    if name == "nnclr_r50":
        assert method.support.size == 98304 and method.temperature == 0.1
    if name == "barlow_twins_r50":  # every 1-d parameter, at 0.0048 / 0.2 of the lr
        (group,) = method.param_groups()
        ones = {id(p) for p in method.parameters() if p.ndim <= 1}
        assert {id(p) for p in group.params} == ones and group.lr_scale == pytest.approx(0.024)


def test_barlow_twins_bias_lr_scale_resumes_bit_exactly(tmp_path, rx):
    """The r50 recipe (tiny): biases and BN parameters train at 0.024 x the scheduled lr in the
    saved optimiser state (a warm-up step, so the lr moves), and a resumed run equals the
    uninterrupted one bit for bit."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(rx, "barlow_twins_r50", full, "--max-steps", "4")
    _run(rx, "barlow_twins_r50", cut, "--max-steps", "2")
    _run(rx, "barlow_twins_r50", cut, "--max-steps", "4", "--resume", "auto")
    a = load_file(str(full / "checkpoints" / "step_00000004" / "model.safetensors"))
    b = load_file(str(cut / "checkpoints" / "step_00000004" / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after the resume"
    for run in (full, cut):
        opt = torch.load(run / "checkpoints" / "step_00000004" / "optimizer.bin",
                         weights_only=True)
        groups = {g["name"]: g for g in opt["param_groups"]}
        assert groups["biases_norms_no_decay"]["lr_scale"] == 0.024
        assert groups["biases_norms_no_decay"]["lr"] == pytest.approx(
            0.024 * groups["decay"]["lr"], rel=1e-12)
        assert groups["decay"]["lr"] > 0
