"""The I-JEPA recipes: ijepa_cifar trains a few steps end to end on tiny generated data (a 16-px
ViT without class token) and leaves an encoder.pt that loads into timm's model;
ijepa_vith14_in1k's defaults are the authors' configuration (configs/in1k_vith14_ep300.yaml)
and build the method they name."""

from __future__ import annotations

import json

import pytest

from contrastive.engine import parse_config
from contrastive.engine.optim import param_groups

VIT16 = json.dumps({"img_size": 16, "patch_size": 2, "embed_dim": 16, "depth": 1,
                    "num_heads": 2, "class_token": False, "global_pool": "avg",
                    "fc_norm": False})
TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder-kwargs",
        VIT16, "--predictor-dim", "8", "--predictor-depth", "1", "--batch-size", "16",
        "--epochs", "2", "--warmup-epochs", "0.5", "--num-workers", "0", "--progress", "false",
        "--log-every", "1", "--mixed-precision", "no", "--seed", "0", "--knn-every", "1",
        "--knn-max-train", "32"]


def test_ijepa_cifar_trains_and_leaves_a_timm_encoder(tmp_path, rx):
    out = tmp_path / "run"
    records = rx.trains_three_steps("ijepa_cifar", out, *TINY)  # kNN on the pooled patches
    steps = [r for r in records if "loss" in r]
    assert all(r["context_patches"] > 4 for r in steps)  # min_keep 4
    # the method's schedules reach the run: the EMA's linear momentum, the cosine decay
    assert steps[0]["momentum"] == pytest.approx(0.996)
    assert steps[0]["weight_decay"] > 0.04
    rx.loads_into_timm(out)  # timm's keys, nothing extra


def test_ijepa_vith14_in1k_defaults_are_the_codes(rx):
    mod = rx.load_recipe("ijepa_vith14_in1k")
    cfg = parse_config(mod.IJEPAImageNet, ["--data", "shapes"])
    assert cfg.encoder == "timm:vit_huge_patch14_224" and cfg.image_size == 224
    assert json.loads(cfg.encoder_kwargs) == {"class_token": False, "global_pool": "avg",
                                              "fc_norm": False}
    # lr 1e-3 at batch 2048, final_lr 1e-6, warmup 40 of 300 epochs, wd 0.04 -> 0.4
    assert (cfg.epochs, cfg.batch_size, cfg.optimizer, cfg.lr * cfg.batch_size / 256) == (
        300, 2048, "adamw", pytest.approx(1e-3))
    assert (cfg.min_lr * 1e-3, cfg.warmup_epochs, cfg.weight_decay, cfg.weight_decay_end) == (
        pytest.approx(1e-6), 40, 0.04, 0.4)
    assert (cfg.betas, cfg.exclude_from_wd, cfg.clip_grad_norm, cfg.crop_min) == (
        (0.9, 0.999), True, 0.0, 0.3)
    assert (cfg.predictor_depth, cfg.predictor_dim, cfg.momentum, cfg.min_keep,
            cfg.distance) == (12, 384, 0.996, 10, "smooth_l1")
    small = parse_config(mod.IJEPAImageNet, ["--data", "shapes", "--image-size", "16",
                                             "--encoder-kwargs", VIT16, "--predictor-dim", "8",
                                             "--predictor-depth", "1", "--min-keep", "4"])
    method = rx.build_alone(mod, small)
    assert type(method).__name__ == "IJEPA" and method.masking["num_targets"] == 4
    # no decay on biases and 1-d parameters (helper.init_opt); the mask token decays there too
    groups = param_groups(method, 0.04)
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert id(method.predictor.mask_token) not in no_decay
    assert id(method.encoder.blocks[0].norm1.weight) in no_decay
    pipeline = mod.build_pipeline(small)
    assert len(pipeline.views) == 1 and pipeline.views[0].scale == (0.3, 1.0)
    assert pipeline.views[0].ratio == (3 / 4, 4 / 3) and pipeline.views[0].flip_p == 0.0
