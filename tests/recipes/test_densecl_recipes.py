"""The DenseCL recipes: densecl_cifar trains a few steps end to end as a program on tiny
generated data; both recipes' defaults are the settings their docstrings cite and build the
method they name (the engine's refusal of --grad-accum-steps: tests/methods/test_densecl.py)."""

from __future__ import annotations

from contrastive.engine import parse_config

TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder", "small_cnn",
        "--batch-size", "16", "--epochs", "2", "--num-workers", "0", "--progress", "false",
        "--log-every", "1", "--mixed-precision", "no", "--seed", "0", "--knn-every", "1",
        "--knn-max-train", "32", "--queue-size", "32", "--mlp-hidden", "32", "--dim", "16",
        "--split-bn", "2"]


def test_densecl_cifar_trains_three_steps(tmp_path, rx):
    records = rx.trains_three_steps("densecl_cifar", tmp_path / "run", *TINY)
    steps = [r for r in records if "loss" in r]
    assert all("loss_dense" in r and "loss_global" in r for r in steps)


def test_densecl_r50_defaults_are_the_authors_config(rx):
    mod = rx.load_recipe("densecl_r50")
    cfg = parse_config(mod.DenseCLR50, ["--data", "shapes"])
    assert (cfg.encoder, cfg.image_size, cfg.epochs, cfg.batch_size, cfg.optimizer, cfg.lr,
            cfg.weight_decay, cfg.exclude_from_wd, cfg.sgd_momentum, cfg.lr_schedule) == (
        "torchvision:resnet50", 224, 200, 256, "sgd", 0.03, 1e-4, False, 0.9, "cosine")
    assert (cfg.queue_size, cfg.momentum, cfg.temperature, cfg.dense_weight, cfg.dim,
            cfg.mlp_hidden, cfg.grid, cfg.crop_min) == (65536, 0.999, 0.2, 0.5, 128, 2048, 0, 0.2)


def test_densecl_cifar_builds_its_preset(rx):
    mod = rx.load_recipe("densecl_cifar")
    cfg = parse_config(mod.DenseCLCifar, ["--data", "shapes", "--encoder", "small_cnn",
                                          "--queue-size", "32"])
    method = rx.build_alone(mod, cfg)
    assert (method.split_bn, method.base_momentum, method.temperature, method.dense_weight) == (
        8, 0.99, 0.2, 0.5)
