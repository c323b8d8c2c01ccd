"""benchmarks/lrc_glue.py's phases of issue 51, steps 3-6 (ablations, RTE and STS-B, BERT_M, the
pre-training distillation and its corpus, the budget): their plans, flags, waits and table
sections on fake results, and the corpus on a fake GLUE folder. No training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from contrastive.engine.run_state import write_run_state
from tests.text.test_lrc_glue import (  # noqa: F401 (the fixtures: driver, its own ledger)
    ROOT,
    _fake_result,
    _ledger_with,
    _load,
    _own_ledger,
    driver_module,
)

OLD_PLAN = Path(__file__).with_name("lrc_glue_plan_626ab7c.json")  # the plan before issue 51's
# later phases (commit 626ab7c), for an empty root and the committed ledger of that day


def _norm(driver, root: Path, args: tuple[str, ...]) -> list[str]:
    return [a.replace(str(root), "{root}").replace(str(driver.GLUE), "{glue}")
            .replace(str(driver.MINILM), "{minilm}") for a in args]


def test_every_earlier_run_keeps_its_name_flags_and_phase(driver, tmp_path: Path) -> None:
    """The ledger holds runs by name: the new phases only add runs. The plan made before them
    (frozen in OLD_PLAN) is in today's plan unchanged, and so is every recorded run's name."""
    shutil.copy(ROOT / "benchmarks" / "results" / "lrc_glue_runs.json", driver.LEDGER)
    root = tmp_path / "runs"
    new = {r.name: (r.phase, _norm(driver, root, r.args)) for r in driver.plan(root)}
    old = json.loads(OLD_PLAN.read_text())
    assert len(old) == 98 and {n: new.get(n) for n, _, _ in old} == {
        n: (phase, args) for n, phase, args in old}
    assert set(driver.recorded()) <= set(new)
    assert driver.PHASES[:7] == ("teachers", "lr", "why", "main", "control", "lr-pre",
                                 "main-pre")
    assert {p for p, _ in new.values()} <= set(driver.PHASES)


def _search(driver, root: Path, task: str, start: str, best: dict[str, float]) -> dict[str, Any]:
    """Fake search records of ``start`` on ``task`` whose held-out score is best at ``best``'s lr
    per variant (``ce``, ``lrc``)."""
    return {driver.student_run(task, v, lr, 0, root, start=start).name:
            (0.7 + 0.1 * (lr == best[v]), 0.6) for v in best for lr in driver.LR_GRID}


def _flags(run) -> list[str]:
    return list(run.args[run.args.index("--teacher") + 2:run.args.index("--epochs")])


def test_the_ablations_and_bert_m_runs_and_their_flags(driver, tmp_path: Path,
                                                       monkeypatch) -> None:
    """lrc_no_cosnce: one stage (else COS-NCE trains for 80 % of the steps) at 0:1:3;
    lrc_no_soft / lrc_no_hard keep the two stages; lrc_1stage is the why phase's variant; all at
    lrc's chosen lr, random init on MRPC and SST-2, seeds 0-2; BERT_M on the three tasks."""
    root = tmp_path
    _ledger_with(driver, {**_search(driver, root, "mrpc", "random", {"ce": 5e-5, "lrc": 3e-4}),
                          **_search(driver, root, "cola", "random", {"ce": 5e-5, "lrc": 1e-4}),
                          **_search(driver, root, "mrpc", "pre", {"ce": 5e-5, "lrc": 1e-4})})
    runs = driver.plan(root)
    # the pretrained student's ablations at its own lrc lr, MRPC now (CoLA's search not run)
    pre = [r for r in runs if r.phase == "abl-pre"]
    assert {(r.meta["task"], r.meta["variant"], r.meta["seed"], r.meta["lr"]) for r in pre} == {
        ("mrpc", v, s, 1e-4) for v in driver.ABL_VARIANTS for s in (0, 1, 2)}
    assert all(r.name.startswith("pre-mrpc-") and "1,2,4,5" in r.args for r in pre)
    assert driver.PHASES.index("abl-pre") == driver.PHASES.index("abl") + 1
    abl = [r for r in runs if r.phase == "abl"]
    assert {(r.meta["task"], r.meta["variant"], r.meta["seed"], r.meta["lr"]) for r in abl} == {
        ("mrpc", v, s, 3e-4) for v in driver.ABL_VARIANTS for s in (0, 1, 2)}  # SST-2 waits
    by_variant = {r.meta["variant"]: r for r in abl if r.meta["seed"] == 1}
    assert _flags(by_variant["lrc_no_cosnce"]) == ["--no-two-stage", "--stage2-weights", "0", "1",
                                                   "3"]
    assert _flags(by_variant["lrc_no_soft"]) == ["--stage2-weights", "1", "0", "3"]
    assert _flags(by_variant["lrc_no_hard"]) == ["--stage2-weights", "1", "1", "0"]
    assert _flags(by_variant["lrc_1stage"]) == ["--no-two-stage"]
    assert by_variant["lrc_1stage"].name == "student-mrpc-lrc_1stage-lr0.0003-s1"
    assert all("--fused-optimizer" in r.args for r in abl)  # the random init's loop, as lrc's
    bertm = [r for r in runs if r.phase == "bertm"]
    assert {(r.meta["task"], r.meta["lr"]) for r in bertm} == {("mrpc", 3e-4), ("cola", 1e-4)}
    assert all(_flags(r) == ["--layer-loss", "mse"] for r in bertm) and len(bertm) == 6
    assert set(driver.VARIANT_MEANING) == set(driver.VARIANTS)
    # a why run whose name an ablation run shares stays the why run (its record counts)
    _ledger_with(driver, _search(driver, root, "cola", "random", {"ce": 5e-5, "lrc": 1e-4}))
    monkeypatch.setattr(driver, "ABL_TASKS", ("cola",))
    names = [(r.name, r.phase) for r in driver.plan(root)]
    assert ("student-cola-lrc_1stage-lr0.0001-s0", "why") in names
    assert len([n for n, _ in names if n == "student-cola-lrc_1stage-lr0.0001-s0"]) == 1


def test_rte_and_stsb_have_phases_of_their_own(driver, tmp_path: Path) -> None:
    """Their teachers, searches (random and pretrained) and main runs (ce, kd, lrc; no lrc_np)
    are in the new phases only; the split rule holds 10 % out (STS-B by score quintile)."""
    root = tmp_path
    runs = driver.plan(root)
    assert [r.name for r in runs if r.phase == "teachers2"] == ["teacher-rte", "teacher-stsb"]
    assert all(r.meta["task"] in ("mrpc", "cola", "sst2") for r in runs
               if r.phase in driver.PHASES[:7] and "task" in r.meta)
    assert len([r for r in runs if r.phase == "lr2"]) == 12
    assert {r.name.split("-")[0] for r in runs if r.phase == "lr2-pre"} == {"pre"}
    _ledger_with(driver, _search(driver, root, "stsb", "pre", {"ce": 1e-4, "lrc": 5e-5}))
    main = [r for r in driver.plan(root) if r.phase == "main2-pre"]
    assert {(r.meta["variant"], r.meta["lr"]) for r in main} == {("ce", 1e-4), ("kd", 1e-4),
                                                                 ("lrc", 5e-5)}
    assert len(main) == 3 * 3 - 2  # seed 0 of ce and lrc: their search runs
    train, held, _ = driver.task_splits("stsb", driver.GLUE)
    assert len(held) == round(0.1 * (len(train) + len(held))) and held.task.is_regression
    # stratified by score quintile: the held-out scores spread as the training scores do
    assert abs(float(held.labels.mean()) - float(train.labels.mean())) < 0.1
    floors = json.loads(driver.FLOORS.read_text())["tasks"]
    assert floors["stsb"]["majority"]["score"] == 0.0 and 0 < floors["stsb"]["bag_of_words"][
        "pearson"] < 1
    assert floors["rte"]["majority"]["accuracy"] == pytest.approx(146 / 277)  # entailment


def _trained(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_run_state(folder, "completed", step=5, reason="epochs")


def test_gen_students_wait_for_the_general_run_and_then_load_it(driver, tmp_path: Path) -> None:
    """main-gen distils general-e1's student (``--student hf:ROOT/general-e1/model``, no
    --keep-layers) at the random init's chosen lrc lr; it waits for general-e1 as a student
    waits for its teacher. general-e1 (no task) is done once trained here, with no dev score;
    its record holds the corpus's sha256 and its training figures, recorded once."""
    root = tmp_path
    _ledger_with(driver, _search(driver, root, "mrpc", "random", {"ce": 5e-5, "lrc": 1e-4}))
    gen = [r for r in driver.plan(root) if r.phase == "main-gen"]
    assert [r.name for r in gen] == [f"gen-mrpc-lrc-lr0.0001-s{s}" for s in (0, 1, 2)]
    general = root / driver.GENERAL
    for r in gen:
        i = r.args.index("--student")
        assert r.args[i + 1] == f"hf:{general}/model" and "--keep-layers" not in r.args
        assert "--fused-optimizer" not in r.args  # fused, as the pretrained student
    _trained(driver.teacher_run("mrpc").folder(root))
    assert driver.execute(gen[1], root, 1) == {
        "skipped": f"its student ({driver.GENERAL}) is not trained yet"}
    run = driver.general_run(root)
    assert run.args[run.args.index("--data") + 1] == str(root / "general" / "corpus.txt")
    assert not run.done(root) and driver.waits_for(run, root) is None  # MiniLM: no run folder
    _trained(general)
    (general / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 1.5, "time": 1.0})
                                           + "\n")
    (root / "general").mkdir()
    (root / "general" / "corpus.json").write_text(json.dumps({"sha256": "abc"}))
    assert run.done(root) and driver.waits_for(gen[1], root) is None
    rec = driver.record(run, root)
    assert rec["corpus_sha256"] == "abc" and "dev" not in rec and rec["final_step"] == 5
    assert rec["train_last"] == {"step": 5, "loss": 1.5} and "GLUE" in rec["meaning"]
    driver.record(run, root)  # as ``collect`` does: a local run is recorded again if changed
    assert "earlier" not in json.loads(driver.LEDGER.read_text())["runs"][driver.GENERAL]
    assert not run.done(tmp_path / "fresh")  # like a teacher: needed where its students train
    student = gen[1]
    _fake_result(student.folder(root), 0.7, 0.72)
    rec = driver.record(student, root)
    assert "pre-training distillation" in rec["meaning"]


def test_the_budget_start_is_the_best_complete_one_and_stays(driver, tmp_path: Path) -> None:
    """Once every start of the task has all three seeds of lrc scored, the highest mean
    held-out score (ties: random, pre, gen); budget runs appear only then, at 10 epochs, at that start's lrs,
    the choice and its reason in their meta; a recorded budget run keeps the choice."""
    root = tmp_path
    search = {**_search(driver, root, "mrpc", "random", {"ce": 5e-5, "lrc": 3e-4}),
              **_search(driver, root, "mrpc", "pre", {"ce": 1e-4, "lrc": 1e-4})}

    def seeds(start: str, lr: float, held: tuple[float, ...]) -> dict[str, tuple[float, float]]:
        return {driver.student_run("mrpc", "lrc", lr, s, root, start=start).name: (h, h)
                for s, h in enumerate(held)}

    _ledger_with(driver, search)  # seed 0 of each search's lrc scored 0.8, seeds 1-2 missing
    assert driver.budget_start("mrpc", root) is None
    assert not [r for r in driver.plan(root) if r.phase == "budget"]
    _ledger_with(driver, {**search, **seeds("random", 3e-4, (0.8, 0.7, 0.6)),
                          **seeds("pre", 1e-4, (0.8, 0.6, 0.7))})
    assert driver.budget_start("mrpc", root) is None  # gen not scored yet: no choice
    gen = seeds("gen", 3e-4, (0.6, 0.6, 0.6))  # gen takes the random init's chosen lr
    _ledger_with(driver, {**search, **seeds("random", 3e-4, (0.8, 0.7, 0.6)),
                          **seeds("pre", 1e-4, (0.8, 0.6, 0.7)), **gen})  # a tie: random
    assert driver.budget_start("mrpc", root)[0] == "random"
    _ledger_with(driver, {**search, **seeds("random", 3e-4, (0.8, 0.7, 0.6)),
                          **seeds("pre", 1e-4, (0.8, 0.75, 0.7)), **gen})
    start, why = driver.budget_start("mrpc", root)
    assert start == "pre" and "pre 75.00" in why and "random 70.00" in why and "gen 60.00" in why
    budget = [r for r in driver.plan(root) if r.phase == "budget"]
    assert [r.name for r in budget] == ["budget-mrpc-ce-pre-e10-s0", "budget-mrpc-lrc-pre-e10-s0"]
    ce = budget[0]
    assert ce.args[ce.args.index("--epochs") + 1] == "10" and ce.meta["lr"] == 1e-4
    assert ce.args[ce.args.index("--keep-layers") + 1] == "1,2,4,5"
    assert ce.meta["budget_start"] == "pre" and ce.meta["budget_why"] == why
    assert driver.cpu_hours(ce, {("pre", "ce"): 0.01}) == pytest.approx(
        0.01 * driver.kept_rows("mrpc") * 10 / 3600)
    assert driver.cpu_hours(driver.general_run(root), {}) is None
    _fake_result(ce.folder(root), 0.7, 0.71)
    rec = driver.record(ce, root)
    assert rec["meaning"].endswith("; 10 epochs") and rec["budget_start"] == "pre"
    table = driver.table(root)  # beside the same start's 3-epoch run: its search run here
    assert "| MRPC | ce | pre | 0.0001 | 71.0 (70.0) | 60.0 (80.0) | +11.0 |" in table
    assert f"- mrpc: start pre: {why}" in table
    ledger = json.loads(driver.LEDGER.read_text())
    for n in list(ledger["runs"]):  # random now learns best: the recorded choice stays
        if n.startswith("student-mrpc-lrc-lr0.0003-s"):
            ledger["runs"][n]["held_out"] = 0.99
    driver.LEDGER.write_text(json.dumps(ledger))
    assert driver.budget_start("mrpc", root)[0] == "pre"


def test_table_sections_of_the_new_phases(driver, tmp_path: Path) -> None:
    """With no record each new section is one "not run yet" line; with ablation, RTE and gen
    records their rows, pairs (t-interval), floors and the paper's rows appear."""
    root = tmp_path
    table = driver.table(root)
    for title in ("The ablations (issue 51", "RTE and STS-B, random start", "BERT_M",
                  "Pre-training distillation first", "The ablations with the pretrained",
                  "The budget"):
        line = next(x for x in table.splitlines() if x.startswith(title))
        assert line.endswith("not run yet."), line
    assert "The paper (Table 1" not in table
    lrc = {driver.student_run("mrpc", "lrc", 3e-4, s, root).name: (0.8, d)
           for s, d in enumerate((0.75, 0.76, 0.77))}
    abl = {driver.student_run("mrpc", "lrc_no_cosnce", 3e-4, s, root).name: (0.7, d)
           for s, d in enumerate((0.73, 0.73, 0.74))}
    gen = {driver.student_run("mrpc", "lrc", 3e-4, s, root, start="gen").name: (0.7, 0.8)
           for s in (0, 1)}
    rte = {driver.student_run("rte", "ce", 1e-4, s, root).name: (0.8, 0.6) for s in (0, 1, 2)}
    _ledger_with(driver, {**_search(driver, root, "mrpc", "random", {"ce": 5e-5, "lrc": 3e-4}),
                          **_search(driver, root, "rte", "random", {"ce": 1e-4, "lrc": 1e-4}),
                          **lrc, **abl, **gen, **rte,
                          "teacher-mrpc": (0.8, 0.8), "teacher-rte": (0.65, 0.65)})
    table = driver.table(root)
    own = table[table.index("The ablations (issue 51"):table.index("RTE and STS-B")]
    assert "| abl-lrc_no_cosnce | 73.3 [73.0, 74.0] (n 3, lr 0.0003" in own
    assert "| abl-lrc_no_cosnce - lrc | -2.0 / -3.0 / -3.0 (seeds 0, 1, 2; mean -2.7, 95 % CI" in own
    assert "lrc_no_cosnce 81.5 / 37.0" in own  # the paper's Table 3
    assert "| abl-lrc_no_soft | - |" in own
    rte_part = table[table.index("RTE and STS-B, random"):table.index("BERT_M")]
    assert "| ce | 60.0 [60.0, 60.0] (n 3, lr 0.0001, 92 %, margin 59 %) | - |" in rte_part
    assert "Floors (dev x 100), majority class / bag of words: RTE 52.7 / 50.5" in rte_part
    assert "RTE teacher 66.4, LRC-BERT1 51.0 (76.8 %)" in rte_part
    assert "| RTE | ce | 70.0 (60.0) | 80.0 (60.0) (chosen) | 70.0 (60.0) |" in rte_part
    assert "STS-B dev Pearson / Spearman x 100, mean over seeds: -" in rte_part
    assert "RTE and STS-B, pre start (issue 51, step 4; phases lr2-pre, main2-pre): not run" in (
        rte_part)
    gen_part = table[table.index("Pre-training distillation first"):]
    assert "| gen-lrc | 80.0 [80.0, 80.0] (n 2, lr 0.0003" in gen_part
    assert "| gen-lrc - lrc | +5.0 / +4.0 (seeds 0, 1;" in gen_part
    assert "general-e1: not recorded" in gen_part and "LRC-BERT1 83.0 (94.3 %)" in gen_part
    ledger = json.loads(driver.LEDGER.read_text())
    assert ledger["tasks"]["rte"]["ce"]["by_seed"] == {"0": 0.6, "1": 0.6, "2": 0.6}
    assert ledger["tasks"]["stsb"]["prior"] is None  # regression: no class prior


def test_a_search_under_way_is_shown_before_any_lr_is_chosen(driver, tmp_path: Path) -> None:
    """One recorded search run of the pretrained start (no lr chosen, no summary row): its
    section says so and shows the search table with that run, the floors and the paper."""
    root = tmp_path
    _ledger_with(driver, {driver.student_run("stsb", "ce", 5e-5, 0, root, start="pre").name:
                          (0.674, 0.688), "teacher-rte": (0.534, 0.534)})
    table = driver.table(root)
    pre = table[table.index("RTE and STS-B, pre start"):table.index("BERT_M")]
    assert "No lr chosen yet: its lr search so far is below." in pre
    assert "| STS-B | ce | 67.4 (68.8) | - | - |" in pre
    assert "Floors (dev x 100)" in pre and "The paper (Table 1" in pre
    assert "RTE and STS-B, random start (issue 51, step 4; phases lr2, main2): not run" in table


def test_the_corpus_leaves_out_held_out_and_dev_sentences(tmp_path: Path, monkeypatch) -> None:
    """A fake GLUE folder: 20 training rows a task (SST-2: 30, its "subset" 20), so 2 held out
    a task; a dev sentence planted in CoLA's training rows, a duplicate in SST-2's. The corpus
    has every other training sentence once, a pair as two lines, in task and file order, and
    the same bytes twice."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    floors = _load("glue_floors", ROOT / "benchmarks" / "glue_floors.py")
    corpus = _load("glue_corpus", ROOT / "benchmarks" / "glue_corpus.py")
    monkeypatch.setattr(floors, "SST2_TRAIN_ROWS", 20)
    glue = tmp_path / "glue"

    def tsv(task: str, split: str, header: str | None, rows: list[str]) -> None:
        (glue / task).mkdir(parents=True, exist_ok=True)
        (glue / task / f"{split}.tsv").write_text(
            "".join(f"{r}\n" for r in ([header] if header else []) + rows))

    def pair(i: int, task: str, split: str) -> tuple[str, str]:
        return f"{task} {split} first {i}", f"{task} {split} second {i}"

    for split, n in (("train", 20), ("dev", 3)):
        tsv("SST-2", split, "sentence\tlabel",
            [f"sst2 {split} {i}\t{i % 2}" for i in range(30 if split == "train" else n)])
        tsv("CoLA", split, None, [f"src\t{i % 2}\t\tcola {split} {i}" for i in range(n)])
        tsv("MRPC", split, "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            [f"{i % 2}\t1\t2\t" + "\t".join(pair(i, "mrpc", split)) for i in range(n)])
        tsv("RTE", split, "index\tsentence1\tsentence2\tlabel",
            [f"{i}\t" + "\t".join(pair(i, "rte", split)) + f"\t{('entailment', 'not_entailment')[i % 2]}"
             for i in range(n)])
        tsv("STS-B", split, "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
            "sentence1\tsentence2\tscore",
            [f"{i}\tg\tf\ty\t{i}\tnone\tnone\t" + "\t".join(pair(i, "stsb", split))
             + f"\t{i % 5}.0" for i in range(n)])
        tsv("WNLI", split, "index\tsentence1\tsentence2\tlabel",
            [f"{i}\t" + "\t".join(pair(i, "wnli", split)) + f"\t{i % 2}" for i in range(n)])
    sst2 = (glue / "SST-2" / "train.tsv").read_text().replace("sst2 train 29\t", "sst2 train 3\t")
    (glue / "SST-2" / "train.tsv").write_text(sst2)  # row 29 repeats row 3's sentence
    cola = (glue / "CoLA" / "train.tsv").read_text().replace("cola train 7\n", "cola dev 1\n")
    (glue / "CoLA" / "train.tsv").write_text(cola)  # a training row with a dev sentence
    info = corpus.write_corpus(tmp_path / "a", glue)
    lines = (tmp_path / "a" / "corpus.txt").read_text(encoding="utf-8").splitlines()
    held = {}
    for task in ("sst2", "cola", "mrpc", "rte", "stsb"):
        out = floors.task_splits(task, glue)[1]
        held[task] = out.text_a + (out.text_b or [])
        assert len(out) == 2 and not set(held[task]) & set(lines), task
    assert not {s for s in lines if " dev " in s} and "cola dev 1" not in lines
    assert lines.count("sst2 train 3") == (0 if "sst2 train 3" in held["sst2"] else 1)
    sst2_kept = [f"sst2 train {i}" for i in range(29) if f"sst2 train {i}" not in held["sst2"]]
    assert lines[:len(sst2_kept)] == sst2_kept  # all 30 rows, not only the 20-row subset
    mrpc = [s for s in lines if s.startswith("mrpc")]
    kept = [i for i in range(20) if pair(i, "mrpc", "train")[0] not in held["mrpc"]]
    assert mrpc == [s for i in kept for s in pair(i, "mrpc", "train")]  # two lines a pair
    assert info["per_task"]["mrpc"] == {"#1 String": 18, "#2 String": 18}
    assert info["per_task"]["wnli"] == {"sentence1": 20, "sentence2": 20}  # none held out
    assert info["left_out"]["dev"] == 1 and info["lines"] == len(lines)
    assert info["left_out"]["duplicate"] == (0 if "sst2 train 3" in held["sst2"] else 1)
    corpus.write_corpus(tmp_path / "b", glue)
    assert (tmp_path / "a" / "corpus.txt").read_bytes() == (tmp_path / "b" / "corpus.txt"
                                                            ).read_bytes()
