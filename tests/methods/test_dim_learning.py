"""Learning check for Deep InfoMax on the built-in ``shapes``: a short run lifts weighted-kNN
top-1 of the encoder's 64-d output clearly above the same encoder at random initialisation.

Setup (the paper's CIFAR-10 recipe, ``recipes/dim_cifar.py``, scaled to CPU seconds): the
``dcgan32`` design at half width (convs 32-64-128, fc 256, 64-d output), local features from its
second conv block (8 x 8), InfoNCE, ``mi_units`` 128, Adam with the code's betas (0.5, 0.999) at
lr 4e-3 (the paper's 1e-4 is for 1000 epochs), batch 64, 400 steps, 3,000 training images of
32 px; kNN (k 20, t 0.1) with 2,000 training images as the bank and the 1,000 held-out images as
queries.

The views: one per image, colour removed (grayscale, then standardised per image). DIM has no
invariance mechanism: it encodes whatever every location of an image shares and other images
do not, and on ``shapes`` that is first the random colours (with RGB inputs kNN top-1 FALLS,
14.8 -> 10.4 after 200 steps, measured 2026-11-23): the negative control below. Without colour
what the locations share is the shape (and its scale and polarity), which DIM then learns.

Measured 2026-11-23 (kNN top-1 %, random init -> 400 steps): seed 0 27.7 -> 49.1 (+21.4),
seed 1 27.1 -> 40.5 (+13.4), seed 2 23.7 -> 44.2 (+20.5); the gain's spread over the 3 seeds is
8.0 points (the end values' 8.6), so the margin is 10. The RGB negative control: 12.7 -> 10.3.
One run is about 20 s of CPU time single-threaded (the default suite runs seed 0 only, as this
file's program in the background pool, one thread: 27.7 -> 45.9 there, 62 s of CPU on the
AVX2 Zen 3, 2026-11-28; one thread sums in another order than the figures above).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from contrastive.data.generated import generate_shapes
from contrastive.eval.knn import knn_accuracy
from contrastive.methods import DeepInfoMax

STEPS, BATCH, LR = 400, 64, 4e-3
MARGIN = 10.0  # > the measured seed-to-seed spread (8.0 for the gain, 8.6 for the end value)
ENCODER_KW = dict(widths=(32, 64, 128), hidden=(256,))


def grey_standardised(x: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> float (N, 3, H, W): luminance, zero mean and unit std per image."""
    w = torch.tensor([0.299, 0.587, 0.114])[:, None, None]
    g = (x.float() / 255 * w).sum(1, keepdim=True)
    g = (g - g.mean((2, 3), keepdim=True)) / (g.std((2, 3), keepdim=True) + 1e-3)
    return g.expand(-1, 3, -1, -1).contiguous()


@pytest.fixture(scope="module")
def shapes():
    return _shapes()


@torch.no_grad()
def _knn(method: DeepInfoMax, xtr, ytr, xte, yte) -> float:
    method.eval()
    feats = [torch.cat([method.encoder(c) for c in x.split(500)]) for x in (xtr[:2000], xte)]
    method.train()
    return knn_accuracy(feats[0], ytr[:2000], feats[1], yte, k=20, temperature=0.1,
                        backend="torch")["top1"]


def train_dim(seed: int, shapes, view=grey_standardised, steps: int = STEPS) -> tuple[float, float]:
    """(kNN top-1 at random init, after ``steps``) for one seed."""
    xtr_u8, ytr, xte_u8, yte = shapes
    xtr, xte = view(xtr_u8), view(xte_u8)
    torch.manual_seed(seed)
    method = DeepInfoMax("dcgan32", mi_units=128, estimator="infonce", encoder_kwargs=ENCODER_KW)
    assert method.local_stage == 1  # the code's local_task_idx for basic32x32
    start = _knn(method, xtr, ytr, xte, yte)
    opt = torch.optim.Adam(method.parameters(), lr=LR, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(xtr), (BATCH,), generator=g)
        loss = method({"views": [xtr[idx]]})["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return start, _knn(method, xtr, ytr, xte, yte)


CHECK = "test_dim_beats_random_init_on_shapes"


CPU_S = 62.0  # the pool run's CPU seconds (one thread, AVX2 Zen 3, 2026-11-28)


def planned_runs(item: pytest.Item) -> list[tuple[str, str, list[str], float]]:
    """Seed 0 (the default suite's check) runs as this file's program in the session's
    ``learning_runs`` pool (tests/conftest.py): one thread, in the background, while other
    tests run. The slow checks train here."""
    return [("dim-0", __file__, ["--seed", "0"], CPU_S)] if item.name == CHECK else []


def test_dim_beats_random_init_on_shapes(learning_runs):
    start, end = json.loads((learning_runs.get("dim-0") / "knn.json").read_text())
    assert end >= start + MARGIN, (start, end)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_dim_beats_random_init_other_seeds(seed, shapes):
    start, end = train_dim(seed, shapes)
    assert end >= start + MARGIN, (seed, start, end)


@pytest.mark.slow
def test_negative_control_rgb_views_learn_colour_not_shape(shapes):
    """With the colours left in, the same run does NOT pass the check (DIM encodes colour)."""
    start, end = train_dim(0, shapes, view=lambda x: (x.float() / 255 - 0.5) / 0.5)
    assert end < start + MARGIN, (start, end)


def _shapes():
    xtr, ytr = generate_shapes(3000, 32, seed=0, split="train")
    xte, yte = generate_shapes(1000, 32, seed=0, split="test")
    return xtr, ytr, xte, yte


if __name__ == "__main__":  # the learning check's run: kNN top-1 (start, end) to knn.json
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, required=True)
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "knn.json").write_text(json.dumps(train_dim(args.seed, _shapes())))
