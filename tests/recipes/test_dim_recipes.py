"""Deep InfoMax's recipes: both train a few steps end to end as programs on tiny generated data;
their defaults are the paper's / the authors' code's (Adam exactly, the DCGAN / AlexNet encoder
and its local map); the views are what the paper uses (the whole image for CIFAR-10, unresized
64-px windows with flips for STL-10); bad values fail before training.

No resume test of our own: DeepInfoMax keeps no state beyond its parameters and BN buffers (no
queue, no momentum encoder, no schedule), which the engine's generic resume tests cover.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from contrastive.engine import parse_config

TINY = ["--batch-size", "16", "--epochs", "2", "--num-workers", "0", "--progress", "false",
        "--log-every", "1", "--mixed-precision", "no", "--seed", "0", "--mi-units", "16",
        "--max-steps", "3"]
SMALL = {  # the paper's encoder designs at a few channels, on 16-px shapes (24-px for STL)
    "dim_cifar": ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16",
                  "--encoder-kwargs", json.dumps({"widths": [8, 16, 16], "hidden": [32]}),
                  "--knn-every", "1", "--knn-k", "5"],
    "dim_stl": ["--data", "shapes:n=64,n_test=32,size=24", "--image-size", "16",
                "--source-size", "24", "--encoder", "dcgan64",
                "--encoder-kwargs", json.dumps({"widths": [8, 8, 16, 16], "hidden": [32]})],
}


def _config(rx, name: str, argv: list[str]):
    mod = rx.load_recipe(name)
    cls = next(v for v in vars(mod).values() if isinstance(v, type) and hasattr(v, "mi_units")
               and v.__module__ == mod.__name__)
    return mod, parse_config(cls, argv)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_dim_recipe_trains_and_logs(name, tmp_path, rx):
    out = tmp_path / "run"
    rx.run_recipe_here(name, *TINY, *SMALL[name], "--output-dir", str(out), tiny=False)
    records = rx.read_metrics(out)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and r["embedding_std"] > 0 for r in steps)
    assert all(r["lr"] == pytest.approx(1e-4) for r in steps)  # absolute and constant
    payload = torch.load(out / "encoder.pt", weights_only=True)
    assert payload["encoder"] == ("dcgan32" if name == "dim_cifar" else "dcgan64")
    if name == "dim_cifar":  # the kNN monitor ran on the 64-d output before and after
        assert [r["knn_when"] for r in records if "knn_top1" in r] == ["start", "end"]


@pytest.mark.parametrize("name, encoder, local, epochs, size", [
    ("dim_cifar", "dcgan32", (1, 128, 8), 1000, 32),
    ("dim_stl", "alexnet64", (2, 384, 15), 100, 64),
])
def test_defaults_are_the_papers(name, encoder, local, epochs, size, rx):
    mod, cfg = _config(rx, name, ["--data", "shapes"])
    assert (cfg.encoder, cfg.epochs, cfg.image_size, cfg.batch_size) == (encoder, epochs, size, 64)
    assert (cfg.optimizer, cfg.lr, cfg.lr_scaling, cfg.lr_schedule, cfg.warmup_epochs) == (
        "adamw", 1e-4, "none", "constant", 0)
    assert (cfg.weight_decay, tuple(cfg.betas), cfg.mi_units, cfg.estimator) == (
        0.0, (0.5, 0.999), 2048, "infonce")
    method = rx.build_alone(mod, cfg)
    stage, channels, side = local
    assert method.local_stage == stage and method.encoder.num_features == 64
    assert method.mi_local.block[0].in_channels == channels
    with torch.no_grad():
        maps = method.encoder.eval().forward_stages(torch.zeros(2, 3, size, size))
    assert maps[stage].shape[1:] == (channels, side, side)


def test_adamw_without_decay_is_adam(rx):
    """The recipes' optimiser: AdamW with weight decay 0 takes Adam's steps (float64)."""
    from contrastive.engine.optim import build_optimizer

    _, cfg = _config(rx, "dim_cifar", ["--data", "shapes"])
    torch.manual_seed(0)
    a = torch.nn.Linear(5, 3).double()
    b = torch.nn.Linear(5, 3).double()
    b.load_state_dict(a.state_dict())
    ours = build_optimizer(a, cfg.optimizer, lr=1e-2, weight_decay=cfg.weight_decay,
                           betas=tuple(cfg.betas))
    adam = torch.optim.Adam(b.parameters(), lr=1e-2, betas=tuple(cfg.betas))
    for _ in range(5):
        x = torch.randn(4, 5, dtype=torch.float64)
        for m, opt in ((a, ours), (b, adam)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


def _images(n: int, size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)


def _normalised(pipe, x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(pipe.mean)[:, None, None]
    std = torch.tensor(pipe.std)[:, None, None]
    return (x.float() / 255 - mean) / std


def test_cifar_view_is_the_whole_image(rx):
    mod, cfg = _config(rx, "dim_cifar", ["--data", "shapes"])
    pipe = mod.build_pipeline(cfg)
    img = _images(1, 32)[0]
    views = pipe(img)
    assert len(views) == 1
    torch.testing.assert_close(views[0], _normalised(pipe, img), rtol=0, atol=1e-6)
    worker, device = pipe.split()
    crops = worker(img)
    assert len(crops) == 1 and torch.equal(crops[0], img)  # no crop, no resize
    _, cropped = _config(rx, "dim_cifar", ["--data", "shapes", "--crop-min", "0.5"])
    (view,) = mod.build_pipeline(cropped).views  # not the paper: crops on request
    assert view.crop == "random" and view.scale == (0.5, 1.0) and view.flip_p == 0.0


def test_stl_views_are_unresized_windows_with_flips(rx):
    mod, cfg = _config(rx, "dim_stl", ["--data", "shapes"])
    pipe = mod.build_pipeline(cfg)
    rows, cols = torch.meshgrid(torch.arange(96), torch.arange(96), indexing="ij")
    img = torch.stack([rows, cols, _images(1, 96)[0, 0]]).to(torch.uint8)  # pixels name places

    def window_of(crop: torch.Tensor) -> tuple[int, int, bool]:
        """(top, left, flipped) of a uint8 crop that must be an unresized window of img."""
        top = int(crop[0, 0, 0])
        flipped = int(crop[1, 0, 0]) > int(crop[1, 0, -1])
        left = int(crop[1, 0, -1 if flipped else 0])
        win = img[:, top:top + 64, left:left + 64]
        assert torch.equal(crop, win.flip(-1) if flipped else win), "not an unresized window"
        return top, left, flipped

    worker, _ = pipe.split()
    torch.manual_seed(0)
    places = {window_of(worker(img)[0])[:2] for _ in range(20)}  # the batched path's crop
    assert len(places) > 10  # random positions
    mean = torch.tensor(pipe.mean)[:, None, None]
    std = torch.tensor(pipe.std)[:, None, None]
    flips = 0
    for _ in range(40):  # the per-image path: normalised, flipped with p 0.5
        (view,) = pipe(img)
        u8 = (view * std + mean).mul(255).round()
        assert (u8 - (view * std + mean).mul(255)).abs().max() < 1e-3  # no resampling
        flips += window_of(u8.to(torch.uint8))[2]
    assert 8 <= flips <= 32  # p 0.5 over 40 draws (binomial, 3.8 sd either side)


@pytest.mark.parametrize("name, argv, words", [
    ("dim_cifar", ["--local-stage", "second"], "--local-stage must be 'auto' or an int"),
    ("dim_cifar", ["--batch-size", "1"], "negatives are the other images"),
    ("dim_stl", ["--image-size", "128"], "windows of the source images"),
    ("dim_cifar", ["--crop-min", "0"], "--crop-min must be in (0, 1]"),
    ("dim_cifar", ["--estimator", "mine"], "invalid choice"),
])
def test_bad_values_exit_2(name, argv, words, rx, capsys):
    with pytest.raises(SystemExit) as exc:
        _config(rx, name, ["--data", "shapes", *argv])
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_local_stage_that_is_not_a_map_is_refused(rx):
    mod, cfg = _config(rx, "dim_cifar", ["--data", "shapes", "--local-stage", "-1",
                                         "--encoder-kwargs", '{"hidden": [8]}'])
    with pytest.raises(ValueError, match="local_stage -1 is not a feature map"):
        rx.build_alone(mod, cfg)
