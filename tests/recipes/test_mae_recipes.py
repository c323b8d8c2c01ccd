"""The MAE recipes: mae_cifar trains a few steps end to end as a program on tiny generated data
(a 16-px ViT) and leaves an encoder.pt that loads into timm's model; mae_in1k's defaults are
the paper's / the code's settings and build the method they name."""

from __future__ import annotations

import json
import subprocess

import pytest

from contrastive.engine import parse_config

VIT16 = json.dumps({"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 1,
                    "num_heads": 2})
TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder-kwargs",
        VIT16, "--decoder-dim", "8", "--decoder-depth", "1", "--decoder-heads", "2",
        "--batch-size", "16", "--epochs", "2", "--warmup-epochs", "0.5", "--num-workers", "0",
        "--progress", "false", "--log-every", "1", "--mixed-precision", "no", "--seed", "0",
        "--knn-every", "1", "--knn-max-train", "32"]


def test_mae_cifar_trains_and_leaves_a_timm_encoder(tmp_path, rx):
    out = tmp_path / "run"
    rx.trains_three_steps("mae_cifar", out, *TINY)  # the kNN monitor reads the class token
    config = json.loads((out / "config.json").read_text())
    assert config["betas"] == [0.9, 0.95] and config["optimizer"] == "adamw"
    rx.loads_into_timm(out)  # timm's keys, nothing extra


def test_mae_cifar_defaults_build_vit_tiny_with_64_tokens(rx):
    mod = rx.load_recipe("mae_cifar")
    cfg = parse_config(mod.MAECifar, ["--data", "shapes"])
    assert (cfg.lr, cfg.betas, cfg.weight_decay, cfg.crop_min) == (1.5e-4, (0.9, 0.95), 0.05,
                                                                   0.2)
    method = rx.build_alone(mod, cfg)
    assert method.num_patches == 64 and method.patch_size == 4 and method.mask_ratio == 0.75


def test_mae_in1k_defaults_are_the_papers(rx):
    mod = rx.load_recipe("mae_in1k")
    cfg = parse_config(mod.MAEImageNet, ["--data", "shapes"])
    assert cfg.encoder == "timm:vit_large_patch16_224" and cfg.image_size == 224
    assert (cfg.epochs, cfg.batch_size, cfg.optimizer, cfg.lr, cfg.lr_scaling) == (
        800, 4096, "adamw", 1.5e-4, "linear")
    assert (cfg.betas, cfg.weight_decay, cfg.exclude_from_wd, cfg.warmup_epochs,
            cfg.min_lr) == ((0.9, 0.95), 0.05, True, 40, 0.0)
    assert (cfg.mask_ratio, cfg.decoder_dim, cfg.decoder_depth, cfg.decoder_heads,
            cfg.norm_pix) == (0.75, 512, 8, 16, True)
    small = parse_config(mod.MAEImageNet, ["--data", "shapes", "--image-size", "16",
                                           "--encoder-kwargs", VIT16, "--decoder-depth", "1"])
    method = rx.build_alone(mod, small)
    assert type(method).__name__ == "MAE" and method.decoder.embed.out_features == 512
    pipeline = mod.build_pipeline(small)
    assert len(pipeline.views) == 1 and pipeline.views[0].scale == (0.2, 1.0)


def test_bad_loss_on_is_a_one_line_error(rx):
    proc = subprocess.run([rx.PYTHON, str(rx.RECIPES / "mae_cifar.py"), *TINY, "--loss-on",
                           "nowhere"], env=rx.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "loss-on" in proc.stderr or "loss_on" in proc.stderr


@pytest.mark.parametrize("name", ["mae_cifar", "mae_in1k"])
def test_recipes_say_how_mae_is_evaluated(rx, name):
    doc = rx.load_recipe(name).__doc__
    assert "fine-tun" in doc and "linear" in doc
