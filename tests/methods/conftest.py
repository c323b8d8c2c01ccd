"""Tiny encoders so that method tests run in milliseconds; the shared loops of the masked-image
tests (MAE, SimMIM, I-JEPA): SGD against a transcription of the authors' forward, a pretext run;
the kNN learning checks' data and measure (DenseCL, I-JEPA, VICRegL) and the dense checks' linear
segmentation (DenseCL, VICRegL)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn


class TinyEncoder(nn.Module):
    """Two strided convs (+ optional BN), global average pool; num_features = 2 * width."""

    def __init__(self, width: int = 4, bn: bool = True):
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.Identity())
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1),
            norm(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            norm(2 * width),
            nn.ReLU(),
        )
        self.num_features = 2 * width

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


class TinyPatchEncoder(nn.Module):
    """ViT-like: has a ``patch_embed`` (MoCo v3 detects it); num_features = width."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, width, 4, stride=4)
        self.mix = nn.Linear(width, width)
        self.num_features = width

    def forward(self, x):
        return self.mix(self.patch_embed(x).flatten(2).mean(-1))


@pytest.fixture
def tiny():
    """Factory: tiny(bn=True, width=4) -> a fresh TinyEncoder."""
    return lambda **kw: TinyEncoder(**kw)


@pytest.fixture
def tiny_patch():
    return lambda **kw: TinyPatchEncoder(**kw)


@pytest.fixture
def views():
    """Factory: views(n, size=16, seed=0) -> [x1, x2]."""

    def make(n: int = 6, size: int = 16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(n, 3, size, size, generator=g) for _ in range(2)]

    return make


@pytest.fixture
def sgd_matches_reference():
    """check(model, ref, losses, steps=3, lr=0.5, loss_tol=(rtol, atol), param_tol=(rtol, atol),
    moved=1e-3): ``losses(step) -> (loss, loss_ref)`` gives the method's and the reference's
    (the authors' forward written out, on ``ref``'s parameters) loss of that step's batch; they
    are compared every step, both models take an SGD step, and at the end every parameter is
    compared and must have moved more than ``moved`` from the start (the comparison is not of
    untrained weights)."""

    def check(model: nn.Module, ref: nn.Module, losses: Callable, steps: int = 3,
              lr: float = 0.5, loss_tol: tuple[float, float] = (1e-12, 1e-14),
              param_tol: tuple[float, float] = (1e-11, 1e-13), moved: float = 1e-3) -> None:
        start = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
        for step in range(steps):
            loss, loss_ref = losses(step)
            torch.testing.assert_close(loss, loss_ref, rtol=loss_tol[0], atol=loss_tol[1])
            for o, lo in ((opt, loss), (opt_ref, loss_ref)):
                o.zero_grad()
                lo.backward()
                o.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=param_tol[0], atol=param_tol[1], msg=name)
        assert max(float((p - q).abs().max()) for p, q in zip(model.parameters(), start)) > moved

    return check


def shapes_images(split: str, n: int) -> torch.Tensor:
    """The 16-px ``shapes`` images of ``split`` (``n`` train, 256 test), (x - 0.5) / 0.25."""
    from contrastive.data import get_dataset

    ds = get_dataset(f"shapes:n={n},n_test=256,size=16", split)
    return (torch.stack([ds[i][0] for i in range(len(ds))]).float() / 255 - 0.5) / 0.25


@pytest.fixture
def pretext_run():
    """run(build, held_out_loss, seed, steps=80, batch=32, **adamw) -> (before, after): a
    method ``build()`` trained ``steps`` AdamW steps on batches of 16-px ``shapes`` images (one
    thread, seeded), ``held_out_loss(method, images)`` on 256 held-out images before and
    after (the masked-image learning checks)."""

    def run(build: Callable[[], nn.Module], held_out_loss: Callable, seed: int,
            steps: int = 80, batch: int = 32, **adamw) -> tuple[float, float]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the thread count of the tests' MEASURED figures
        try:
            torch.manual_seed(seed)
            m = build()
            data, test = shapes_images("train", steps * batch // 2), shapes_images("test", 256)
            opt = torch.optim.AdamW(m.parameters(), **adamw)
            before = held_out_loss(m, test)
            g = torch.Generator().manual_seed(seed)
            for _ in range(steps):
                x = data[torch.randint(0, data.shape[0], (batch,), generator=g)]
                loss = m(m.make_batch([x]))["loss"]
                opt.zero_grad()
                loss.backward()
                opt.step()
            return before, held_out_loss(m, test)
        finally:
            torch.set_num_threads(threads)

    return run


def grey_standardised(x: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> float (N, 3, H, W): luminance, zero mean and unit std per image
    (``shapes`` colours are random: see tests/methods/test_densecl_learning.py)."""
    w = torch.tensor([0.299, 0.587, 0.114])[:, None, None]
    g = (x.float() / 255 * w).sum(1, keepdim=True)
    g = (g - g.mean((2, 3), keepdim=True)) / (g.std((2, 3), keepdim=True) + 1e-3)
    return g.expand(-1, 3, -1, -1).contiguous()


@pytest.fixture
def grey_shapes():
    """``.data(size) -> (xtr, ytr, xte, yte)``: 2,000 ``shapes`` training images (seed 0) and
    500 held-out ones of ``size`` px, grey and standardised per image; ``.knn(net, data)``: the
    weighted-kNN top-1 (k 20, t 0.1) of ``net``'s features in eval mode, the first 1,000
    training images as the bank, the held-out ones as queries."""
    from types import SimpleNamespace

    from contrastive.data.generated import generate_shapes
    from contrastive.eval.knn import knn_accuracy

    def data(size: int):
        (xtr, ytr), (xte, yte) = (generate_shapes(2000, size, seed=0),
                                  generate_shapes(500, size, split="test"))
        return grey_standardised(xtr), ytr, grey_standardised(xte), yte

    @torch.no_grad()
    def knn(net: nn.Module, d) -> float:
        xtr, ytr, xte, yte = d
        mode = net.training
        net.eval()
        bank, queries = net(xtr[:1000]), net(xte)
        net.train(mode)
        return knn_accuracy(bank, ytr[:1000], queries, yte, k=20, temperature=0.1,
                            num_classes=10, backend="torch")["top1"]

    return SimpleNamespace(data=data, knn=knn)


@pytest.fixture
def segmentation_scores():
    """``(encoder, data, train=1000) -> {"miou", "pixel_accuracy", ...}``: the dense checks' probe
    (issue 55): per-pixel linear segmentation of ``shapes`` (background and the ten shapes) on
    ``encoder``'s last-stage map, trained 50 epochs on the first ``train`` images of
    ``grey_shapes.data(size)`` with their masks, scored on the held-out ones."""
    from contrastive.data.generated import generate_shape_masks
    from contrastive.eval.segmentation import linear_segmentation

    def score(encoder: nn.Module, data, train: int = 1000) -> dict:
        xtr, _, xte, _ = data
        size = xtr.shape[-1]
        masks_tr = generate_shape_masks(train, size, seed=0)
        masks_te = generate_shape_masks(xte.shape[0], size, split="test")
        return linear_segmentation(encoder, xtr[:train], masks_tr, xte, masks_te,
                                   num_classes=11, epochs=50)

    return score
