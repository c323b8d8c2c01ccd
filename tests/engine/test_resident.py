"""``--resident``: the training split decoded once and held on the device, the crops cut there,
the kNN monitor on the same tensors (:mod:`contrastive.data.resident`). A stopped run resumes
bit-identically, the monitor's figure is the file-decoding monitor's, bad data is one line.

The recipes run in this process on the recipe digests' tiny settings
(:func:`benchmarks.recipe_digests.run_recipe`: fp32, the CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from recipe_digests import run_recipe  # noqa: E402

KNN = ["--knn-every", "1", "--knn-k", "5"]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step_{step:08d}" / "model.safetensors"))


def test_a_resident_run_resumes_bit_identically_and_its_monitor_agrees(tmp_path: Path) -> None:
    flags = ["--resident", *KNN, "--knn-at-start", "true"]
    through = run_recipe("moco_cifar", tmp_path / "through", [*flags, "--max-steps", "4"])
    stopped = run_recipe("moco_cifar", tmp_path / "stopped", [*flags, "--max-steps", "2"])
    run_recipe("moco_cifar", tmp_path / "stopped", [*flags, "--max-steps", "4", "--resume", "auto"])
    a, b = _weights(stopped, 4), _weights(through, 4)
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    config = json.loads((through / "config.json").read_text())
    assert config["resident"] is True

    # the same initial weights: the resident monitor's figure is the file-decoding one's
    files = run_recipe("moco_cifar", tmp_path / "files", [*KNN, "--knn-at-start", "true",
                                                          "--max-steps", "1"])
    start = [[r["knn_top1"] for r in _records(run) if r.get("knn_when") == "start"]
             for run in (through, files)]
    assert len(start[0]) == 1 and start[0] == start[1]
    # training moved the features: the monitor measures the model, not a constant
    later = [r["knn_top1"] for r in _records(through) if "knn_top1" in r]
    assert len(later) >= 2


def test_resident_needs_the_batched_augmentation(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        run_recipe("moco_cifar", tmp_path, ["--resident", "--batched-augment", "off"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--resident" in err[-1] and "--batched-augment on" in err[-1]


def test_images_of_several_sizes_are_refused_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    for split in ("train", "test"):
        for c, size in (("a", 16), ("b", 20)):
            (root / split / c).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (size, size), (40 * i, 0, 0)).save(root / split / c / f"{i}.png")
    with pytest.raises(SystemExit) as e:
        run_recipe("moco_cifar", tmp_path, ["--resident", "--data", str(root), "--batch-size", "4"])
    message = str(e.value.code)
    assert "one size" in message and "16x16, 20x20" in message and "\n" not in message
    assert not (tmp_path / "moco_cifar" / "checkpoints").exists()
