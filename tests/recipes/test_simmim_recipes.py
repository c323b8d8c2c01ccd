"""The SimMIM recipes: simmim_cifar trains a few steps end to end as a program on tiny generated
data (a 16-px ViT) and leaves an encoder.pt that loads into timm's model; simmim_in1k's defaults
are the authors' code's settings and build the method they name."""

from __future__ import annotations

import json

import pytest

from contrastive.engine import parse_config
from contrastive.engine.optim import param_groups

VIT16 = json.dumps({"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 1,
                    "num_heads": 2})
TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder-kwargs",
        VIT16, "--mask-patch-size", "8", "--batch-size", "16", "--epochs", "2",
        "--warmup-epochs", "0.5", "--num-workers", "0", "--progress", "false", "--log-every",
        "1", "--mixed-precision", "no", "--seed", "0", "--knn-every", "1", "--knn-max-train",
        "32"]


def test_simmim_cifar_trains_and_leaves_a_timm_encoder(tmp_path, rx):
    out = tmp_path / "run"
    rx.trains_three_steps("simmim_cifar", out, *TINY)  # the kNN monitor reads the class token
    config = json.loads((out / "config.json").read_text())
    assert (config["betas"], config["clip_grad_norm"], config["lr_schedule"]) == (
        [0.9, 0.999], 5.0, "step")
    rx.loads_into_timm(out)  # timm's keys, nothing extra


def test_simmim_cifar_defaults_build_vit_tiny_with_16_mask_units(rx):
    mod = rx.load_recipe("simmim_cifar")
    cfg = parse_config(mod.SimMIMCifar, ["--data", "shapes"])
    assert (cfg.lr, cfg.betas, cfg.weight_decay, cfg.crop_min, cfg.warmup_epochs) == (
        5e-5, (0.9, 0.999), 0.05, 0.67, 10)
    method = rx.build_alone(mod, cfg)
    assert (method.num_patches, method.mask_grid, method.mask_ratio) == (64, 4, 0.6)


def test_simmim_in1k_defaults_are_the_codes(rx):
    mod = rx.load_recipe("simmim_in1k")
    cfg = parse_config(mod.SimMIMImageNet, ["--data", "shapes"])
    assert cfg.encoder == "timm:vit_base_patch16_224" and cfg.image_size == 224
    # BASE_LR 1e-4 per 512 images = 5e-5 per 256 (main_simmim.py's linear scaling)
    assert (cfg.epochs, cfg.batch_size, cfg.optimizer, cfg.lr * cfg.batch_size / 256) == (
        800, 2048, "adamw", pytest.approx(1e-4 * 2048 / 512))
    assert (cfg.betas, cfg.weight_decay, cfg.exclude_from_wd, cfg.warmup_epochs,
            cfg.lr_schedule, cfg.lr_milestones, cfg.lr_gamma, cfg.clip_grad_norm) == (
        (0.9, 0.999), 0.05, True, 10, "step", (700,), 0.1, 5.0)
    assert (cfg.mask_ratio, cfg.mask_patch_size, cfg.crop_min) == (0.6, 32, 0.67)
    assert json.loads(cfg.encoder_kwargs) == {"init_values": 0.1, "drop_path_rate": 0.1}
    small = parse_config(mod.SimMIMImageNet, ["--data", "shapes", "--image-size", "16",
                                              "--encoder-kwargs", VIT16,
                                              "--mask-patch-size", "8"])
    method = rx.build_alone(mod, small)
    assert type(method).__name__ == "SimMIM" and method.mask_scale == 2
    # no decay on the class token and position embedding; the mask token decays
    groups = param_groups(method, 0.05)
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert id(method.encoder.cls_token) in no_decay and id(method.encoder.pos_embed) in no_decay
    assert id(method.mask_token) not in no_decay
    pipeline = mod.build_pipeline(small)
    assert len(pipeline.views) == 1 and pipeline.views[0].scale == (0.67, 1.0)
    assert pipeline.views[0].ratio == (3 / 4, 4 / 3) and pipeline.views[0].flip_p == 0.5


@pytest.mark.parametrize("name", ["simmim_cifar", "simmim_in1k"])
def test_recipes_say_how_simmim_is_evaluated(rx, name):
    doc = rx.load_recipe(name).__doc__
    assert "fine-tun" in doc and "linear" in doc
