"""benchmarks/init_cifar.py (issue 49 step 6's driver): which runs it plans from a hand-made
ledger, what it estimates, the commands it gives each row, the data selection it makes and the
table it writes. No training: the driver's smoke run (``--smoke``) is the end-to-end check."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver() -> Any:
    name = "init_cifar_driver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "init_cifar.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _rec(arm: str, seed: int, knn: float, probe: float, cpu_s: float) -> dict[str, Any]:
    return {"arm": arm, "seed": seed, "knn_top1": knn, "probe_top1": probe, "cpu_s": cpu_s,
            "eval_cpu_s": 100.0, "cpu": "Some CPU, AVX2", "commit": "abc",
            "commands": [f"python recipes/x.py --seed {seed}"]}


def test_seeds_1_and_2_only_for_trained_rows_whose_seed_0_was_cheap(driver) -> None:
    limit = driver.EXTRA_SEEDS_UNDER_CPU_S
    assert [r.name for r in driver.plan({})] == [f"{a.key}-s0" for a in driver.ARMS]
    records = {"a-pretrained-s0": _rec("a-pretrained", 0, 80, 85, 0.0),  # no training: no seeds
               "b-moco-s0": _rec("b-moco", 0, 70, 80, limit - 1),
               "c-dino-s0": _rec("c-dino", 0, 30, 35, limit + 1)}
    extra = [(r.name, r.phase) for r in driver.plan(records) if r.seed]
    assert extra == [("b-moco-s1", "seeds"), ("b-moco-s2", "seeds")]


def test_plan_adds_recorded_and_estimated_cpu_time(driver, monkeypatch) -> None:
    monkeypatch.setattr(driver, "STEP_CPU_S", dict.fromkeys(driver.STEP_CPU_S, 10.0))
    monkeypatch.setattr(driver, "EVAL_CPU_S", dict.fromkeys(driver.EVAL_CPU_S, 60.0))
    # every training run 1,560 s: above the seeds' limit, so no seeds are expected
    lines = driver.plan_lines({"b-moco-s0": _rec("b-moco", 0, 70, 80, 300.0)})
    assert "done  seed0 b-moco-s0" in lines[1] and "6.7 CPU min (recorded)" in lines[1]
    assert "27.0 CPU min (estimated)" in lines[2]  # 156 x 10 + 60 s
    seeds = [ln for ln in lines if ln.startswith("todo  seeds")]
    assert [ln.split()[2] for ln in seeds] == ["b-moco-s1", "b-moco-s2"]
    total = 60 + 400 + 5 * (156 * 10 + 60) + 2 * (156 * 10 + 60)  # a, b-moco s0, 5 arms, seeds
    assert lines[-1].startswith(f"total {total / 3600:.2f} CPU hours")
    monkeypatch.setattr(driver, "STEP_CPU_S", dict.fromkeys(driver.STEP_CPU_S, 1.0))
    expected = [ln for ln in driver.plan_lines({}) if ln.startswith("(expected)")]
    assert len(expected) == 6 and "7.2 CPU min" in expected[0]  # 2 x (156 + 60) s


def test_each_row_gets_its_start_its_budget_and_its_evaluation(driver, tmp_path: Path) -> None:
    d = driver.Driver(tmp_path / "runs", tmp_path / "cifar")
    runs = {r.arm.key: r for r in driver.plan({})}
    cmd = {k: d.train_command(r) for k, r in runs.items() if r.arm.recipe}

    def value(args: list[str], flag: str) -> str:
        return args[args.index(flag) + 1]

    for key, args in cmd.items():
        assert value(args, "--output-dir") == str(tmp_path / "runs" / f"{key}-s0")
        assert value(args, "--resume") == "auto" and value(args, "--image-size") == "128"
        assert value(args, "--epochs") == "1" and value(args, "--batch-size") == "64"
        assert ("--init" in args) == key.startswith("b-"), key
    assert value(cmd["b-moco"], "--init") == str(driver.EFFNET)
    assert value(cmd["b-dino"], "--local-size") == "56"
    assert value(cmd["c-dino"], "--local-crops") == str(driver.DINO_LOCAL_CROPS)
    assert value(cmd["d-distill"], "--teacher-checkpoint") == str(driver.EFFNET)
    assert value(cmd["d-moco"], "--encoder") == value(cmd["d-distill"], "--student")
    pre = d.eval_command(runs["a-pretrained"], "knn")
    assert value(pre, "--checkpoint") == str(driver.EFFNET) and value(pre, "--mean") == "0.5"
    probe = d.eval_command(runs["c-moco"], "probe")
    assert probe[1].endswith("tools/linear_eval.py") and "--mean" not in probe
    assert value(probe, "--checkpoint") == str(tmp_path / "runs" / "c-moco-s0" / "encoder.pt")
    assert value(probe, "--data") == str(tmp_path / "runs" / "data")
    smoke = driver.Driver(tmp_path, tmp_path, scale=driver.SMOKE).train_command(runs["b-dino"])
    assert value(smoke, "--steps") == "2" and "--epochs" not in smoke
    assert value(smoke, "--local-size") == "24"  # 96 x 64 / 224 = 27.4 -> a multiple of 8


def _fake_cifar(driver, src: Path, files: int = 3) -> None:
    for split in ("train", "test"):
        for c in driver.CLASSES:
            (src / split / c).mkdir(parents=True)
            for i in reversed(range(files)):
                (src / split / c / f"{i:04d}.jpg").write_text(f"{split} {c} {i}")


def test_the_training_subset_is_the_first_files_of_each_class(driver, tmp_path: Path) -> None:
    src = tmp_path / "cifar"
    _fake_cifar(driver, src)
    scale = driver.Scale(32, 2, None, ())
    driver.make_data(src, tmp_path / "data", scale)
    assert sorted(p.name for p in (tmp_path / "data" / "train" / "cat").iterdir()) == [
        "0000.jpg", "0001.jpg"]
    assert (tmp_path / "data" / "train" / "cat" / "0001.jpg").read_text() == "train cat 1"
    assert len(list((tmp_path / "data" / "test" / "dog").iterdir())) == 3  # the whole split
    (src / "train" / "frog" / "0000.jpg").unlink()
    (src / "train" / "frog" / "0001.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="frog holds 1 .jpg files, 2 needed"):
        driver.make_data(src, tmp_path / "other", scale)


def test_a_recorded_or_claimed_run_is_not_started(driver, tmp_path: Path) -> None:
    d = driver.Driver(tmp_path, tmp_path, tmp_path / "ledger.json")
    run = driver.plan({})[1]
    d.ledger.write_text(json.dumps({"runs": {run.name: _rec(run.arm.key, 0, 1, 1, 1)}}))
    assert driver.execute(run, d) == {"done": "another driver finished it"}
    (tmp_path / f"{driver.plan({})[2].name}.lock").write_text(str(__import__("os").getpid()))
    assert driver.execute(driver.plan({})[2], d) == {"skipped": "another driver runs it"}
    (tmp_path / driver.NO_NEW_RUNS).touch()
    assert "start no new run" in driver.execute(driver.plan({})[3], d)["skipped"]
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # no run folder was made


def test_the_table_summarises_seeds_and_keeps_the_leads_reading(driver, tmp_path: Path) -> None:
    knn = [60.0, 62.0, 67.0]
    records = {f"b-moco-s{s}": _rec("b-moco", s, k, 70.0 + s, 500.0 + s)
               for s, k in enumerate(knn)}
    records["a-pretrained-s0"] = _rec("a-pretrained", 0, 80.123, 85.5, 0.0)
    text = driver.table(records, "\n\nMoCo loses: the lr.\n")
    mean, sd = statistics.fmean(knn), statistics.stdev(knn)  # 63.0, sqrt(13)
    assert (f"| b | MoCo v2 | EfficientNet-Lite0 (ImageNet) | {mean:.2f} +- {sd:.2f} (n 3) | "
            "71.00 +- 1.00 (n 3) | 0, 1, 2 | 501 + 100 | A |") in text
    assert ("| a | none (the file as it is) | EfficientNet-Lite0 (ImageNet) | 80.12 | 85.50 | 0 |"
            in text)
    assert "| c | DINO | random | - | - | - | - | - |" in text
    assert "CPU kinds: A: Some CPU, AVX2." in text and "`python recipes/x.py --seed 0`" in text
    records["c-dino-s0"] = {**_rec("c-dino", 0, 20.0, 25.0, 600.0), "cpu": "Other CPU, AVX512"}
    records["b-moco-s2"]["cpu"] = "Other CPU, AVX512"  # a row of two kinds names both
    mixed = driver.table(records)
    assert "| 0, 1, 2 | 501 + 100 | A, B |" in mixed and "| 600 + 100 | A |" in mixed
    assert "CPU kinds: A: Other CPU, AVX512; B: Some CPU, AVX2." in mixed
    out = tmp_path / "init_cifar.md"
    out.write_text(text)
    assert driver.read_reading(out).strip() == "MoCo loses: the lr."
    assert "(the lead's reading" in driver.table({}, driver.read_reading(tmp_path / "absent.md"))


def test_a_smoke_run_needs_its_own_root(driver, capsys) -> None:
    assert driver.main(["run", "--smoke"]) == 2
    assert "--smoke needs its own --root" in capsys.readouterr().out


def test_arms_restrict_the_driver_to_their_runs(driver, tmp_path: Path, monkeypatch,
                                               capsys) -> None:
    _fake_cifar(driver, tmp_path / "cifar", files=10)
    started: list[str] = []
    monkeypatch.setattr(driver, "execute", lambda run, d: started.append(run.name) or {})
    d = driver.Driver(tmp_path / "runs", tmp_path / "cifar", tmp_path / "ledger.json",
                      driver.SMOKE)
    driver.run_phase(d, None, 1, ("c-moco", "a-pretrained"))
    assert started == ["a-pretrained-s0", "c-moco-s0"]
    assert driver.main(["plan", "--arms", "b-moco,e-clip"]) == 2
    assert "--arms e-clip unknown" in capsys.readouterr().out


def test_the_commit_is_dirty_for_code_not_for_the_drivers_own_ledgers(driver, tmp_path: Path) -> None:
    """A driver writes its ledger under benchmarks/results/ in the checkout it runs from: that
    must not mark its later runs '+dirty'; a changed source file must."""
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "x_runs.json").write_text("{}")
    (tmp_path / "code.py").write_text("a = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = driver.run_ledger.git_commit(tmp_path)
    assert head is not None and len(head) == 40
    (tmp_path / "benchmarks" / "results" / "x_runs.json").write_text('{"runs": {}}')
    assert driver.run_ledger.git_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("a = 2\n")
    assert driver.run_ledger.git_commit(tmp_path) == head + "+dirty"
