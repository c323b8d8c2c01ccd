"""Linear probes: cached-feature sweep, the MoCo standard protocol, safety checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from contrastive.eval.linear import (
    assert_unchanged,
    evaluate_head,
    evaluate_standard,
    fit_linear_cached,
    label_fraction_indices,
    snapshot_state,
    train_linear_standard,
)
from contrastive.eval.linear.cached import _stratified_folds, _train_heads


def separable(n_per_class=40, num_classes=5, d=12, seed=0):
    """Classes on the vertices of a simplex with small noise: linearly separable."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, d, generator=g) * 4
    labels = torch.arange(num_classes).repeat_interleave(n_per_class)
    feats = centres[labels] + 0.3 * torch.randn(labels.numel(), d, generator=g)
    return feats, labels


def test_cached_probe_is_perfect_on_separable_features():
    x, y = separable()
    xt, yt = separable(n_per_class=10, seed=0)  # same centres, new noise draws
    res = fit_linear_cached(x, y, epochs=30, batch_size=32)
    assert evaluate_head(res.head, x, y)["top1"] == 100.0
    assert evaluate_head(res.head, xt, yt)["top1"] == 100.0
    # the sweep covered the whole grid, on held-out TRAINING rows
    assert len(res.sweep) == 20
    assert (res.lr, res.weight_decay) in {(s["lr"], s["weight_decay"]) for s in res.sweep}


def test_sweep_picks_the_best_held_out_pair():
    # Two classes apart along x0, with a large noise shared by x0 and x1: the class mean
    # difference (what a tiny lr learns first) separates badly, w = (1, -1) separates well.
    g = torch.Generator().manual_seed(3)
    y = torch.arange(2).repeat(200)
    common = torch.randn(400, generator=g) * 3
    x = torch.stack([2.0 * y - 1 + common + 0.3 * torch.randn(400, generator=g),
                     common + 0.3 * torch.randn(400, generator=g)], 1)
    res = fit_linear_cached(x, y, epochs=5, batch_size=16, lrs=(1e-6, 0.5), weight_decays=(0.0,),
                            val_fraction=0.25)
    assert res.selection == "held-out" and res.val_rows == 100 and res.lr == 0.5
    accs = {s["lr"]: s["val_top1"] for s in res.sweep}
    assert accs[0.5] > accs[1e-6] + 10


def test_batched_heads_equal_separate_sgd():
    """Each head of the batched trainer follows torch.optim.SGD on its own (same batches).

    In float64: 12 SGD steps of two implementations that sum in other orders differ by ~1e-15
    relative in float64 (they reached 1e-6 in float32, near the old atol 1e-5); rtol 1e-9 keeps
    a wide margin and still catches a wrong momentum, decay or lr schedule (> 1e-3)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (50,), generator=g)
    lrs, wds = torch.tensor([0.1, 0.5]), torch.tensor([0.0, 0.01])
    w, b = _train_heads(x, y, 3, lrs, wds, epochs=3, batch_size=16, momentum=0.9, seed=7)
    for h in range(2):
        lin = nn.Linear(4, 3, dtype=torch.float64)
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)
        opt = torch.optim.SGD(
            [{"params": [lin.weight], "weight_decay": float(wds[h])}, {"params": [lin.bias], "weight_decay": 0.0}],
            lr=float(lrs[h]), momentum=0.9,
        )
        total = 3 * 4
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        gen = torch.Generator().manual_seed(7)
        for _ in range(3):
            order = torch.randperm(50, generator=gen)
            for s in range(0, 50, 16):
                idx = order[s : s + 16]
                loss = nn.functional.cross_entropy(lin(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
        assert w.dtype == torch.float64
        torch.testing.assert_close(w[h].T, lin.weight.detach(), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(b[h], lin.bias.detach(), rtol=1e-9, atol=1e-12)


def test_label_fraction_is_class_balanced():
    y = torch.arange(4).repeat_interleave(100)
    idx = label_fraction_indices(y, 0.1, seed=0)
    assert torch.equal(torch.bincount(y[idx]), torch.full((4,), 10))
    assert torch.equal(idx, label_fraction_indices(y, 0.1, seed=0))
    assert not torch.equal(idx, label_fraction_indices(y, 0.1, seed=1))
    assert torch.bincount(y[label_fraction_indices(y, 0.001)]).tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="label fraction"):
        label_fraction_indices(y, 0.0)


def test_cached_bad_input():
    x, y = separable()
    with pytest.raises(ValueError, match="empty"):
        fit_linear_cached(x[:0], y[:0])
    with pytest.raises(ValueError, match="num_classes=3"):
        fit_linear_cached(x, y, num_classes=3)
    with pytest.raises(ValueError, match="unlabelled"):
        fit_linear_cached(x, torch.full_like(y, -1))
    res = fit_linear_cached(x, y, epochs=1)
    with pytest.raises(ValueError, match="num_classes=5"):
        evaluate_head(res.head, x, y + 5)


def test_one_class_is_refused():
    x, y = separable(num_classes=2)
    one = y == 0
    with pytest.raises(ValueError, match="1 class present.*at least 2 classes"):
        fit_linear_cached(x[one], y[one])
    with pytest.raises(ValueError, match="1 class present"):
        fit_linear_cached(x[one], y[one], num_classes=2)  # a bigger head does not help
    with pytest.raises(ValueError, match="at least 2 classes"):
        train_linear_standard(TinyEncoder(), [], num_classes=1, epochs=1)


def test_lr_wd_selection_follows_the_labelled_rows(caplog):
    """held-out split when it has >= 100 rows; else k-fold CV; else the fixed fallback, logged."""
    from contrastive.eval.linear import FALLBACK_LR, FALLBACK_WD
    x, y = separable(n_per_class=250, num_classes=4)  # 1000 rows: 100 held out
    res = fit_linear_cached(x, y, epochs=2, batch_size=64)
    assert (res.selection, res.val_rows, res.folds, len(res.sweep)) == ("held-out", 100, 0, 20)
    x, y = separable(n_per_class=10, num_classes=4)  # 40 rows: 4 would be held out
    res = fit_linear_cached(x, y, epochs=2, batch_size=16)
    assert (res.selection, res.val_rows, res.folds, len(res.sweep)) == ("cross-validation", 40, 5, 20)
    # pooled over the folds: every row is scored once, so each accuracy is a multiple of 100 / 40
    assert all(abs(s["val_top1"] * 40 / 100 - round(s["val_top1"] * 40 / 100)) < 1e-9 for s in res.sweep)
    with caplog.at_level("WARNING", logger="contrastive.eval.linear.cached"):
        res = fit_linear_cached(x[::10], y[::10], epochs=2)  # one row per class
    assert (res.selection, res.sweep, res.lr, res.weight_decay) == ("fallback", [], FALLBACK_LR, FALLBACK_WD)
    assert "fallback" in caplog.text and "too few labelled rows" in caplog.text
    res = fit_linear_cached(x[::10], y[::10], epochs=2, lrs=(0.02, 0.5), weight_decays=(1e-2, 2e-3))
    assert (res.lr, res.weight_decay) == (0.02, 2e-3)  # the grid values nearest the fallback pair
    res = fit_linear_cached(x, y, epochs=2, lrs=(0.3,), weight_decays=(0.0,))
    assert (res.selection, res.lr) == ("given", 0.3)


def test_cross_validation_folds_are_stratified():
    y = torch.tensor([0] * 7 + [1] * 3 + [2] * 12)
    fold = _stratified_folds(y, 3, seed=0)
    for c in range(3):
        per_fold = torch.bincount(fold[y == c], minlength=3)
        assert per_fold.max() - per_fold.min() <= 1  # floor or ceil(n_c / 3) rows of class c
    # a class with as many rows as folds appears once in every fold, so every training part has it
    res = fit_linear_cached(*separable(n_per_class=3, num_classes=7), epochs=1)
    assert (res.selection, res.folds) == ("cross-validation", 3)


# ---------------------------------------------------------------------------------------------
# The standard protocol on a tiny image problem


class ColourImages(Dataset):
    """8x8 images whose class is the dominant colour channel pattern; flips as augmentation."""

    def __init__(self, n, seed, augment):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.arange(n) % 3
        base = torch.rand(n, 3, 8, 8, generator=g) * 0.5
        for i, c in enumerate(self.labels.tolist()):
            base[i, c] += 1.0
        self.images, self.augment = base, augment

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.images[i]
        if self.augment and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, int(self.labels[i])


class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = 8

    def forward(self, x):
        return self.body(x)


def test_standard_and_cached_agree_on_a_tiny_problem():
    torch.manual_seed(0)
    enc = TinyEncoder()
    train = DataLoader(ColourImages(96, 0, augment=True), batch_size=16, shuffle=True)
    train_eval = DataLoader(ColourImages(96, 0, augment=False), batch_size=32)
    test = DataLoader(ColourImages(48, 1, augment=False), batch_size=32)
    before = snapshot_state(enc)
    enc.train()  # the protocol must switch to eval mode itself (BN stats would move otherwise)
    head = train_linear_standard(enc, train, num_classes=3, epochs=10, lr=1.0)
    standard = evaluate_standard(enc, head, test)
    assert_unchanged(enc, before)

    from contrastive.eval.features import extract_features

    xtr, ytr = extract_features(enc, train_eval)
    xte, yte = extract_features(enc, test)
    cached = evaluate_head(fit_linear_cached(xtr, ytr, epochs=20, batch_size=16).head, xte, yte)
    assert standard["top1"] >= 90.0 and cached["top1"] >= 90.0
    assert abs(standard["top1"] - cached["top1"]) <= 10.0


def test_standard_protocol_catches_a_changed_backbone():
    enc = TinyEncoder()
    before = snapshot_state(enc)
    with torch.no_grad():
        enc.body[0].weight[0, 0, 0, 0] += 1e-3
    with pytest.raises(RuntimeError, match="body.0.weight"):
        assert_unchanged(enc, before)
    enc = TinyEncoder()
    before = snapshot_state(enc)
    enc.train()
    enc(torch.randn(4, 3, 8, 8))  # a train-mode forward moves BN running statistics
    with pytest.raises(RuntimeError, match="running_mean"):
        assert_unchanged(enc, before)


def test_standard_protocol_bad_labels_and_empty_split():
    enc = TinyEncoder()
    train = DataLoader(ColourImages(12, 0, augment=False), batch_size=4)
    with pytest.raises(ValueError, match="num_classes=2"):
        train_linear_standard(enc, train, num_classes=2, epochs=1)
    empty = DataLoader(ColourImages(0, 0, augment=False), batch_size=4)
    with pytest.raises(ValueError, match="empty"):
        train_linear_standard(enc, empty, num_classes=3, epochs=1)
