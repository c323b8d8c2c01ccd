"""`make demo` end to end on a tiny shapes set (a few optimiser steps)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_runs_and_writes_its_figures(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("demo_tool", ROOT / "tools" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    out = tmp_path / "demo"
    assert demo.main(["--data", "shapes:n=256,n_test=64", "--steps", "4", "--batch-size", "64",
                      "--probe-epochs", "2", "--workers", "0", "--output-dir", str(out)]) == 0
    summary = json.loads((out / "demo.json").read_text())
    assert summary["steps"] == 4 and len(summary["results"]) == 2
    for row in summary["results"].values():
        assert 0.0 <= row["linear_top1"] <= 100.0 and 0.0 <= row["knn_top1"] <= 100.0
    for png in ("curves.png", "embedding.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "linear top-1" in capsys.readouterr().out


def test_demo_names_the_data_problem_in_one_line(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("demo_tool", ROOT / "tools" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.cli(["--data", "nosuchdata", "--output-dir", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("demo: error:") and "nosuchdata" in err and "Traceback" not in err
