"""Pictures: files are produced, non-empty, real PNGs; bad input is a clear error."""

from __future__ import annotations

import json
import math

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
