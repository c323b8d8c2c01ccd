"""benchmarks/stsb_genres.py: the genre of each STS-B row, and dev resampled to another genre
mix (the explanation of the study's STS-B held-out scores above dev)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.text.test_lrc_glue import glue_benchmark


@pytest.fixture(scope="module", name="genres")
def genres_module(shared_data: Path) -> Any:
    return glue_benchmark(shared_data, "stsb_genres", "stsb_genres.py", "STS-B")


def test_every_row_has_its_files_genre(genres, shared_data: Path) -> None:
    """The held-out rows keep the training file's genre mix; dev has three times the share of
    forum rows (GLUE's STS-B files: train 2000 / 450 / 3299, dev 625 / 375 / 500)."""
    _, held, dev = genres.task_splits("stsb", shared_data / "glue")
    gh, gd = genres.genres_of(shared_data / "glue", held), genres.genres_of(shared_data / "glue", dev)
    assert "?" not in set(gh) | set(gd)
    assert {g: int((gd == g).sum()) for g in set(gd)} == {
        "main-captions": 625, "main-forum": 375, "main-news": 500}
    assert abs((gh == "main-forum").mean() - 450 / 5749) < 0.02  # stratified by score, not genre
    assert (gd == "main-forum").mean() > 3 * (gh == "main-forum").mean()


def test_resampling_to_a_mix_weights_each_genres_correlation(genres) -> None:
    """Perfect predictions on genre a, noise on genre b: dev resampled to a alone correlates
    perfectly, to b alone about 0, and to an even mix in between."""
    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 5, 400)
    kinds = np.array(["a"] * 200 + ["b"] * 200)
    pred = np.where(kinds == "a", gold, rng.uniform(0, 5, 400))
    assert genres.resampled_to(pred, gold, kinds, {"a": 1.0})[0] == pytest.approx(1.0)
    only_b = genres.resampled_to(pred, gold, kinds, {"b": 1.0})
    assert abs(only_b[0]) < 0.15 and only_b[1] > 0
    assert 0.3 < genres.resampled_to(pred, gold, kinds, {"a": 0.5, "b": 0.5})[0] < 0.8


def test_a_report_row_gives_each_genre_on_both_sides(genres) -> None:
    """The row: held-out, dev, per genre held-out / dev, dev at the held-out mix (x 100)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(1)
    gold = rng.uniform(0, 5, 300)
    kinds = np.array(["a", "b", "c"] * 100)
    row = genres.report("p", gold, gold, SimpleNamespace(labels=gold), SimpleNamespace(labels=gold),
                        kinds, kinds)
    assert row.startswith("| p | 100.0 | 100.0 | 100.0 / 100.0 | 100.0 / 100.0 | 100.0 / 100.0 |")
    assert row.endswith("| 100.0 (0.0) |")
