"""benchmarks/after_cifar.py (issue 50 step 5's driver): the runs it plans, the commands it gives
each, the records it borrows from init_cifar's ledger and the table it writes. No training: the
driver's smoke run (``--smoke``) is the end-to-end check."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver() -> Any:
    name = "after_cifar_driver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "after_cifar.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_plan_pretrains_first_and_gives_seeds_to_the_low_label_runs(driver) -> None:
    names = [r.name for r in driver.plan()]
    assert names[0] == "pretrain-moco" and len(names) == len(set(names)) == 1 + 2 * (1 + 7)
    for source in ("moco", "effnet"):
        assert [n for n in names if n.startswith(f"ft-{source}-10pc")] == [
            f"ft-{source}-10pc-s{s}" for s in range(3)]
        assert [n for n in names if n.startswith(f"ft-{source}-100pc")] == [f"ft-{source}-100pc-s0"]
        assert f"ft-{source}-1pc-s2" in names


def test_each_run_gets_its_source_budget_and_subset(driver, tmp_path: Path) -> None:
    d = driver.Driver(tmp_path / "runs", tmp_path / "cifar")
    runs = {r.name: r for r in driver.plan()}
    (what, pre), = d.commands(runs["pretrain-moco"])
    assert what == "train" and pre[1].endswith("recipes/moco_cifar.py")
    assert _value(pre, "--epochs") == "1" and _value(pre, "--batch-size") == "256"
    assert _value(pre, "--data") == str(tmp_path / "cifar") and _value(pre, "--resume") == "auto"
    (_, ft), = d.commands(runs["ft-moco-10pc-s2"])
    assert _value(ft, "--init") == str(tmp_path / "runs" / "pretrain-moco" / "encoder.pt")
    assert (_value(ft, "--label-fraction"), _value(ft, "--data-seed"), _value(ft, "--seed")) == ("0.1", "2", "2")
    assert _value(ft, "--protocol") == "sgd" and _value(ft, "--steps") == "300"
    assert _value(ft, "--image-size") == "32" and _value(ft, "--val-fraction") == "0.1"
    (_, eff), = d.commands(runs["ft-effnet-1pc-s0"])
    assert _value(eff, "--init") == str(driver.init_cifar.EFFNET) and _value(eff, "--init-mean") == "0.5"
    assert _value(eff, "--image-size") == "128" and _value(eff, "--label-fraction") == "0.01"
    knn, probe = d.commands(runs["eval-moco"])
    assert (knn[0], probe[0]) == ("knn", "probe") and probe[1][1].endswith("tools/linear_eval.py")
    assert _value(knn[1], "--data") == str(tmp_path / "runs" / "eval-data")


def test_the_effnet_evaluation_is_borrowed_from_init_cifar(driver, tmp_path: Path) -> None:
    ledger = tmp_path / "init.json"
    ledger.write_text(json.dumps({"runs": {"a-pretrained-s0": {
        "knn_top1": 67.0, "probe_top1": 71.5, "eval_cpu_s": 1700.0, "cpu": "Some CPU, AVX2",
        "commit": "abc", "commands": ["python tools/knn_eval.py"]}}}))
    d = driver.Driver(tmp_path / "runs", tmp_path, tmp_path / "ledger.json", init_ledger=ledger)
    rec = driver.execute(driver.Run("eval", "effnet"), d)
    assert (rec["knn_top1"], rec["probe_top1"], rec["cpu_s"]) == (67.0, 71.5, 0.0)
    assert "init_cifar_runs.json" in rec["from"] and "eval-effnet" in d.recorded()
    skipped = driver.execute(driver.Run("ft", "moco", 0.1, 0), d)  # no pretrained MoCo yet
    assert skipped == {"skipped": "the MoCo pretraining is not finished"}


def test_the_table_summarises_seeds_per_fraction(driver) -> None:
    def ft(test: float, val: float) -> dict[str, Any]:
        return {"test_top1": test, "val_top1": val, "cpu_s": 60.0, "eval_cpu_s": 0.0, "cpu": "X"}

    records = {"eval-moco": {"knn_top1": 40.0, "probe_top1": 45.0, "cpu_s": 0.0, "eval_cpu_s": 60.0,
                             "cpu": "X"},
               "ft-moco-100pc-s0": ft(60.0, 61.0),
               **{f"ft-moco-1pc-s{s}": ft(20.0 + 2 * s, 21.0) for s in range(3)}}
    text = driver.table(records, "kept reading")
    row = next(line for line in text.splitlines() if line.startswith("| MoCo"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["40.00", "45.00", "60.00 (61.00)"]
    assert cells[4] == "-" and cells[5] == "22.00 +- 2.00 (n 3) (21.00 +- 0.00 (n 3))"
    assert "CPU hours recorded: 0.08" in text and text.rstrip().endswith("kept reading")


def test_sources_limits_the_runs_and_refuses_an_unknown_one(driver, tmp_path: Path, monkeypatch,
                                                            capsys) -> None:
    ran: list[str] = []
    monkeypatch.setattr(driver.init_cifar, "make_data", lambda *a: None)
    monkeypatch.setattr(driver, "execute", lambda run, d: ran.append(run.name) or {"done": True})
    d = driver.Driver(tmp_path / "runs", tmp_path, tmp_path / "ledger.json")
    driver.run_all(d, 1, ("effnet",))
    assert ran == [r.name for r in driver.plan() if r.source == "effnet"] and len(ran) == 8
    ran.clear()
    driver.run_all(d, 1)
    assert ran[0] == "pretrain-moco" and len(ran) == len(driver.plan())
    assert driver.main(["run", "--root", str(tmp_path / "r"), "--sources", "effnet,vit"]) == 2
    assert "--sources 'effnet,vit': give some of moco,effnet" in capsys.readouterr().out
