"""The MSN recipes: msn_cifar trains a few steps end to end on tiny generated data (a 16-px ViT)
and leaves an encoder.pt that loads into timm's model; msn_vits16_in1k's defaults are the
authors' config's (configs/pretrain/msn_vits16.yaml) and build the method and views they name;
--prior power_law builds PMSN."""

from __future__ import annotations

import json

import pytest

from contrastive.engine import parse_config

VIT16 = json.dumps({"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 1,
                    "num_heads": 2, "dynamic_img_size": True})
TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder-kwargs",
        VIT16, "--batch-size", "16", "--epochs", "2", "--warmup-epochs", "0.5",
        "--num-workers", "0", "--progress", "false", "--log-every", "1", "--mixed-precision",
        "no", "--seed", "0", "--knn-every", "1", "--knn-max-train", "32", "--focal-views", "2",
        "--focal-size", "8", "--hidden-dim", "16", "--out-dim", "8", "--num-prototypes", "16"]


def test_msn_cifar_trains_and_leaves_a_timm_encoder(tmp_path, rx):
    out = tmp_path / "run"
    records = rx.trains_three_steps("msn_cifar", out, *TINY, "--prior", "power_law")
    assert all("regularizer" in r and "msn_ce" in r for r in records if "loss" in r)
    config = json.loads((out / "config.json").read_text())
    assert (config["optimizer"], config["lr_scaling"], config["clip_grad_norm"]) == (
        "adamw", "none", 3.0)
    rx.loads_into_timm(out)  # timm's keys, nothing extra


def test_msn_vits16_in1k_defaults_are_the_codes(rx):
    mod = rx.load_recipe("msn_vits16_in1k")
    cfg = parse_config(mod.MSNImageNet, ["--data", "shapes"])
    assert cfg.encoder == "timm:vit_small_patch16_224" and cfg.image_size == 224
    assert (cfg.epochs, cfg.batch_size, cfg.optimizer, cfg.lr, cfg.lr_scaling,
            cfg.lr * cfg.min_lr, cfg.warmup_epochs) == (
        800, 1024, "adamw", 1e-3, "none", pytest.approx(1e-6), 15)
    assert (cfg.weight_decay, cfg.weight_decay_end, cfg.clip_grad_norm, cfg.sync_bn) == (
        0.04, 0.4, 3.0, True)
    assert (cfg.hidden_dim, cfg.out_dim, cfg.num_prototypes, cfg.temperature,
            cfg.sharpen_temperature, cfg.sinkhorn_iterations, cfg.regularization_weight,
            cfg.patch_drop, cfg.momentum, cfg.prior) == (
        2048, 256, 1024, 0.1, 0.25, 3, 1.0, 0.15, 0.996, "uniform")
    small = parse_config(mod.MSNImageNet, ["--data", "shapes", "--image-size", "16",
                                           "--encoder-kwargs", VIT16, "--hidden-dim", "16",
                                           "--out-dim", "8", "--num-prototypes", "16",
                                           "--prior", "power_law"])
    method = rx.build_alone(mod, small)
    assert type(method).__name__ == "MSN" and method.prior == "power_law"
    assert method.prototypes.shape == (16, 8) and method.weight_decays == (0.04, 0.4)
    pipeline = mod.build_pipeline(cfg)
    views = pipeline.views
    assert [v.size for v in views] == [224] * 2 + [96] * 10
    assert views[0].scale == (0.3, 1.0) and views[2].scale == (0.05, 0.3)
    assert (views[0].brightness, views[0].hue, views[0].blur_p, views[2].blur_p) == (
        pytest.approx(0.4), pytest.approx(0.1), 0.5, 0.5)
