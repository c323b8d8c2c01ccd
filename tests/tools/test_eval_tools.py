"""The evaluation command-line tools end to end on a tiny generated ImageFolder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("contrastive.data")

from contrastive.eval.cli import export_main, knn_eval_main, linear_eval_main, plot_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 40, 220)}


def make_imagefolder(root: Path, per_class: dict[str, int], *, size: int = 16, seed: int = 0,
                     colours=COLOURS) -> Path:
    """Images whose class is their dominant colour (noise on top), in root/<split>/<class>/."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    for split, n in per_class.items():
        for name, rgb in colours.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                noise = torch.randint(-40, 40, (size, size, 3), generator=g)
                px = (torch.tensor(rgb) + noise).clamp(0, 255).to(torch.uint8).numpy()
                Image.fromarray(px).save(folder / f"{i:03d}.png")
    return root


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_imagefolder(tmp_path_factory.mktemp("colours"), {"train": 12, "val": 6})


@pytest.fixture(scope="module")
def encoder_pt(tmp_path_factory) -> Path:
    from contrastive.nn import create_encoder

    torch.manual_seed(0)
    enc = create_encoder("small_cnn")
    path = tmp_path_factory.mktemp("run") / "encoder.pt"
    torch.save({"encoder": "small_cnn", "state_dict": enc.state_dict()}, path)
    return path


COMMON = ["--image-size", "16", "--num-workers", "0", "--cpu", "--batch-size", "16"]


def test_linear_eval_cached(colour_data, encoder_pt, tmp_path, capsys):
    out = tmp_path / "linear.json"
    assert linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(colour_data),
                             "--output", str(out), "--epochs", "20", *COMMON]) == 0
    res = json.loads(out.read_text())
    assert res["top1"] >= 80.0 and res["top5"] == 100.0  # colour is linearly decodable
    assert res["protocol"] == "cached" and res["num_train"] == 36 and res["num_test"] == 18
    assert len(res["checkpoint"]["sha256"]) == 64 and res["checkpoint"]["encoder"] == "small_cnn"
    assert res["sweep"] and all(s["lr"] in res["settings"]["sweep_lrs"] for s in res["sweep"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["top1"] == res["top1"]


def test_linear_eval_standard_and_low_shot(colour_data, encoder_pt, tmp_path):
    out = tmp_path / "std.json"
    assert linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(colour_data), "--protocol",
                             "standard", "--epochs", "3", "--lr", "1.0", "--output", str(out), *COMMON]) == 0
    res = json.loads(out.read_text())
    assert res["protocol"] == "standard" and res["settings"]["lr_steps"] == [2, 2]
    assert 0.0 <= res["top1"] <= 100.0
    out = tmp_path / "low.json"
    linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(colour_data), "--label-fraction",
                      "0.25", "--epochs", "5", "--output", str(out), *COMMON])
    assert json.loads(out.read_text())["num_train"] == 9  # 3 of 12 per class


def test_knn_eval(colour_data, encoder_pt, tmp_path):
    out = tmp_path / "knn.json"
    assert knn_eval_main(["--checkpoint", str(encoder_pt), "--data", str(colour_data), "--k", "5",
                          "--output", str(out), *COMMON]) == 0
    res = json.loads(out.read_text())
    assert res["top1"] >= 80.0 and res["settings"]["k"] == 5
    out16 = tmp_path / "knn16.json"
    knn_eval_main(["--checkpoint", "random", "--encoder", "small_cnn", "--data", str(colour_data),
                   "--store", "float16", "--output", str(out16), *COMMON])
    assert json.loads(out16.read_text())["checkpoint"]["kind"] == "random"


def test_the_eval_clis_normalise_as_encoder_pt_records(colour_data, tmp_path):
    """An encoder.pt that records its normalisation (a run from --init records the weights'):
    the eval CLIs use it, not ImageNet's; one that records none falls back to ImageNet's."""
    from contrastive.augment import IMAGENET_MEAN, IMAGENET_STD
    from contrastive.nn import create_encoder
    from contrastive.records import EncoderRecord

    enc = create_encoder("small_cnn")
    for name, norm in (("recorded", {"mean": (0.5,) * 3, "std": (0.25,) * 3}), ("none", {})):
        EncoderRecord.from_module(enc, "small_cnn", **norm).save(tmp_path / f"{name}.pt")
        knn_eval_main(["--checkpoint", str(tmp_path / f"{name}.pt"), "--data", str(colour_data),
                       "--k", "5", "--output", str(tmp_path / f"{name}.json"), *COMMON])
    recorded, none = (json.loads((tmp_path / f"{n}.json").read_text())["settings"]
                      for n in ("recorded", "none"))
    assert (recorded["mean"], recorded["std"]) == ([0.5] * 3, [0.25] * 3)
    assert (none["mean"], none["std"]) == (list(IMAGENET_MEAN), list(IMAGENET_STD))


def test_export_cli(tmp_path):
    import timm

    from contrastive.nn import create_encoder

    enc = create_encoder("timm:resnet18")
    torch.save({"encoder": "timm:resnet18", "state_dict": enc.state_dict()}, tmp_path / "encoder.pt")
    assert export_main(["--checkpoint", str(tmp_path), "--format", "torchvision",
                        "--out", str(tmp_path / "r18.pth")]) == 0
    state = torch.load(tmp_path / "r18.pth", weights_only=True)
    missing, unexpected = timm.create_model("resnet18").load_state_dict(state, strict=False)
    assert sorted(missing) == ["fc.bias", "fc.weight"] and not unexpected


def test_plot_cli(colour_data, encoder_pt, tmp_path):
    run = encoder_pt.parent
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 5 - s / 10, "lr": 0.1}) + "\n" for s in range(10)))
    assert plot_main([str(run), "--data", str(colour_data), "--image-size", "16", "--num-workers", "0",
                      "--method", "pca", "--embedding-out", str(tmp_path / "emb.png")]) == 0
    assert (run / "curves.png").stat().st_size > 1000
    assert (tmp_path / "emb.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_a_clear_error(tmp_path, encoder_pt):
    extra = {**COLOURS, "zz_yellow": (220, 220, 30)}
    data = make_imagefolder(tmp_path / "extra", {"train": 4}, colours=COLOURS)
    make_imagefolder(data, {"val": 2}, colours=extra)  # a class the training set lacks
    with pytest.raises(ValueError, match=r"label 3|class"):
        linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(data), "--epochs", "1", *COMMON])
    empty = make_imagefolder(tmp_path / "empty", {"train": 4})
    (empty / "val" / "red").mkdir(parents=True)
    with pytest.raises((ValueError, FileNotFoundError), match=r"empty|no image|val"):
        knn_eval_main(["--checkpoint", str(encoder_pt), "--data", str(empty), *COMMON])
    with pytest.raises(ValueError, match="another architecture|does not fit"):
        linear_eval_main(["--checkpoint", str(encoder_pt), "--encoder", "cifar_resnet18",
                          "--data", str(tmp_path / "extra"), *COMMON])


def test_tools_are_thin_wrappers(colour_data, encoder_pt, tmp_path, monkeypatch, capsys):
    out = tmp_path / "knn.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "knn_eval.py"), "--checkpoint", str(encoder_pt),
                           "--data", str(colour_data), "--k", "3", "--output", str(out), *COMMON],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text())["top1"] == json.loads(proc.stdout.strip().splitlines()[-1])["top1"]
    import importlib.util

    for tool, prog in [("linear_eval", "contrastive-linear-eval"), ("knn_eval", "contrastive-knn-eval"),
                       ("export", "contrastive-export"), ("plot", "contrastive-plot")]:
        spec = importlib.util.spec_from_file_location(f"tool_{tool}", ROOT / "tools" / f"{tool}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setattr(sys, "argv", [prog, "--help"])
        with pytest.raises(SystemExit) as exit_:
            module.main()
        assert exit_.value.code == 0 and f"usage: {prog}" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Numbers that cannot mislead (issue 13)


def test_one_class_is_refused_before_any_feature_is_extracted(tmp_path, encoder_pt, monkeypatch):
    from contrastive.eval import runner

    data = make_imagefolder(tmp_path / "one", {"train": 4, "val": 2}, colours={"red": COLOURS["red"]})
    monkeypatch.setattr(runner, "encode_split", lambda *a, **k: pytest.fail("features were extracted"))
    for main in (linear_eval_main, knn_eval_main):
        with pytest.raises(ValueError, match="1 class present.*at least 2 classes"):
            main(["--checkpoint", str(encoder_pt), "--data", str(data), *COMMON])
    with pytest.raises(ValueError, match="at least 2 classes"):
        linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(data), "--protocol", "standard",
                          "--epochs", "1", *COMMON])


@pytest.mark.parametrize("fraction", ["2", "0", "-0.5", "nan", "x"])
def test_label_fraction_outside_0_1_is_refused_up_front(fraction, colour_data, encoder_pt, monkeypatch, capsys):
    from contrastive.eval import runner

    monkeypatch.setattr(runner, "load_split", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(SystemExit) as exit_:
        linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(colour_data),
                          "--label-fraction", fraction, *COMMON])
    assert exit_.value.code == 2 and "label fraction must be" in capsys.readouterr().err
    if fraction != "x":  # the API checks before reading any data too
        with pytest.raises(ValueError, match=r"label fraction must be in \(0, 1\]"):
            runner.linear_eval(None, str(colour_data), label_fraction=float(fraction))


def test_too_few_labels_use_the_documented_fallback(colour_data, encoder_pt, tmp_path, caplog):
    out = tmp_path / "few.json"
    with caplog.at_level("WARNING"):
        linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(colour_data), "--label-fraction",
                          "0.05", "--epochs", "2", "--output", str(out), *COMMON])
    res = json.loads(out.read_text())
    assert res["train_per_class"] == {"blue": 1, "green": 1, "red": 1} and res["num_train"] == 3
    assert res["settings"]["lr_wd_selection"] == "fallback" and res["sweep"] == []
    assert (res["settings"]["lr"], res["settings"]["weight_decay"]) == (0.1, 1e-3)
    assert "fixed fallback lr=0.1 wd=0.001" in caplog.text
    out = tmp_path / "cv.json"  # 36 rows would hold out 4: cross-validation on all 36 instead
    linear_eval_main(["--checkpoint", str(encoder_pt), "--data", str(colour_data), "--epochs", "2",
                      "--output", str(out), *COMMON])
    settings = json.loads(out.read_text())["settings"]
    assert (settings["lr_wd_selection"], settings["selection_rows"], settings["cv_folds"]) == ("cross-validation", 36, 5)


def test_results_record_what_was_used(colour_data, tmp_path):
    import hashlib

    from contrastive.nn import create_encoder

    run = tmp_path / "run"
    run.mkdir()
    torch.manual_seed(0)
    torch.save({"encoder": "small_cnn", "state_dict": create_encoder("small_cnn").state_dict()}, run / "encoder.pt")
    (run / "config.json").write_text(json.dumps({"encoder": "small_cnn", "image_size": 16}))
    out = tmp_path / "knn.json"
    assert knn_eval_main(["--checkpoint", str(run), "--data", str(colour_data), "--k", "5000",
                          "--output", str(out), *COMMON]) == 0
    res = json.loads(out.read_text())
    assert (res["settings"]["k"], res["settings"]["k_requested"]) == (36, 5000)  # clamped to the bank
    assert res["train_per_class"] == {"blue": 12, "green": 12, "red": 12}
    files = {Path(f["path"]).name: f["sha256"] for f in res["checkpoint"]["files"]}
    assert files == {name: hashlib.sha256((run / name).read_bytes()).hexdigest()
                     for name in ("encoder.pt", "config.json")}
    assert res["checkpoint"]["sha256"] == files["encoder.pt"]
    out = tmp_path / "linear.json"
    linear_eval_main(["--checkpoint", str(run), "--data", str(colour_data), "--epochs", "2",
                      "--output", str(out), *COMMON])
    res = json.loads(out.read_text())
    assert res["train_per_class"] == {"blue": 12, "green": 12, "red": 12}
    chosen = (res["settings"]["lr"], res["settings"]["weight_decay"])
    best = max(res["sweep"], key=lambda s: s["val_top1"])["val_top1"]
    assert chosen in {(s["lr"], s["weight_decay"]) for s in res["sweep"] if s["val_top1"] == best}


def test_a_missing_data_path_is_named(encoder_pt, tmp_path):
    missing = tmp_path / "nonexistent"
    for main in (linear_eval_main, knn_eval_main):
        with pytest.raises(FileNotFoundError, match=f"{missing} does not exist"):
            main(["--checkpoint", str(encoder_pt), "--data", str(missing), *COMMON])
