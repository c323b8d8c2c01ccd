"""The VICRegL recipes: vicregl_cifar trains a few steps end to end in this process on tiny
generated data, the crop boxes travelling from the loader workers into the method's batch; the
per-image augmentation (which has no boxes) is refused in one line; both recipes' defaults are
the settings their docstrings cite and build the method they name."""

from __future__ import annotations

import pytest

from contrastive.engine import parse_config

TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder", "small_cnn",
        "--batch-size", "16", "--epochs", "2", "--warmup-epochs", "0.5", "--num-workers", "0",
        "--progress", "false", "--log-every", "1", "--mixed-precision", "no", "--seed", "0",
        "--knn-every", "1", "--knn-max-train", "32", "--mlp-hidden", "32", "--dim", "16",
        "--maps-dim", "8", "--maps-hidden", "16", "--num-matches", "3", "2"]


def test_vicregl_cifar_trains_three_steps(tmp_path, rx):
    records = rx.trains_three_steps("vicregl_cifar", tmp_path / "run", *TINY)
    steps = [r for r in records if "loss" in r]
    for r in steps:  # the local loss ran on the boxes: alpha 0.75 mixes it in
        assert r["loss"] == pytest.approx(0.75 * r["loss_global"] + 0.25 * r["loss_local"],
                                          rel=1e-5)


def test_per_image_augmentation_is_refused_in_one_line(tmp_path, rx, fresh_accelerate):
    with pytest.raises(ValueError, match="drop --batched-augment off"):
        rx.run_recipe_here("vicregl_cifar", *TINY, "--batched-augment", "off", "--max-steps",
                           "1", "--output-dir", str(tmp_path / "run"), tiny=False)


def test_vicregl_in1k_defaults_are_the_authors_resnet50_command(rx):
    mod = rx.load_recipe("vicregl_in1k")
    cfg = parse_config(mod.VICRegLIn1k, ["--data", "shapes"])
    assert (cfg.encoder, cfg.image_size, cfg.epochs, cfg.batch_size, cfg.optimizer, cfg.lr,
            cfg.weight_decay, cfg.warmup_epochs, cfg.min_lr, cfg.lars_trust_coeff,
            cfg.exclude_from_wd, cfg.sync_bn, cfg.crop_min) == (
        "torchvision:resnet50", 224, 300, 2048, "lars", 0.2, 1e-6, 10, 0.001, 0.001, True, True,
        0.08)
    assert (cfg.dim, cfg.mlp_hidden, cfg.maps_dim, cfg.maps_hidden, cfg.alpha,
            cfg.num_matches) == (8192, 8192, 512, 512, 0.75, (20, 4))
    assert mod.build_pipeline(cfg).crop_boxes


def test_vicregl_cifar_builds_its_preset(rx):
    mod = rx.load_recipe("vicregl_cifar")
    cfg = parse_config(mod.VICRegLCifar, ["--data", "shapes", "--encoder", "small_cnn"])
    method = rx.build_alone(mod, cfg)
    assert (method.alpha, method.num_matches, method.coeffs) == (0.75, (7, 2), (25.0, 25.0, 1.0))
