"""`make demo` end to end on a tiny shapes set (a few optimiser steps)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "benchmarks" / "results" / "demo_figures.json"
DEMO_PAGE = ROOT / "benchmarks" / "results" / "demo.md"


def _demo():
    spec = importlib.util.spec_from_file_location("demo_tool", ROOT / "tools" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def check_demo_json(summary: dict) -> None:
    """The format of ``<run>/demo.json`` (and of each recorded run)."""
    assert summary["format"] == 1
    assert isinstance(summary["data"], str) and isinstance(summary["steps"], int)
    assert summary["results"], "no figures"
    for row, figures in summary["results"].items():
        assert isinstance(row, str) and set(figures) == {"linear_top1", "knn_top1"}
        for value in figures.values():
            assert isinstance(value, float) and 0.0 <= value <= 100.0 and round(value, 2) == value
    env = summary["environment"]
    for key in ("python", "torch", "numpy", "torch_threads", "OMP_NUM_THREADS", "cpu", "device", "git_commit"):
        assert key in env, f"environment lacks {key!r}"
    assert isinstance(env["torch_threads"], int) and env["torch_threads"] >= 1


def test_demo_json_records_figures_and_what_they_depend_on(tmp_path):
    import torch

    demo = _demo()
    figures = {"random init": {"linear_top1": 37.49999761581421, "knn_top1": 18.299999833106995, "linear": {}},
               "MoCo, 4 steps": {"linear_top1": 40.0, "knn_top1": 20.123456, "knn": {}}}
    summary = json.loads(json.dumps(demo.summarise("shapes:n=8", 4, 1.23, 4.56, figures)))
    check_demo_json(summary)
    assert summary["results"]["random init"] == {"linear_top1": 37.5, "knn_top1": 18.3}
    assert summary["environment"]["torch"] == torch.__version__
    assert summary["environment"]["torch_threads"] == torch.get_num_threads()
    assert summary["environment"]["cpu_kind"]["capability"] == torch.backends.cpu.get_cpu_capability()
    demo.record(summary, tmp_path / "runs.json")
    demo.record(summary, tmp_path / "runs.json")
    assert json.loads((tmp_path / "runs.json").read_text())["runs"] == [summary, summary]


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f} %" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f} %"


def test_demo_page_quotes_the_recorded_demo_figures():
    """benchmarks/results/demo.md's `make demo` table is the range of the figures in
    benchmarks/results/demo_figures.json (recorded runs, and figures observed without their
    environment), and names the versions and thread counts of the recorded runs; the README
    links that page instead of quoting figures."""
    recorded = json.loads(RECORDED.read_text())
    runs = recorded["runs"]
    assert len(runs) >= 2, "record at least two runs (python tools/demo.py --record ...)"
    for run in runs:
        check_demo_json(run)
        kind = run["environment"]["cpu_kind"]  # figures differ by CPU kind and precision
        assert kind["capability"] and isinstance(kind["native_bf16"], bool), kind
        assert run["environment"]["precision"] in ("no", "bf16"), run["environment"]
    rows = list(runs[0]["results"])
    assert all(list(run["results"]) == rows for run in runs), "the runs have different encoder rows"
    seen = [run["results"] for run in runs]
    for observed in recorded.get("observed", []):
        assert observed["source"] and set(observed["results"]) <= set(rows)
        seen.append(observed["results"])
    page = DEMO_PAGE.read_text()
    for row in rows:
        line = "| {} | {} | {} |".format(row, *(_span([r[row][key] for r in seen if row in r])
                                               for key in ("linear_top1", "knn_top1")))
        assert line in page, f"{DEMO_PAGE.name} should quote the recorded figures: {line}"
    trained = rows[-1]  # the pretrained encoder's row: the headline figures elsewhere too
    for doc in ("benchmarks/results/eval.md", "benchmarks/RESULTS.md"):
        text = (ROOT / doc).read_text()
        for key in ("linear_top1", "knn_top1"):
            span = _span([r[trained][key] for r in seen if trained in r])
            assert span in text, f"{doc} should quote {span} for {trained} {key}"
    for torch_version in {run["environment"]["torch"].split("+")[0] for run in runs}:
        assert f"torch {torch_version}" in page
    threads = sorted({run["environment"]["torch_threads"] for run in runs})
    assert f"{' and '.join(map(str, threads))} thread" in page
    assert "the same figures on every run" not in page
    assert "(benchmarks/results/demo.md)" in (ROOT / "README.md").read_text()


def test_the_span_check_can_fail():
    """A table line built from figures that the page does not quote is not found in it."""
    line = f"| MoCo, 1248 steps | {_span([10.0, 12.34])} | {_span([1.0])} |"
    assert line == "| MoCo, 1248 steps | 10.0-12.3 % | 1.0 % |"
    assert line not in DEMO_PAGE.read_text()


@pytest.mark.slow
def test_demo_runs_and_writes_its_figures(tmp_path, capsys):
    demo = _demo()
    out = tmp_path / "demo"
    assert demo.main(["--data", "shapes:n=256,n_test=64", "--steps", "4", "--batch-size", "64",
                      "--probe-epochs", "2", "--workers", "0", "--output-dir", str(out)]) == 0
    summary = json.loads((out / "demo.json").read_text())
    assert summary["steps"] == 4 and len(summary["results"]) == 2
    check_demo_json(summary)
    for png in ("curves.png", "embedding.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "linear top-1" in capsys.readouterr().out


def test_demo_names_the_data_problem_in_one_line(tmp_path, capsys):
    demo = _demo()
    assert demo.cli(["--data", "nosuchdata", "--output-dir", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("demo: error:") and "nosuchdata" in err and "Traceback" not in err
