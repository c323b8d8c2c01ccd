"""benchmarks/recipe_digests.py refuses to compare digests made on another CPU kind or torch (fp32
kernels round differently there: every recipe would read as changed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _digests():
    spec = importlib.util.spec_from_file_location("recipe_digests_mod",
                                                  ROOT / "benchmarks" / "recipe_digests.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_against_another_machines_digests_is_refused(tmp_path: Path, capsys) -> None:
    mod = _digests()
    here = mod.machine()
    assert mod.other_machine({**here, "recipes": {}}) is None
    assert mod.other_machine({"recipes": {}}) is None  # an older file: compared as before
    other = {**here, "cpu": "Some CPU, AVX512", "recipes": {}}
    assert "Some CPU, AVX512" in mod.other_machine(other)
    saved = tmp_path / "digests.json"
    saved.write_text(json.dumps(other))
    assert mod.main(["--check", str(saved), "--only", "byol_cifar"]) == 2
    err = capsys.readouterr().err
    assert "made on another machine" in err and "--out /tmp/base.json" in err


def test_the_committed_digests_name_their_machine() -> None:
    saved = json.loads((ROOT / "benchmarks" / "results" / "recipe_digests.json").read_text())
    assert {"cpu", "torch"} <= set(saved) and saved["recipes"]


def test_extra_arguments_are_refused_with_out(tmp_path: Path, capsys) -> None:
    """--extra makes digests of other flags than each recipe's own (for --check): written with
    --out they would stand in the file as that recipe's, and every later --check against the
    file would differ. Refused in one line, before any recipe runs; nothing is written."""
    mod = _digests()
    out = tmp_path / "digests.json"
    assert mod.main(["--out", str(out), "--only", "byol_cifar", "--extra", "--lr 0.1"]) == 2
    err = capsys.readouterr().err
    assert "--extra" in err and "--check" in err and err.count("\n") == 1
    assert not out.exists()
