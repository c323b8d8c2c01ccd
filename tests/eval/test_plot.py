"""Pictures: files are produced, non-empty, real PNGs; bad input is a clear error."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

pytest.importorskip("matplotlib")

from contrastive.eval.plot import embed_2d, plot_curves, plot_embedding, read_metrics  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(run):
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(0, 200, 10):
        rec = {"step": step, "epoch": step // 50, "loss": 8.0 * math.exp(-step / 80) + 1,
               "lr": 0.06 * 0.5 * (1 + math.cos(math.pi * step / 200)), "pos_acc": min(99.0, step / 2)}
        if step % 50 == 0:
            rec["knn_top1"] = 10 + step / 5
        lines.append(json.dumps(rec))
    lines.append("not json")
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_curves_png(tmp_path):
    write_metrics(tmp_path / "run")
    assert len(read_metrics(tmp_path / "run")) == 20
    out = plot_curves(tmp_path / "run", tmp_path / "curves.png")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000
    out = plot_curves(tmp_path / "run", tmp_path / "loss.png", keys=["loss"])
    assert out.stat().st_size > 1000
    with pytest.raises(KeyError, match="found"):
        plot_curves(tmp_path / "run", tmp_path / "x.png", keys=["nope"])
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_curves(tmp_path, tmp_path / "x.png")


def test_embedding_png(tmp_path):
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(4).repeat_interleave(30)
    feats = torch.randn(4, 16, generator=g)[labels] * 3 + torch.randn(120, 16, generator=g)
    out = plot_embedding(feats, labels, tmp_path / "emb.png", class_names=["a", "b", "c", "d"])
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 5000
    xy = embed_2d(feats, method="pca")
    assert xy.shape == (120, 2)
    with pytest.raises(ValueError, match="at least 3"):
        embed_2d(feats[:2])


# ---- UMAP -----------------------------------------------------------------------------------

def _clusters(n_per=30, classes=4, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(classes).repeat_interleave(n_per)
    return torch.randn(classes, dim, generator=g)[labels] * 3 + torch.randn(len(labels), dim, generator=g), labels


class _FakeUMAP:
    """Stands in for umap.UMAP: records its arguments and input, returns the first two columns."""

    calls: list = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def fit_transform(self, x):
        _FakeUMAP.calls.append((self.kwargs, x))
        return x[:, :2].astype("float64")


@pytest.fixture
def fake_umap(monkeypatch):
    import types

    _FakeUMAP.calls = []
    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(UMAP=_FakeUMAP))
    return _FakeUMAP.calls


def test_umap_wiring(fake_umap, tmp_path):
    """embed_2d(method="umap") gives umap-learn unit rows, the seed and a valid n_neighbors, and
    returns its map as float32 (N, 2); plot_embedding draws it."""
    feats, labels = _clusters()
    xy = embed_2d(feats, method="umap", seed=7)
    kwargs, x = fake_umap[-1]
    assert kwargs == {"n_components": 2, "n_neighbors": 15, "min_dist": 0.1, "metric": "euclidean",
                      "random_state": 7}
    unit = torch.nn.functional.normalize(feats.float(), dim=1)
    assert torch.equal(torch.from_numpy(x), unit)  # L2-normalised rows, float32
    assert xy.dtype == torch.float32 and torch.equal(xy, unit[:, :2])
    embed_2d(feats[:5], method="umap", n_neighbors=30, min_dist=0.5)
    assert fake_umap[-1][0]["n_neighbors"] == 4 and fake_umap[-1][0]["min_dist"] == 0.5  # N - 1
    with pytest.raises(ValueError, match="n_neighbors must be >= 2"):
        embed_2d(feats, method="umap", n_neighbors=1)
    with pytest.raises(ValueError, match="not one of"):
        embed_2d(feats, method="mds")
    out = plot_embedding(feats, labels, tmp_path / "umap.png", method="umap", seed=3)
    assert out.read_bytes()[:8] == PNG_MAGIC and fake_umap[-1][0]["random_state"] == 3


def test_plot_cli_umap(fake_umap, tmp_path):
    """contrastive-plot --method umap --seed S: the map of the encoder's features, seeded."""
    from contrastive.eval.cli import plot_main

    out = tmp_path / "emb.png"
    assert plot_main(["--data", "shapes:n=40,n_test=24,size=16", "--checkpoint", "random",
                      "--encoder", "small_cnn", "--method", "umap", "--seed", "5",
                      "--embedding-out", str(out), "--num-workers", "0"]) == 0
    kwargs, x = fake_umap[-1]
    assert kwargs["random_state"] == 5 and x.shape == (24, 256)
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_umap_missing_is_one_line(monkeypatch, capsys):
    """Without umap-learn: one line naming the extra to install, before any work is done."""
    from contrastive.eval import cli

    monkeypatch.setitem(sys.modules, "umap", None)  # `import umap` raises ImportError
    feats, _ = _clusters()
    with pytest.raises(ImportError) as info:
        embed_2d(feats, method="umap")
    assert str(info.value) == 'the UMAP map needs umap-learn: pip install -e ".[umap]"'

    def no_work(*args, **kwargs):
        raise AssertionError("loaded the encoder before checking for umap-learn")

    monkeypatch.setattr(cli, "_load", no_work)
    with pytest.raises(SystemExit) as exit_info:
        cli.plot_main(["--data", "shapes", "--checkpoint", "random", "--encoder", "small_cnn",
                       "--method", "umap"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert 'pip install -e ".[umap]"' in err and err.startswith("contrastive-plot: error:")


@pytest.mark.slow  # umap-learn's numba JIT compile: ~10-20 s on an idle machine, once per process
def test_umap_real_is_seeded_and_separates_clusters():
    pytest.importorskip("umap")
    feats, labels = _clusters()
    a = embed_2d(feats, method="umap", seed=0)
    b = embed_2d(feats, method="umap", seed=0)
    assert a.shape == (120, 2) and a.dtype == torch.float32 and torch.isfinite(a).all()
    assert torch.equal(a, b)  # same input, seed, versions and machine: the same map
    # the four well separated clusters stay apart: every point's nearest neighbour in the map
    # is of its own class
    d = torch.cdist(a.double(), a.double()).fill_diagonal_(float("inf"))
    assert (labels[d.argmin(dim=1)] == labels).float().mean() == 1.0
    small = embed_2d(feats[:6], method="umap", seed=0)  # n_neighbors capped at N - 1
    assert small.shape == (6, 2) and torch.isfinite(small).all()
