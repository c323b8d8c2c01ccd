"""The iBOT recipes: ibot_cifar trains a few steps end to end as a program on tiny generated
data (a 16-px ViT, local crops of 8 px) and leaves an encoder.pt that loads into timm's model;
ibot_in1k's defaults are the README's / the code's ViT-S/16 settings and build that method."""

from __future__ import annotations

import json
import math

import pytest

from contrastive.engine import parse_config

VIT16 = json.dumps({"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 1,
                    "num_heads": 2, "dynamic_img_size": True})
TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder-kwargs",
        VIT16, "--out-dim", "32", "--local-crops", "2", "--local-size", "8",
        "--batch-size", "16", "--epochs", "2", "--warmup-epochs", "0.5", "--num-workers", "0",
        "--progress", "false", "--log-every", "1", "--mixed-precision", "no", "--seed", "0",
        "--knn-every", "1", "--knn-max-train", "32"]


def test_ibot_cifar_trains_and_leaves_a_timm_encoder(tmp_path, rx):
    out = tmp_path / "run"
    rx.run_recipe_here("ibot_cifar", *TINY, "--max-steps", "3", "--koleo-weight", "0.1",
                       "--centering", "sinkhorn", "--output-dir", str(out), tiny=False)
    records = rx.read_metrics(out)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert any("knn_top1" in r for r in records)  # the monitor reads the class token
    rx.loads_into_timm(out)  # timm's keys, nothing extra


def test_ibot_cifar_defaults_build_vit_tiny_with_64_tokens(rx):
    mod = rx.load_recipe("ibot_cifar")
    cfg = parse_config(mod.IBOTCifar, ["--data", "shapes:n=512"])
    method = rx.build_alone(mod, cfg)
    assert tuple(method.encoder.patch_embed.grid_size) == (8, 8)
    assert method.encoder.dynamic_img_size and method.centering == "mean"
    spe = 512 // 256
    assert method.teacher_temperatures == (0.04, 0.07, 30 * spe)
    assert method.freeze_last_layer_steps == spe
    pipeline = mod.build_pipeline(cfg)
    assert len(pipeline.views) == 12 and pipeline.views[2].size == 16
    # the code's head (2048 hidden, 256 bottleneck); --hidden-dim / --bottleneck-dim reach it
    assert (method.head.mlp[0].out_features, method.head.last_layer.in_features) == (2048, 256)
    small = rx.build_alone(mod, parse_config(mod.IBOTCifar, ["--data", "shapes:n=512",
                                                         "--hidden-dim", "48",
                                                         "--bottleneck-dim", "8"]))
    assert (small.head.mlp[0].out_features, small.head.mlp[2].out_features,
            small.head.last_layer.in_features) == (48, 48, 8)


def test_ibot_in1k_defaults_are_the_papers(rx):
    mod = rx.load_recipe("ibot_in1k")
    cfg = parse_config(mod.IBOTImageNet, ["--data", "shapes"])
    assert cfg.encoder == "timm:vit_small_patch16_224" and cfg.image_size == 224
    assert (cfg.epochs, cfg.batch_size, cfg.optimizer, cfg.lr, cfg.warmup_epochs) == (
        800, 1024, "adamw", 5e-4, 10)
    assert (cfg.weight_decay, cfg.weight_decay_end, cfg.clip_grad_norm, cfg.out_dim,
            cfg.momentum, cfg.teacher_temperature, cfg.local_crops) == (
        0.04, 0.4, 3.0, 8192, 0.996, 0.07, 10)
    small = parse_config(mod.IBOTImageNet, ["--data", "shapes", "--image-size", "16",
                                            "--encoder-kwargs", VIT16, "--out-dim", "16"])
    method = rx.build_alone(mod, small)
    assert method.patch_head is None and method.mask_ratio == (0.1, 0.5)
    assert method.weights == (1.0, 1.0, 0.0)  # no KoLeo in iBOT
    assert method.head.last_layer.parametrizations.weight.original0.requires_grad  # trainable
    pipeline = mod.build_pipeline(small)
    assert pipeline.views[0].scale == (0.25, 1.0) and pipeline.views[2].scale == (0.05, 0.25)


def test_bad_centering_exits_2_naming_the_choices(rx, capsys):
    mod = rx.load_recipe("ibot_cifar")
    with pytest.raises(SystemExit) as exc:
        parse_config(mod.IBOTCifar, ["--data", "shapes", "--centering", "median"])
    assert exc.value.code == 2 and "centering" in capsys.readouterr().err


@pytest.mark.parametrize("name, cls", [("ibot_cifar", "IBOTCifar"), ("ibot_in1k", "IBOTImageNet"),
                                       ("dino_vit_small", "DINOViTSmall")])
def test_authors_recipes_clip_each_parameter_and_all_together_on_request(rx, name, cls):
    """iBOT's and DINO's utils.clip_gradients (--clip_grad 3.0 in their train_one_epoch): each
    parameter clipped apart by default; ``--clip-mode all`` gives back the clip of all the
    parameters together (the recipes' digests of before, bit for bit:
    benchmarks/recipe_digests.py --extra '--clip-mode all')."""
    mod = rx.load_recipe(name)
    tiny = ["--data", "shapes", "--image-size", "16", "--out-dim", "16"]
    tiny += (["--encoder-kwargs", VIT16] if "ibot" in name else
             ["--encoder", "small_cnn", "--encoder-kwargs", "{}"])
    cfg = parse_config(getattr(mod, cls), tiny)
    method = rx.build_alone(mod, cfg)
    assert cfg.clip_grad_norm == 3.0 and cfg.clip_mode == method.clip_mode == "parameter"
    trainable = [p for p in method.parameters() if p.requires_grad]
    assert len(method.clip_parts()) == len(trainable)
    off = rx.build_alone(mod, parse_config(getattr(mod, cls), [*tiny, "--clip-mode", "all"]))
    assert off.clip_mode == "all" and off.clip_parts() == {}
