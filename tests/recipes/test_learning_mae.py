"""Slow: MAE's representation check on real images, an honest xfail at CPU scale.

``recipes/mae_cifar.py`` on CIFAR-10 (the JPEG copy in ../shared/data), a ViT of width 96,
depth 4, 3 heads, 4-px patches (64 tokens), decoder 64 x 1 block, batch 256, AdamW 1.5e-3
(per 256), warm-up 0.25 epoch then cosine, 2 epochs = 390 steps, fp32, kNN monitor on the
class token (k 200, t 0.1, 10,000-image bank, 2,000 queries), seed 0; beside it the negative
control, the same run with the loss on the visible patches only (a copy task).

Measured 2026-11-27 (AMD EPYC Zen 5, 2 cores shared, load 5-7, the two runs side by side, 1
thread each, ~85-220 images/s each, ~17 minutes): random init 30.3; MAE at 75 %: 29.9 (epoch
1), 30.7 (epoch 2); the copy task: 34.65 (epoch 1), 33.6 (epoch 2). So at this budget MAE
does not beat random init and the control is ABOVE it (an autoencoder keeps pixel detail that
kNN on CIFAR rewards; MAE's class token is trained only indirectly). MAE is known to need long
schedules (the paper: 800-1600 epochs) and its kNN / linear figures are low even then; its
pretext learning is checked in tests/methods/test_mae_learning.py instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from contrastive.data import unpack_image_folder

VIT = json.dumps({"img_size": 32, "patch_size": 4, "embed_dim": 96, "depth": 4, "num_heads": 3})
ARGS = ["--image-size", "32", "--encoder-kwargs", VIT, "--decoder-dim", "64",
        "--decoder-depth", "1", "--decoder-heads", "4", "--batch-size", "256", "--epochs", "2",
        "--warmup-epochs", "0.25", "--lr", "1.5e-3", "--num-workers", "1", "--progress",
        "false", "--log-every", "20", "--mixed-precision", "no", "--knn-every", "1",
        "--knn-max-train", "10000", "--knn-max-test", "2000", "--save-every-epochs", "0",
        "--seed", "0"]


def unpacked_cifar(tar_path: Path) -> Path:
    cache = Path(os.environ.get("CONTRASTIVE_CACHE", Path.home() / ".cache" / "contrastive"))
    return unpack_image_folder(tar_path, cache / "cifar10-jpeg")


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason=(
    "MAE's class-token kNN does not rise in 390 CPU steps: 30.3 -> 29.9 -> 30.7 while the "
    "visible-only copy task reaches 34.65 -> 33.6; MAE needs hundreds of epochs (docstring)"))
def test_mae_beats_random_init_and_the_copy_task_on_cifar10(shared_data, tmp_path, rx):
    data = unpacked_cifar(shared_data / "cifar10-jpeg.tar")
    knn = {}
    for loss_on in ("masked", "visible"):
        out = tmp_path / loss_on
        rx.run_recipe("mae_cifar", "--data", f"imagefolder:{data}", *ARGS, "--loss-on", loss_on,
                      "--output-dir", str(out), tiny=False, timeout=3600, threads=1)
        knn[loss_on] = [r["knn_top1"] for r in rx.read_metrics(out) if "knn_top1" in r]
    start, mae, copy = knn["masked"][0], knn["masked"][-1], knn["visible"][-1]
    assert mae >= start + 3.0 and mae >= copy + 3.0, knn
