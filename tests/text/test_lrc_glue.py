"""benchmarks/lrc_glue.py (issue 30's driver): its plan and learning-rate choice on fake results,
its FLOP formula against torch's counter, and a seconds-long smoke run of its own flags on the
real GLUE files (tiny models in place of MiniLM and the 4 x 312 student)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from contrastive.engine.run_state import write_run_state

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> Any:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def glue_benchmark(shared_data: Path, name: str, script: str, task: str = "MRPC") -> Any:
    """A script of ``benchmarks/`` loaded as module ``name``; the test skips when the real GLUE
    files of ``task`` are absent."""
    if not (shared_data / "glue" / task / "dev.tsv").is_file():
        pytest.skip(f"the real GLUE files are not in {shared_data / 'glue'} "
                    "(see ../shared/data/README.md)")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return _load(name, ROOT / "benchmarks" / script)


@pytest.fixture(scope="module", name="driver")
def driver_module(shared_data: Path) -> Any:
    """The driver module (named so that test_lrc_glue_phases.py imports the fixture)."""
    return glue_benchmark(shared_data, "lrc_glue_driver", "lrc_glue.py")


@pytest.fixture(autouse=True)
def _own_ledger(request, tmp_path: Path, monkeypatch) -> None:
    """Every test writes its own ledger (never the committed results/lrc_glue_runs.json)."""
    if "driver" in request.fixturenames:
        monkeypatch.setattr(request.getfixturevalue("driver"), "LEDGER", tmp_path / "ledger.json")


def _fake_result(folder: Path, held_out: float, dev: float | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"held_out": {"glue_score": held_out}}))
    write_run_state(folder, "completed", step=10, reason="epochs")
    if dev is not None:
        (folder / "dev.json").write_text(json.dumps({"score": dev}))


def test_plan_chooses_lr_on_held_out_and_reuses_the_search_run(driver, tmp_path: Path) -> None:
    root = tmp_path
    names = [r.name for r in driver.plan(root) if r.phase in driver.PHASES[:7]]
    # teachers, searches, the why grid (2 tasks x 3 runs), control, the pretrained student's
    # searches; no main runs before the searches (issue 51's later phases: test_lrc_glue_phases)
    assert len(names) == len(set(names)) == 3 + 18 + 6 + 18 + 18
    for lr, score in zip(driver.LR_GRID, (0.70, 0.75, 0.75)):  # a tie: the smaller lr wins
        _fake_result(driver.student_run("mrpc", "ce", lr, 0, root).folder(root), score, 0.5)
    assert driver.chosen_lr("mrpc", "ce", root) == 1e-4
    assert driver.chosen_lr("mrpc", "kd", root) == 1e-4  # kd takes ce's lr
    assert driver.chosen_lr("mrpc", "lrc", root) is None
    main = [r for r in driver.plan(root) if r.phase == "main"]
    assert {(r.meta["variant"], r.meta["seed"]) for r in main} == {
        (v, s) for v in ("ce", "kd") for s in (1, 2)} | {("kd", 0)}  # ce seed 0: the search run
    assert all(r.meta["lr"] == 1e-4 and r.meta["task"] == "mrpc" for r in main)
    rows = driver.collect(root)["tasks"]["mrpc"]
    assert rows["ce"]["values"] == [0.5] and rows["ce"]["lr"] == 1e-4
    assert rows["ce"]["by_seed"] == {0: 0.5}


def _ledger_with(driver, records: dict[str, tuple[float, float]]) -> None:
    """A hand-made ledger: run name -> (held-out, dev) scores, the rest of a record filled."""
    driver.LEDGER.write_text(json.dumps({"tasks": {}, "runs": {
        name: {"held_out": held, "dev": {"score": dev}, "train_s": 10.0, "cpu_s": 10.0,
               "digest": "d"} for name, (held, dev) in records.items()}}))


def test_the_pretrained_student_chooses_its_own_lr_and_never_mixes(driver, tmp_path: Path,
                                                                   capsys) -> None:
    """Issue 51's pretrained student: its search and main runs (MiniLM's layers 1, 2, 4, 5, the
    fused kernel), its lrs chosen on its own search's held-out scores only (the random-init
    family's, recorded beside them, choose another), its rows and pairs apart in ``collect``
    and ``table``, its records' meaning naming the start; a run whose teacher is not trained
    is skipped, not failed."""
    root = tmp_path
    pre, rand = ({lr: driver.student_run("mrpc", v, lr, 0, root, start=start,
                                         phase=phase).name for lr in driver.LR_GRID}
                 for start, phase, v in (("pre", "lr-pre", "lrc"), ("random", "lr", "lrc")))
    _ledger_with(driver, {**{pre[lr]: (h, h) for lr, h in zip(driver.LR_GRID, (0.8, 0.7, 0.6))},
                          **{rand[lr]: (h, h) for lr, h in zip(driver.LR_GRID, (0.6, 0.7, 0.8))}})
    assert driver.chosen_lr("mrpc", "lrc_np", root, "pre") == 5e-5
    assert driver.chosen_lr("mrpc", "lrc", root) == 3e-4  # the random init's own choice
    assert driver.chosen_lr("mrpc", "ce", root, "pre") is None  # its ce search not run yet
    runs = driver.plan(root)
    search = [r for r in runs if r.phase == "lr-pre"]
    assert len(search) == 18 and all(r.name.startswith("pre-") for r in search)
    assert all(r.args[r.args.index("--keep-layers") + 1] == "1,2,4,5" for r in search)
    main = [r for r in runs if r.phase == "main-pre"]
    # seed 0 of lrc at its chosen lr is its search run; lrc_np takes lrc's lr; ce / kd wait
    assert {(r.meta["variant"], r.meta["seed"], r.meta["lr"]) for r in main} == {
        ("lrc", 1, 5e-5), ("lrc", 2, 5e-5), *(("lrc_np", s, 5e-5) for s in range(3))}
    rows = driver.collect(root)["tasks"]["mrpc"]
    assert rows["pre-lrc"]["by_seed"] == {0: 0.8} and rows["lrc"]["by_seed"] == {0: 0.8}
    assert rows["pre-lrc"]["lr"] == 5e-5 and rows["lrc"]["lr"] == 3e-4
    assert "pre-ce" not in rows and "pre-lrc_1stage" not in rows
    (root / "teacher-cola").mkdir()  # CoLA's teacher not trained: its runs wait
    assert driver.execute(search[len(search) // 3], root, 1) == {
        "skipped": "its teacher is not trained yet"}
    table = driver.table(root)
    own = table[table.index("The pretrained student"):table.index("The `why` grid")]
    assert "| pre-lrc | 80.0 (n 1, lr 5e-05" in own and "\n| lrc | " not in own
    assert "| lrc | 80.0 (n 1, lr 0.0003" in table
    assert "| MRPC | lrc | 80.0 (80.0) (chosen) | 70.0 (70.0) | 60.0 (60.0) |" in own
    assert "- lr-pre: 3 of 18 runs done" in table and "- main-pre: 0 of 5 runs done" in table
    run = driver.student_run("mrpc", "kd", 1e-4, 1, root, start="pre", phase="main-pre")
    _fake_result(run.folder(root), 0.7, 0.71)
    rec = driver.record(run, root)
    assert rec["meaning"].startswith(driver.VARIANT_MEANING["kd"]) and "pretrained" in rec[
        "meaning"]
    assert driver.main(["plan", "--root", str(root), "--ledger", str(driver.LEDGER)]) == 0
    assert "todo  lr-pre   pre-mrpc-ce-lr5e-05-s0" in capsys.readouterr().out


def test_paired_differences_match_seeds_and_skip_missing_ones(driver) -> None:
    rows = {"lrc": {"by_seed": {0: 0.80, 1: 0.75, 2: 0.70}},
            "ce": {"by_seed": {0: 0.78, 2: 0.72}}}  # seed 1 of ce not run yet
    diffs = driver.paired(rows, "lrc", "ce")
    assert list(diffs) == [0, 2] and diffs[0] == pytest.approx(0.02)
    assert diffs[2] == pytest.approx(-0.02)
    assert driver.paired(rows, "lrc", "kd") == {}
    # two seeds: df 1, t 12.706; sd of (+2, -2) is 2 sqrt 2, so the half-width is 25.4
    assert driver._paired_cell(diffs) == ("+2.0 / -2.0 (seeds 0, 2; mean +0.0, 95 % CI "
                                          "[-25.4, +25.4], 1 of 2 above)")


def test_pairs_and_summaries_skip_runs_of_other_training_code(driver) -> None:
    """Runs whose recipe digest keys differ (another training code) are not paired; records
    without a key (made before issue 51) pair with each other."""
    rows = {"lrc": {"by_seed": {0: 0.80, 1: 0.75, 2: 0.70},
                    "digests": {0: "aaaa", 1: "bbbb", 2: None}},
            "ce": {"by_seed": {0: 0.78, 1: 0.72, 2: 0.72},
                   "digests": {0: "aaaa", 1: "aaaa", 2: None}}}
    assert list(driver.paired(rows, "lrc", "ce")) == [0, 2]


def test_weights_hash_reads_the_tensors_not_the_files_bytes(driver, tmp_path: Path) -> None:
    """The same tensors saved with other metadata hash alike; one changed value or a renamed
    tensor does not; no saved model: None."""
    import torch
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4)}
    hashes = []
    for i, (ts, meta) in enumerate(((tensors, None), (tensors, {"by": "another run"}),
                                    ({**tensors, "a": torch.tensor([1.0, 1, 1, 1.5])}, None),
                                    ({"c": tensors["b"], "a": tensors["a"]}, None))):
        (tmp_path / str(i)).mkdir()
        save_file(ts, str(tmp_path / str(i) / "model.safetensors"), metadata=meta)
        hashes.append(driver.weights_sha256(tmp_path / str(i)))
    assert hashes[0] == hashes[1] and len(set(hashes)) == 3
    assert driver.weights_sha256(tmp_path / "absent") is None


def test_students_of_different_general_runs_are_not_summarised_together(driver,
                                                                         tmp_path) -> None:
    """Each machine trains the general run again: gen students whose start hashes differ are
    neither summarised nor paired; with one hash they pair with the random init's lrc."""
    root = tmp_path

    def rec(score: float, **extra: str) -> dict[str, Any]:
        return {"held_out": score, "dev": {"score": score}, "train_s": 1.0, "cpu_s": 1.0,
                "digest": "k", **extra}

    runs = {driver.student_run("mrpc", "lrc", lr, 0, root).name: rec(0.7 + 0.01 * (lr == 3e-4))
            for lr in driver.LR_GRID}
    runs.update({driver.student_run("mrpc", "lrc", 3e-4, s, root).name: rec(0.71)
                 for s in (1, 2)})
    gen = {s: driver.student_run("mrpc", "lrc", 3e-4, s, root, start="gen").name for s in (0, 1)}
    for starts, agree in ((("x" * 64, "y" * 64), False), (("x" * 64, "x" * 64), True)):
        runs.update({gen[s]: rec(0.75, start_sha256=h) for s, h in enumerate(starts)})
        driver.LEDGER.write_text(json.dumps({"tasks": {}, "runs": runs}))
        rows = driver.collect(root)["tasks"]["mrpc"]
        assert rows["gen-lrc"]["digests_agree"] is agree
        assert driver.paired(rows, "gen-lrc", "lrc") == (
            {0: pytest.approx(0.04), 1: pytest.approx(0.04)} if agree else {})


def test_records_made_before_digests_count_as_the_key_of_their_code(driver, tmp_path) -> None:
    """A record without a digest field (issue 30's) pairs with a new record of
    ``UNKEYED_DIGEST`` (the code checked bit for bit), not with one of another key."""
    root = tmp_path

    def rec(held: float, **digest: str) -> dict[str, Any]:
        return {"held_out": held, "dev": {"score": held}, "train_s": 1.0, "cpu_s": 1.0, **digest}

    runs = {driver.student_run("mrpc", "lrc", lr, 0, root).name: rec(0.1)
            for lr in driver.LR_GRID[:2]}  # the search: 3e-4 chosen
    runs.update({driver.student_run("mrpc", "lrc", 3e-4, s, root).name: rec(0.7)
                 for s in (0, 1)})  # issue 30's records: no digest field
    for s, key in ((0, driver.UNKEYED_DIGEST), (1, "another")):
        runs[driver.student_run("mrpc", "lrc_no_soft", 3e-4, s, root).name] = rec(
            0.72, digest=key)
    driver.LEDGER.write_text(json.dumps({"tasks": {}, "runs": runs}))
    rows = driver.collect(root)["tasks"]["mrpc"]
    assert rows["lrc"]["digests"] == {0: driver.UNKEYED_DIGEST, 1: driver.UNKEYED_DIGEST}
    assert driver.paired(rows, "abl-lrc_no_soft", "lrc") == {0: pytest.approx(0.02)}


def test_t_interval_by_hand(driver) -> None:
    """95 % t-intervals of a mean, by hand: t(0.975, df 2) = 4.3027 and t(0.975, df 1) = 12.706
    (the printed tables); df = n - 1."""
    lo, hi = driver.t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, n 3
    assert (lo, hi) == pytest.approx((2 - 4.3027 / math.sqrt(3), 2 + 4.3027 / math.sqrt(3)),
                                     abs=1e-4)
    lo, hi = driver.t_interval([0.0, 2.0])  # mean 1, sd sqrt 2, n 2: half-width t(df 1)
    assert (lo, hi) == pytest.approx((1 - 12.7062, 1 + 12.7062), abs=1e-4)
    assert driver.t_interval([0.5]) is None
    assert driver.t_interval([1.0, 2.0, 3.0], level=0.9)[1] == pytest.approx(
        2 + 2.9200 / math.sqrt(3), abs=1e-4)


def test_margin_share_by_hand(driver) -> None:
    """(score - majority) / (teacher - majority): SST-2-like 0.8 against teacher 0.9 and
    majority 0.5 closes 75 % of the margin though it retains 89 % of the teacher; at the
    majority 0, below it negative, a teacher not above the majority gives no share."""
    assert driver.margin_share(0.8, 0.9, 0.5) == pytest.approx(0.75)
    assert driver.margin_share(0.748, 0.801, 0.748) == 0.0
    assert driver.margin_share(0.733, 0.801, 0.748) == pytest.approx(-0.015 / 0.053)
    assert driver.margin_share(0.7, 0.6, 0.6) is None
    # RTE's teacher here: 0.7 points above the majority, one dev row is half of it: no share
    assert driver.margin_share(0.527, 0.534, 0.527) is None
    assert driver.margin_share(0.532, 0.537, 0.527) == pytest.approx(0.5)
    assert driver.majority_score("sst2") == pytest.approx(444 / 872)  # SST-2 dev: 444 positive


def test_a_new_record_names_its_step_commit_digest_and_meaning(driver, tmp_path: Path) -> None:
    run = driver.student_run("mrpc", "lrc_np", 1e-4, 0, tmp_path, phase="lr")
    _fake_result(run.folder(tmp_path), 0.7, 0.71)
    rec = driver.record(run, tmp_path)
    assert rec["final_step"] == 10 and rec["meaning"] == driver.VARIANT_MEANING["lrc_np"]
    digests = json.loads(driver.DIGESTS.read_text())["recipes"]
    assert rec["digest"] == digests["lrc_bert"]["model"][:16]
    assert rec["commit"] is None or len(rec["commit"].split("+")[0]) == 40


def test_the_commit_is_the_training_processes_not_the_checkouts_at_record_time(driver) -> None:
    a, b = "a" * 40, "b" * 40
    assert driver.trained_by([{"cpu_s": 1.0, "commit": a}]) == {"commit": a}
    # resumed on other code: the last process's commit, every one listed in order
    assert driver.trained_by([{"commit": a}, {"commit": b}, {"commit": b}]) == {
        "commit": b, "commits": [a, b]}
    assert driver.trained_by([{"cpu_s": 1.0}]) == {"commit": driver.git_commit()}  # older timings


def test_target_softness_by_hand_and_its_limits(driver) -> None:
    """Rows [2, 0] (gold 0) and [0, 0] (gold 1) at t 1 by hand; t scales the logits; a large t
    makes every target uniform (entropy log 2), a large margin one-hot."""
    e = math.exp(2) / (math.exp(2) + 1)  # softmax([2, 0])[0]
    got = driver.target_softness([[2.0, 0.0], [0.0, 0.0]], [0, 1], 1.0)
    entropy0 = -(e * math.log(e) + (1 - e) * math.log(1 - e))
    assert got == pytest.approx({"mean_top_p": (e + 0.5) / 2, "share_top_p_above_0.99": 0.0,
                                 "mean_entropy_nats": (entropy0 + math.log(2)) / 2,
                                 "mean_p_gold": (e + 0.5) / 2}, rel=1e-12)
    assert driver.target_softness([[4.0, 0.0], [0.0, 0.0]], [0, 1], 2.0) == pytest.approx(got)
    flat = driver.target_softness([[3.0, -1.0]], [1], 1e6)
    assert flat["mean_entropy_nats"] == pytest.approx(math.log(2)) and flat["mean_p_gold"] < 0.5
    assert driver.target_softness([[10.0, 0.0]], [0], 1.0)["share_top_p_above_0.99"] == 1.0


def test_encoder_flops_match_torch_counter(driver) -> None:
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    cfg = transformers.BertConfig(vocab_size=50, hidden_size=24, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=40)
    cfg._attn_implementation = "eager"  # plain matmuls: the counter misses the CPU SDPA kernel
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.ones(1, 16, dtype=torch.long))
    assert driver.encoder_flops(2, 24, 40, 16) == counter.get_total_flops()


def test_the_compared_variants_step_with_the_loop_and_the_control_fused(driver,
                                                                          tmp_path: Path) -> None:
    """One optimiser implementation across the teachers and the variants the table compares
    (torch's loop, as their first runs had); the control family takes the engine's default."""
    def kernel(run) -> str | None:
        args = list(run.args)
        return args[args.index("--fused-optimizer") + 1] if "--fused-optimizer" in args else None

    compared = [driver.teacher_run("sst2"),
                *(driver.student_run(t, v, 1e-4, 0, tmp_path, phase=p)
                  for t in ("mrpc", "cola", "sst2") for v in driver.VARIANTS
                  for p in ("lr", "why", "main"))]
    assert {kernel(r) for r in compared} == {"false"}
    families = [driver.student_run(t, v, 5e-5, s, tmp_path, start=start, phase=start)
                for t in ("mrpc", "cola", "sst2") for v in ("ce", "kd") for s in range(3)
                for start in ("control", "pre")]
    assert {kernel(r) for r in families} == {None}
    assert all("--keep-layers" in r.args for r in families)


def test_smoke_run_of_the_drivers_flags_on_real_glue(driver, tmp_path: Path) -> None:
    """A teacher and an LRC-BERT student, 2 steps each, with the flags the driver passes (tiny
    models appended, a later flag wins), then the driver's dev scoring and table."""
    recipes = {n: _load(f"recipe_{n}", ROOT / "recipes" / f"{n}.py")
               for n in ("bert_finetune", "lrc_bert")}
    from contrastive.engine import reset_accelerate_state

    tiny = ["--layers", "1", "--hidden", "16", "--heads", "2", "--intermediate-size", "32",
            "--max-steps", "2", "--batch-size", "4", "--train-rows", "40", "--held-out", "8",
            "--save-every-steps", "0", "--num-workers", "0"]
    teacher = driver.teacher_run("mrpc")
    student = driver.student_run("mrpc", "lrc", 1e-4, 0, tmp_path)
    for run in (teacher, student):
        args = list(run.args)
        if run is teacher:  # a random tiny BERT with MiniLM's tokenizer instead of MiniLM
            i = args.index("--model")
            args[i + 1] = "bert"
            args += ["--tokenizer", str(driver.MINILM)]
        reset_accelerate_state()
        recipes[run.recipe.removesuffix(".py")].main(
            [*args, *tiny, "--output-dir", str(run.folder(tmp_path))])
        dev = driver.score_on_dev(run, tmp_path)
        assert set(dev) == {"accuracy", "f1", "score"}, dev
        (run.folder(tmp_path) / "dev.json").write_text(json.dumps(dev))
        held = json.loads((run.folder(tmp_path) / "results.json").read_text())["held_out"]
        assert held["glue_score"] == pytest.approx(driver.held_out_score(run, tmp_path))
    reset_accelerate_state()
    targets = driver.teacher_targets(tmp_path, ("mrpc",))["mrpc"]  # every training row read
    assert targets["rows"] == len(driver.task_splits("mrpc", driver.GLUE)[0]) > 3000
    assert 0 <= targets["teacher_accuracy"] <= 1 and set(targets) > {"t 1.1", "t 4"}
    assert targets["t 4"]["mean_entropy_nats"] >= targets["t 1.1"]["mean_entropy_nats"]
    assert "| teacher | " in driver.table(tmp_path)  # records both runs in the ledger
    ledger = json.loads(driver.LEDGER.read_text())
    # 2 steps stay in stage 1 (no hard loss yet): no training-end window to show
    assert ledger["runs"][student.name]["train_end"] is None
    assert ledger["runs"][student.name]["teacher_dev"] == ledger["runs"][teacher.name]["dev"][
        "score"]
    sha = driver.weights_sha256(teacher.folder(tmp_path) / "model")
    assert len(sha) == 64 and ledger["runs"][teacher.name]["weights_sha256"] == sha
    assert ledger["runs"][student.name]["teacher_sha256"] == sha
    assert "weights_sha256" not in ledger["runs"][student.name]  # no run loads a student's
    assert "lrc" not in ledger["tasks"]["mrpc"]  # no lr chosen yet: no main row


def test_the_ledger_outlives_the_run_folders(driver, tmp_path: Path) -> None:
    """On a fresh machine (the run folders gone) a recorded student is done and its held-out
    score still chooses the lr; a teacher is trained again (its model is needed) and its earlier
    record is kept beside the new one."""
    root, fresh = tmp_path / "a", tmp_path / "b"
    teacher = driver.teacher_run("mrpc")
    _fake_result(teacher.folder(root), 0.8, 0.81)
    for lr, score in zip(driver.LR_GRID, (0.70, 0.75, 0.72)):
        run = driver.student_run("mrpc", "ce", lr, 0, root, phase="lr")
        _fake_result(run.folder(root), score, score - 0.01)
        driver.record(run, root)
    driver.record(teacher, root)
    assert driver.chosen_lr("mrpc", "kd", fresh) == 1e-4 and not teacher.done(fresh)
    search = driver.student_run("mrpc", "ce", 1e-4, 0, fresh, phase="lr")
    assert search.done(fresh) and not search.finished_here(fresh)
    assert driver.held_out_score(search, fresh) == 0.75
    todo = {r.name for r in driver.plan(fresh) if not r.done(fresh)}
    assert search.name not in todo and teacher.name in todo
    assert driver.student_run("mrpc", "kd", 1e-4, 0, fresh).name in todo
    _fake_result(teacher.folder(fresh), 0.8, 0.79)  # trained again: another dev score
    table = driver.table(fresh)
    runs = json.loads(driver.LEDGER.read_text())["runs"]
    assert runs[teacher.name]["dev"]["score"] == 0.79
    assert [e["dev"]["score"] for e in runs[teacher.name]["earlier"]] == [0.81]
    assert runs[search.name]["teacher_dev"] == 0.81  # taught by the first teacher
    assert "| teacher | 79.0 |" in table
    driver.record(teacher, fresh)  # the same record again: no second earlier entry
    assert len(json.loads(driver.LEDGER.read_text())["runs"][teacher.name]["earlier"]) == 1
    # a third machine trains the teacher to the same score: a rerun noted once, record kept
    third = tmp_path / "c"
    _fake_result(teacher.folder(third), 0.8, 0.79)
    (teacher.folder(third) / "timing.json").write_text(json.dumps([{"cpu_s": 5.0,
                                                                     "wall_s": 6.0}]))
    for _ in range(2):
        driver.table(third)
    rec = json.loads(driver.LEDGER.read_text())["runs"][teacher.name]
    assert rec["cpu_s"] == 0 and [r["cpu_s"] for r in rec["reruns"]] == [5.0]
    # that rerun recorded by a driver older than the weights' hash: replaced, not doubled
    import torch
    from safetensors.torch import save_file

    (teacher.folder(third) / "model").mkdir()
    save_file({"w": torch.ones(2)}, str(teacher.folder(third) / "model" / "model.safetensors"))
    driver.table(third)
    reruns = json.loads(driver.LEDGER.read_text())["runs"][teacher.name]["reruns"]
    assert [(r["cpu_s"], len(r["weights_sha256"])) for r in reruns] == [(5.0, 64)]


def test_no_new_runs_file_stops_the_driver_starting_runs(driver, tmp_path: Path) -> None:
    (tmp_path / driver.NO_NEW_RUNS).touch()
    run = driver.teacher_run("mrpc")
    assert "skipped" in driver.execute(run, tmp_path, 1)
    assert not run.folder(tmp_path).exists()
    driver.run_phase(tmp_path, "teachers", 1, 1)  # returns at once, starting nothing
    assert not run.folder(tmp_path).exists()


def test_training_end_reads_the_last_window_with_a_hard_loss(driver, tmp_path: Path) -> None:
    rows = [{"step": 50, "loss": 2.0, "stage": 1.0},
            {"step": 100, "loss": 3.1, "loss_hard": 0.61, "accuracy": 70.0, "stage": 2.0},
            {"step": 150, "loss": 3.0, "loss_hard": 0.59, "accuracy": 72.5, "stage": 2.0},
            {"step": 150, "glue_score": 0.0, "glue_when": "end"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert driver.training_end(tmp_path) == {"accuracy": 72.5, "loss_hard": 0.59}
    assert driver.training_end(tmp_path / "absent") is None
    assert driver._fit(driver.training_end(tmp_path)) == "72.5 / 0.590"
    rows[2]["accuracy_pass1"] = 87.5  # a perturbed run: the unperturbed pass's accuracy beside
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    end = driver.training_end(tmp_path)
    assert end == {"accuracy": 72.5, "loss_hard": 0.59, "accuracy_pass1": 87.5}
    assert driver._fit(end) == "72.5 (unperturbed 87.5) / 0.590"
    rows = [{"step": 969, "loss": 2.08, "loss_hard": 2.08, "stage": 1.0}]  # STS-B: no accuracy
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert driver.training_end(tmp_path) == {"loss_hard": 2.08}
    assert driver._fit(driver.training_end(tmp_path)) == "MSE 2.080"


def test_a_student_finished_but_not_recorded_is_recorded_without_training(
        driver, tmp_path: Path, monkeypatch) -> None:
    """A driver that stopped between a student's training and its record (a crash, a session's
    end) leaves it to the next call: not done until the ledger holds it, then recorded from its
    folder, nothing trained again."""
    run = driver.student_run("stsb", "ce", 5e-5, 0, tmp_path, phase="lr2")
    _fake_result(run.folder(tmp_path), 0.33, 0.34)
    _fake_result(driver.teacher_run("stsb").folder(tmp_path), 0.85, 0.85)  # its teacher
    assert run.finished_here(tmp_path) and not run.done(tmp_path)
    scored = []
    monkeypatch.setattr(driver, "score_on_dev",
                        lambda r, root: scored.append(r.name) or {"score": 0.34})
    monkeypatch.setattr(driver, "run_timed",
                        lambda *a: pytest.fail("a finished run was trained again"))
    assert driver.execute(run, tmp_path, 1) == {}
    assert run.done(tmp_path) and scored == [run.name]
    assert json.loads(driver.LEDGER.read_text())["runs"][run.name]["held_out"] == 0.33


def test_label_prior_is_mrpc_published_balance(driver) -> None:
    """MRPC's training file has 2,474 paraphrases among 3,668 pairs (67.4 %); the stratified
    hold-out keeps that share, and the entropy is that of the two shares."""
    import math

    prior = driver.label_prior("mrpc")
    share = 2474 / 3668
    assert prior["majority"] == pytest.approx(share, abs=2e-3)
    p = prior["majority"]
    assert prior["entropy"] == pytest.approx(-p * math.log(p) - (1 - p) * math.log(1 - p))


# The slow check's budget: SST-2, a stratified 2,000 of its training rows (200 held out), the
# teacher MiniLM fine-tuned 2 epochs, students 4 x 312 for 3 epochs at lr 1e-4, seed 0, fp32.
SLOW_DATA = ["--train-rows", "2000", "--held-out", "200", "--save-every-steps", "0",
             "--num-workers", "0"]


# Measured 2026-11-27 (AVX-512-bf16 kind, fp32, 1 thread, 12.9 min at load 5-6), dev accuracy:
# teacher 80.6, (1) cross-entropy 65.9, (4b) LRC-BERT without perturbation 50.3 = always one
# class (SST-2 dev's majority floor is 50.9): the two-stage schedule leaves the prediction layer
# untrained until 80 % of the steps (1:0:0 first), and the last 20 % (67 steps) run at the tail
# of the linear decay (lr <= 0.22 x peak). See benchmarks/results/lrc_glue.md.
SLOW_MEASURED = {"teacher": 0.806, "ce": 0.659, "lrc_np": 0.503}


class OrderNotHeld(AssertionError):
    """(4b) did not beat (1): the expected failure of the slow check below."""


@pytest.mark.slow
@pytest.mark.xfail(raises=OrderNotHeld, strict=True,
                   reason="at this budget (4b) collapses to one class (SLOW_MEASURED); an XPASS "
                          "means the order now holds: update SLOW_MEASURED and drop the xfail")
def test_sst2_subset_lrc_without_perturbation_beats_cross_entropy(driver, tmp_path: Path) -> None:
    """Issue 30's small version: (4b) LRC-BERT without perturbation against (1) cross-entropy
    only, the same student, data, steps and seed, its own teacher. The teacher and (1) must
    learn (a plain failure otherwise); the order is the honest xfail (``SLOW_MEASURED``)."""
    recipes = {n: _load(f"recipe_{n}", ROOT / "recipes" / f"{n}.py")
               for n in ("bert_finetune", "lrc_bert")}
    from contrastive.engine import reset_accelerate_state

    runs = [driver.teacher_run("sst2"), *(driver.student_run("sst2", v, 1e-4, 0, tmp_path)
                                          for v in ("ce", "lrc_np"))]
    scores = {}
    for run in runs:
        reset_accelerate_state()
        epochs = ["--epochs", "2"] if run is runs[0] else []
        recipes[run.recipe.removesuffix(".py")].main(
            [*run.args, *SLOW_DATA, *epochs, "--output-dir", str(run.folder(tmp_path))])
        scores[run.meta.get("variant", "teacher")] = driver.score_on_dev(run, tmp_path)["score"]
    reset_accelerate_state()
    assert scores["teacher"] > 0.75 and scores["ce"] > 0.6, scores  # floors 50.9, BoW 77.9
    if not scores["lrc_np"] > scores["ce"]:
        raise OrderNotHeld(scores)


def test_a_run_is_claimed_by_one_driver_and_a_dead_drivers_claim_is_taken_over(driver,
                                                                               tmp_path: Path):
    import subprocess

    lock = tmp_path / "run.lock"
    assert driver.claim(lock) and lock.read_text() == str(os.getpid())
    assert not driver.claim(lock)  # held by a live process (this one)
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_text(str(dead.pid))  # its holder has exited
    assert driver.claim(lock) and lock.read_text() == str(os.getpid())
    teacherless = driver.student_run("mrpc", "ce", 1e-4, 0, tmp_path)
    assert driver.execute(teacherless, tmp_path, 1) == {"skipped": "its teacher is not trained yet"}
    # a run another driver finished after this one planned it is neither trained nor scored
    teacher = driver.teacher_run("mrpc")
    _fake_result(teacher.folder(tmp_path), 0.8, 0.81)  # no model: scoring it would fail
    assert driver.execute(teacher, tmp_path, 1) == {"done": "another driver finished it"}
    assert not (tmp_path / f"{teacher.name}.lock").exists()


def test_a_finished_runs_checkpoints_are_pruned_and_its_model_kept(driver, tmp_path: Path) -> None:
    run = tmp_path / "student"
    for rel in ("checkpoints/step_10/model.safetensors", "model/model.safetensors",
                "results.json", "dev.json"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text("x")
    driver.prune_checkpoints(run)
    assert not (run / "checkpoints").exists()
    assert all((run / rel).is_file() for rel in ("model/model.safetensors", "results.json",
                                                  "dev.json"))
    driver.prune_checkpoints(run)  # twice: nothing left to delete is no error


def test_an_interrupted_run_is_not_done_though_it_left_results(driver, tmp_path: Path) -> None:
    """A stopped run also writes ``model/`` and ``results.json`` (held-out null): only
    ``run_state.json`` completed (and the driver's dev score) make it finished here (its record
    in the ledger, done)."""
    run = driver.student_run("cola", "lrc", 1e-4, 0, tmp_path)
    folder = run.folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"task": "cola", "held_out": None}))
    (folder / "dev.json").write_text(json.dumps({"mcc": 0.0, "score": 0.0}))
    write_run_state(folder, "stopped", step=78, reason="SIGTERM")
    assert not run.finished_here(tmp_path) and driver.held_out_score(run, tmp_path) is None
    (folder / "results.json").write_text(json.dumps({"held_out": {"glue_score": 41.5}}))
    write_run_state(folder, "completed", step=1443, reason="epochs")
    assert run.finished_here(tmp_path) and driver.held_out_score(run, tmp_path) == 41.5


def test_training_time_is_read_from_the_log_across_a_stop(driver, tmp_path: Path) -> None:
    """2 s per step in every window but the one spanning a stop (1000 s): median x last step."""
    times = {50: 100.0, 100: 200.0, 150: 300.0, 200: 1300.0, 250: 1400.0, 300: 1500.0}
    (tmp_path / "metrics.jsonl").write_text("\n".join(
        json.dumps({"step": s, "loss": 0.5, "time": t}) for s, t in times.items()) + "\n"
        + json.dumps({"step": 300, "glue_score": 0.1}) + "\n")
    assert driver.train_seconds(tmp_path) == pytest.approx(2.0 * 300)
    assert driver.train_seconds(tmp_path / "absent") is None


def test_tasks_restrict_the_driver_to_their_runs(driver, tmp_path: Path, capsys) -> None:
    """--tasks sst2: only SST-2's teacher is started (the others are not even tried)."""
    started = []
    driver_execute = driver.execute
    try:
        driver.execute = lambda run, root, threads: started.append(run.name) or {}
        driver.run_phase(tmp_path, "teachers", 1, 1, ("sst2",))
    finally:
        driver.execute = driver_execute
    assert started == ["teacher-sst2"]
    assert driver.main(["run", "--root", str(tmp_path), "--tasks", "sst2,qnli"]) == 2
    assert "--tasks qnli unknown" in capsys.readouterr().out


def test_no_wait_leaves_a_run_another_driver_holds_and_goes_on(driver, tmp_path: Path,
                                                               monkeypatch) -> None:
    """--no-wait: a teacher another live driver holds (its lock names this process) is left to
    it and the call returns after one pass, having tried the other teacher; waiting (the
    default), the same call would sleep for the held run (here: the sleep is the sign)."""
    (tmp_path / "teacher-mrpc.lock").write_text(str(os.getpid()))
    started: list[str] = []
    real = driver.execute

    def execute(run, root, threads):
        if run.name == "teacher-mrpc":
            return real(run, root, threads)  # held: {"skipped": HELD}, nothing started
        started.append(run.name)
        return {}

    class Waited(Exception):
        pass

    def sleep(seconds: float) -> None:
        raise Waited

    monkeypatch.setattr(driver, "execute", execute)
    monkeypatch.setattr(driver.time, "sleep", sleep)
    driver.run_phase(tmp_path, "teachers", 1, 1, ("mrpc", "cola"), wait_for_others=False)
    assert started == ["teacher-cola"] and not (tmp_path / "teacher-mrpc").exists()
    with pytest.raises(Waited):  # the default: a held run is waited for (after another pass)
        driver.run_phase(tmp_path, "teachers", 1, 1, ("mrpc",))


def test_a_run_that_raises_is_logged_and_the_phase_goes_on(driver, tmp_path: Path) -> None:
    """An error in one run (a record or a score that fails) is that run's failure, its
    traceback in its log: the phase's next run still starts, and the failed one is not
    retried within the call."""
    started: list[str] = []

    def execute(run, root, threads):
        started.append(run.name)
        if run.name == "teacher-mrpc":
            raise ValueError("a broken record")
        return {}

    driver_execute = driver.execute
    try:
        driver.execute = execute
        driver.run_phase(tmp_path, "teachers", 1, 1, ("mrpc", "cola"))
    finally:
        driver.execute = driver_execute
    assert started == ["teacher-mrpc", "teacher-cola"]
    log = (tmp_path / "teacher-mrpc.log").read_text()
    assert "ValueError: a broken record" in log and "Traceback" in log
