#!/usr/bin/env python
"""LRC-BERT on real GLUE (issue 30): every run of the table, resumable across sessions, and the
table itself.

    python benchmarks/lrc_glue.py plan                       # the runs, their state, CPU hours
    python benchmarks/lrc_glue.py run [--workers 2] [--phase PHASE]     # PHASES, in order
    python benchmarks/lrc_glue.py run --phase PHASE --workers 1 --no-wait  # one of two drivers
    python benchmarks/lrc_glue.py table                      # results/lrc_glue_runs.json + table
    python benchmarks/lrc_glue.py speed                      # teacher vs student inference
    python benchmarks/lrc_glue.py targets                    # how soft the teachers' targets are
    python benchmarks/lrc_glue.py corpus                     # ROOT/general/corpus.txt (issue 51)

Runs live in ``--root`` (default ``runs/lrc_glue``, outside git); each is a run folder of
``recipes/bert_finetune.py`` or ``recipes/lrc_bert.py`` started with ``--resume auto``, so a
killed driver loses at most one checkpoint interval: start ``run`` again. A run is done when its
``run_state.json`` says completed and this script's ``dev.json`` exists; its resume checkpoints
are then deleted (``model/`` stays) and its record (scores, times, the CPU, the date, for a
student its teacher's dev score; since issue 51 also its final step, the git commit, the recipe
digest key and the variant's meaning: records made before lack these four) is written to the
ledger, ``results/lrc_glue_runs.json`` (``--ledger``), which git keeps. The run folders do not outlive a machine, the ledger does: a
student recorded there is done on any machine; a teacher is done only where its model is (the
students need it), so a fresh machine trains the teachers again and the ledger keeps the earlier
teachers' records beside the new one. ``touch ROOT/no-new-runs`` lets the running runs finish
and starts no other (a session's end kills a half-done run, and a fresh machine loses it).

The design (the issue's phase 1, at CPU scale):
- data: MRPC and CoLA whole, SST-2 a stratified 10,000 of its training rows; from each training
  set 10 % held out (stratified, data seed 0) to choose learning rates on; dev sets whole and
  only reported (``benchmarks/glue_floors.py: split_sizes``). Every run trains on the same kept
  rows; the engine scores the held-out rows at the end (``--eval-on held_out``) and this script
  scores the saved model on dev (``dev.json``).
- teacher: all-MiniLM-L6-v2 fine-tuned per task, 3 epochs, batch 32, lr 5e-5 (chosen on MRPC's
  held-out rows among 2e-5 / 5e-5 / 1e-4: results/lrc_glue.md), BERT's optimiser.
- student: the paper's 4 x 312 (12 heads, FFN 1200), the teacher's vocabulary, random init,
  batch 16, ``STUDENT_EPOCHS`` epochs, the uniform layer map of the code (student layer i ->
  teacher layer 6 * i / 4 rounded as ``contrastive.methods.distill_parts`` maps it).
  Variants (``VARIANTS``, named by meaning, ``VARIANT_MEANING``): (1) ``ce`` cross-entropy
  only; (2) ``kd`` soft + hard loss at the paper's t 1.1 (0:1:1 throughout); (4) ``lrc`` the
  paper's loss and schedule (COS-NCE, 80 % of the steps 1:0:0 then 1:1:3, perturbation) but
  not its budget (3 epochs here, the paper's 90 / 18); (4b) ``lrc_np`` the same without
  perturbation.
  Learning rates from the paper's grid {5e-5, 1e-4, 3e-4} chosen on the held-out rows at seed 0
  for ``ce`` (which ``kd`` uses) and ``lrc`` (which ``lrc_np`` uses); seeds 0, 1, 2.
- why (diagnostics, SST-2 and CoLA, seed 0, lr 1e-4): LRC-BERT with and without perturbation
  with the paper's 1:1:3 from the first step (``--no-two-stage``): does the two-stage schedule
  starve the prediction layer at this budget? (The slow check's (4b) predicted one class, and
  so did CoLA's two-stage LRC-BERT at 5e-5 and 1e-4.)
- control (distillation known to help, DistilBERT-style): a 3 x 384 student initialised from
  the pretrained MiniLM's layers 2, 4, 6 (``--student hf:MiniLM --keep-layers 1,3,5``), trained
  with ``ce`` and with ``kd`` at lr 5e-5 (the teacher's), seeds 0, 1, 2.
- lr-pre, main-pre (issue 51, step 2: the paper's claim is about a student that already knows
  language): the pretrained student, a 4 x 384 from the MiniLM's layers 1, 2, 4, 5 (0-based:
  the teacher's layers 2, 3, 5, 6, the uniform map's targets; ``STARTS["pre"]``), through the
  lr search and the main phase's design: runs ``pre-TASK-VARIANT-lrLR-sSEED``, records whose
  ``meaning`` names the start, its own section of the table. Like the control it steps with
  the engine's fused kernel (a family of its own: its variants compared with each other).
- abl (issue 51, step 3: the paper's Table 3): which of LRC-BERT's parts matter here. The
  random-init student on MRPC and SST-2 (where students learn), seeds 0-2, at ``lrc``'s chosen
  lr, without COS-NCE (``lrc_no_cosnce``: one stage at 0:1:3; two stages would still train
  COS-NCE for 80 % of the steps), without the soft loss (two stages, then 1:0:3), without the
  hard loss (then 1:1:0), without the two stages (``lrc_1stage``, 1:1:3 throughout); each
  paired by seed with the full ``lrc``.
- teachers2, lr2, main2, lr2-pre, main2-pre (step 4): RTE and STS-B (``TASKS2``; STS-B is
  regression: GLUE's mean of Pearson and Spearman, MSE hard and soft losses) through the
  teachers', the search's and the main runs' design, random and pretrained students, variants
  ``ce``, ``kd``, ``lrc`` (the issue's three). Phases of their own, so the phases above keep
  their plans; the same split rule (10 % held out, data seed 0; STS-B's held-out rows drawn
  stratified by score quintile).
- bertm (step 4): the article's BERT_M, MSE in place of COS-NCE between the layers
  (``lrc_mse``, ``--layer-loss mse``), random init, MRPC, CoLA, SST-2, seeds 0-2, at ``lrc``'s
  chosen lr: is the contrastive loss what helps, or any layer-matching loss?
- general, main-gen (step 5, the paper's LRC-BERT condition at CPU scale): ``general-e1``
  distils the un-fine-tuned MiniLM into a 4 x 312 with COS-NCE alone for one epoch of the pooled
  GLUE training sentences (``corpus``: ``glue_corpus.py``; ``recipes/lrc_bert_pretrain.py``),
  then ``main-gen`` distils that student on each task as ``lrc`` (MRPC, CoLA, SST-2, seeds 0-2,
  at the random init's chosen lr: the same architecture, no new search). The random-init
  ``lrc`` runs are the paper's LRC-BERT1 condition; the table pairs the two by seed. The
  general run has no task and no dev score: its record holds its training figures and the
  corpus's sha256; like a teacher it is done only where its model is.
- abl-pre (step 3, after abl): the four ablations with the pretrained student, at
  ``pre-lrc``'s lr, on MRPC (where its COS-NCE stage lifted it above KD: which part does it?)
  and CoLA (the article's second ablation task; random-init students sit at its floor here,
  and so do they on MRPC).
- budget (step 6): does a longer budget change the answer? Cross-entropy and LRC-BERT on MRPC
  and RTE, 10 epochs, seed 0, from the start that learned best on the task (once every start
  of the task, gen only on MRPC, CoLA, SST-2, has all three seeds of ``lrc`` recorded, the
  highest mean held-out score; ties: random, pre, gen in that order; kept once a budget run of
  the task is recorded), at that start's chosen
  lrs; shown beside the same start's 3-epoch runs. 30 epochs only where a run fits on one
  machine: time a 3-epoch run (``plan``'s estimate) and multiply by 10; not run by default.
``plan`` estimates each run's CPU hours from the ledger: the median recorded training seconds
per kept training row and epoch of the run's family (teachers, a start) on its task, else on
any task (RTE's long premises make that a low guess), times its rows and epochs; "unknown"
where nothing comparable is recorded (the general run).
Every run: fp32 (``--mixed-precision no``: the same figures on every CPU kind, so the work can
span sessions on machines of either kind), 1 thread per run, ``--workers`` runs at once.

The table (``table``): per variant the dev mean, the share of the teacher retained and the
share of the teacher's margin over the majority class closed (``margin_share``: "% retained"
is dominated by the floors where the majority class scores high); per pair of variants the
seed-by-seed differences with a 95 % t-interval of their mean (``t_interval``, df = n - 1).
Only runs whose recipe digest keys agree are summarised or paired (``recipe_digest``; records
older than issue 51 have none and count as ``UNKEYED_DIGEST``, the key of the code that
trained them, checked bit for bit: see there).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from glue_corpus import write_corpus  # noqa: E402
from glue_floors import ALL_TASKS, TASKS, TASKS2, task_splits, train_size  # noqa: E402
from glue_floors import split_sizes as _split_sizes  # noqa: E402
from run_ledger import (  # noqa: E402
    DIGESTS,  # noqa: F401 (the digest keys' file, read by the tests)
    HELD,
    NO_NEW_RUNS,
    claim,  # noqa: F401 (the tests take a run's lock through the driver)
    exclusive,
    final_step,
    git_commit,
    prune_checkpoints,
    recipe_digest,
    run_timed,
    trained,
    update_json,
)

split_sizes = functools.lru_cache(_split_sizes)  # reads a training file: once per task
SHARED = ROOT.parent / "shared" / "data"
MINILM = SHARED / "text-models" / "all-MiniLM-L6-v2"
GLUE = SHARED / "glue"
SEEDS = (0, 1, 2)
LR_GRID = (5e-5, 1e-4, 3e-4)  # the paper's grid (issue 30)
TEACHER_LR, TEACHER_EPOCHS, STUDENT_EPOCHS = 5e-5, 3, 3
CONTROL_LR = 5e-5
VARIANTS: dict[str, tuple[str, ...]] = {  # lrc_bert.py flags of each variant
    "ce": ("--no-two-stage", "--no-perturb", "--stage2-weights", "0", "0", "1"),
    "kd": ("--no-two-stage", "--no-perturb", "--stage2-weights", "0", "1", "1"),
    "lrc": (),
    "lrc_np": ("--no-perturb",),
    # diagnostics (phase "why"): the paper's losses from the first step (1:1:3 throughout)
    "lrc_1stage": ("--no-two-stage",),
    "lrc_np_1stage": ("--no-two-stage", "--no-perturb"),
    # ablations (phase "abl", the paper's Table 3; lrc_1stage above is the fourth)
    "lrc_no_cosnce": ("--no-two-stage", "--stage2-weights", "0", "1", "3"),
    "lrc_no_soft": ("--stage2-weights", "1", "0", "3"),
    "lrc_no_hard": ("--stage2-weights", "1", "1", "0"),
    "lrc_mse": ("--layer-loss", "mse"),  # BERT_M (phase "bertm")
}
MAIN_VARIANTS = ("ce", "kd", "lrc", "lrc_np")
ABL_VARIANTS = ("lrc_no_cosnce", "lrc_no_soft", "lrc_no_hard", "lrc_1stage")
ABL_TASKS, ABL_PRE_TASKS = ("mrpc", "sst2"), ("mrpc", "cola")
TASK2_VARIANTS = ("ce", "kd", "lrc")  # RTE and STS-B: the issue names three
GENERAL = "general-e1"  # the pre-training distillation's run (phase "general")
# The digest key of the ledger's records made before issue 51 (none recorded): lrc_bert's key
# since the digests' first baseline (7c1d72e, before this script). Checked 2026-11-30 on the
# Intel AVX-512 kind: recipe_digests.py's bert_finetune then lrc_bert with
# --fused-optimizer false (the loop those runs stepped with) gives bit-identical digests at
# 5522e28 and 2ab0a4f (2026-11-27, the first runs), 564e000 (the fused kernel became the
# default) and 457cac0 (2026-11-28, the last of them) as at 1f1e284 (the ablations'); the digest
# does move with --no-perturb or other stage-2 weights, so the check would see a change there.
UNKEYED_DIGEST = "ad82beb84b20e7ad"
BUDGET_TASKS, BUDGET_VARIANTS, BUDGET_EPOCHS = ("mrpc", "rte"), ("ce", "lrc"), 10
BUDGET_STARTS = ("random", "pre", "gen")  # the candidates, in tie order
# SST-2 first (the slow check's collapse); CoLA added once its search showed LRC-BERT at one
# class at 5e-5 and 1e-4 while SST-2's two-stage run at 1e-4 trained its classifier
WHY_VARIANTS, WHY_TASKS, WHY_LR = ("lrc_1stage", "lrc_np_1stage"), ("sst2", "cola"), 1e-4
# the 2 x 2 at WHY_LR, seed 0: (two stages | one) x (perturbation | none); lrc at WHY_LR is an
# lr-search run, lrc_np at WHY_LR was added once CoLA's one-stage runs split by perturbation
WHY_GRID = {("two", "perturb"): "lrc", ("two", "none"): "lrc_np",
            ("one", "perturb"): "lrc_1stage", ("one", "none"): "lrc_np_1stage"}
LR_FROM = {"ce": "ce", "kd": "ce", "lrc": "lrc", "lrc_np": "lrc",  # whose chosen lr a variant uses
           **dict.fromkeys((*ABL_VARIANTS, "lrc_mse"), "lrc")}
VARIANT_MEANING = {  # what each variant trains, written into its records (flags may be renamed)
    "ce": "cross-entropy only (0:0:1 throughout, no perturbation)",
    "kd": "KD: soft + hard loss at t 1.1 (0:1:1 throughout, no perturbation)",
    "lrc": "LRC-BERT: COS-NCE, 80 % of the steps 1:0:0 then 1:1:3, t 1.1, perturbation",
    "lrc_np": "LRC-BERT without the perturbation",
    "lrc_1stage": "LRC-BERT at 1:1:3 from the first step (no two stages), perturbation",
    "lrc_np_1stage": "LRC-BERT at 1:1:3 from the first step, no perturbation",
    "lrc_no_cosnce": "LRC-BERT without COS-NCE: 0:1:3 throughout (one stage), perturbation",
    "lrc_no_soft": "LRC-BERT without the soft loss: 80 % of the steps 1:0:0 then 1:0:3, "
                   "perturbation",
    "lrc_no_hard": "LRC-BERT without the hard loss: 80 % of the steps 1:0:0 then 1:1:0, "
                   "perturbation",
    "lrc_mse": "BERT_M: LRC-BERT with MSE in place of COS-NCE between the layers, 80 % of the "
               "steps 1:0:0 then 1:1:3, perturbation",
}
GENERAL_MEANING = ("pre-training distillation: COS-NCE alone from the un-fine-tuned MiniLM into "
                   "the 4 x 312 on the pooled GLUE training sentences (no held-out or dev "
                   "sentence), 1 epoch, batch 16, lr 1e-4 (issue 51)")
CONTROL_STUDENT = ("--student", f"hf:{MINILM}", "--keep-layers", "1,3,5")
PRE_STUDENT = ("--student", f"hf:{MINILM}", "--keep-layers", "1,2,4,5")
GEN_STUDENT = ("--student", "hf:{root}/" + GENERAL + "/model")  # {root}: the driver's --root


@dataclass(frozen=True)
class Start:
    """A family of students by their initialisation: its run names' prefix, the student flags
    (``{root}`` stands for the driver's root), whether it steps with the engine's fused AdamW
    kernel, the words a record's ``meaning`` adds, its phases (lr search, runs at the chosen
    lr), the variants it runs, and the family whose search chooses its lrs (its own when
    None)."""

    prefix: str
    flags: tuple[str, ...]
    fused: bool
    meaning: str
    search_phase: str | None
    main_phase: str
    variants: tuple[str, ...]
    lrs_of: str | None = None

    def student_flags(self, root: Path) -> tuple[str, ...]:
        return tuple(f.replace("{root}", str(root)) for f in self.flags)


STARTS = {  # "random" is issue 30's design; its records' meanings predate the others
    "random": Start("student", (), False, "", "lr", "main", MAIN_VARIANTS),
    "control": Start("control", CONTROL_STUDENT, True, "", None, "control", ("ce", "kd")),
    "pre": Start("pre", PRE_STUDENT, True, "; student from the pretrained MiniLM's layers 1, 2, "
                 "4, 5 (4 x 384, issue 51)", "lr-pre", "main-pre", MAIN_VARIANTS),
    "gen": Start("gen", GEN_STUDENT, True, "; student from pre-training distillation (COS-NCE "
                 "from the un-fine-tuned MiniLM on the pooled GLUE training sentences, 1 epoch, "
                 "issue 51)", None, "main-gen", ("lrc",), lrs_of="random"),
}
SECOND_PHASES = {"random": ("lr2", "main2"), "pre": ("lr2-pre", "main2-pre")}  # TASKS2's
PHASES = ("teachers", "lr", "why", "main", "control", "lr-pre", "main-pre", "abl", "abl-pre",
          "teachers2", "lr2", "main2", "lr2-pre", "main2-pre", "general", "bertm", "main-gen",
          "budget")  # in run order (general before bertm: one driver's long run beside the other's)
LOCAL_PHASES = ("teachers", "teachers2", "general")  # runs whose model other runs load
# the paper's Table 1 (GLUE test server, x 100): its teacher, LRC-BERT1, LRC-BERT
PAPER = {"sst2": (93.6, 90.7, 92.9), "mrpc": (88.0, 83.0, 87.0), "cola": (53.0, 31.6, 46.5),
         "rte": (66.4, 51.0, 63.1), "stsb": (84.8, 79.8, 81.2)}
# its Table 3 (dev, x 100), MRPC / CoLA: the full method and each ablation
PAPER_ABLATIONS = {"lrc": (89.0, 50.0), "lrc_no_cosnce": (81.5, 37.0),
                   "lrc_no_soft": (89.4, 48.8), "lrc_no_hard": (88.7, 48.6)}
FLOORS = ROOT / "benchmarks" / "results" / "glue_floors.json"
_DEFAULT_LEDGER = ROOT / "benchmarks" / "results" / "lrc_glue_runs.json"
LEDGER = _DEFAULT_LEDGER  # main() sets it from --ledger


@dataclass
class Run:
    """One run folder: its recipe and flags (``--output-dir`` and ``--resume`` added)."""

    name: str
    recipe: str
    args: tuple[str, ...]
    phase: str
    meta: dict[str, Any] = field(default_factory=dict)

    def folder(self, root: Path) -> Path:
        return root / self.name

    @property
    def local(self) -> bool:
        """Other runs load its model (a teacher, the general run): done only where it is."""
        return self.phase in LOCAL_PHASES

    def done(self, root: Path) -> bool:
        """A student recorded in the ledger (done on any machine), a teacher or the general run
        finished here (the students load its model). A student finished here but not recorded
        (its driver stopped between the two) is not done: the next call records it, training
        nothing."""
        return self.finished_here(root) if self.local else self.name in recorded()

    def finished_here(self, root: Path) -> bool:
        """Trained here, and scored on dev (a run without a task has no dev score)."""
        return trained(self.folder(root)) and ("task" not in self.meta
                                                or (self.folder(root) / "dev.json").is_file())


_READ: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}  # the ledger last read


def recorded() -> dict[str, dict[str, Any]]:
    """The ledger's run records (name -> record), empty when there is no ledger yet; read
    again only when the file changed (a plan asks for it hundreds of times). Not to be
    changed: ``update_ledger`` changes the ledger."""
    if not LEDGER.is_file():
        return {}
    st = LEDGER.stat()
    key = (str(LEDGER), st.st_mtime_ns, st.st_size)
    if key not in _READ:
        _READ.clear()
        _READ[key] = json.loads(LEDGER.read_text()).get("runs", {})
    return _READ[key]


def trained_by(times: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``commit`` whose code trained a run: each training process's (``timing.json``
    holds it from the moment it started, not the checkout's when the run is recorded: a driver
    may outlive a checkout), the last one's; ``commits`` lists them all when a resumed run's
    processes ran different ones. Timings from before commits were kept: the checkout's now."""
    commits = list(dict.fromkeys(t["commit"] for t in times if "commit" in t))
    if not commits:
        return {"commit": git_commit()}
    return {"commit": commits[-1], **({"commits": commits} if len(commits) > 1 else {})}


def record(run: Run, root: Path) -> dict[str, Any]:
    """Write a run finished here into the ledger (under a file lock: two drivers write it); a
    teacher trained again keeps its earlier records (with the students they taught) under
    ``earlier``. Returns the record."""
    from contrastive.hardware import cpu_kind_line

    f = run.folder(root)
    times = json.loads((f / "timing.json").read_text()) if (f / "timing.json").is_file() else []
    scores = ({"dev": json.loads((f / "dev.json").read_text()),
               "held_out": held_out_score(run, root)} if "task" in run.meta else
              {"corpus_sha256": json.loads(corpus_path(root).with_suffix(".json").read_text())[
                  "sha256"] if corpus_path(root).with_suffix(".json").is_file() else None})
    rec: dict[str, Any] = {**run.meta, **scores,
                           "cpu_s": sum(t["cpu_s"] for t in times),
                           "wall_s": sum(t["wall_s"] for t in times),
                           "train_s": train_seconds(f), "train_end": training_end(f),
                           "cpu": cpu_kind_line(), "date": time.strftime("%Y-%m-%d"),
                           "final_step": final_step(f), **trained_by(times),
                           "digest": recipe_digest(run.recipe)}
    if "variant" in run.meta:
        epochs = run.meta.get("epochs", STUDENT_EPOCHS)
        rec["meaning"] = (VARIANT_MEANING[run.meta["variant"]] + STARTS[run.meta["start"]].meaning
                          + (f"; {epochs} epochs" if epochs != STUDENT_EPOCHS else ""))
    if "task" not in run.meta:
        rec["train_last"] = last_window(f)
    elif not run.local:
        teacher = teacher_run(run.meta["task"]).folder(root)
        rec["teacher_dev"] = (json.loads((teacher / "dev.json").read_text())["score"]
                              if (teacher / "dev.json").is_file() else None)
        rec["teacher_sha256"] = weights_sha256(teacher / "model")
    if run.local:
        rec["weights_sha256"] = weights_sha256(f / "model")
    if run.meta.get("start") == "gen":
        rec["start_sha256"] = weights_sha256(root / GENERAL / "model")

    def add(data: dict[str, Any]) -> None:
        old = data["runs"].get(run.name) or {}
        if old and run.local and old.get("dev") == rec.get("dev") and "task" in run.meta:
            # trained again with the same result: the record stays, the rerun is noted
            rerun = {k: rec[k] for k in ("held_out", "cpu_s", "wall_s", "train_s", "cpu",
                                         "date", "weights_sha256")}
            # the same rerun recorded before its weights were hashed: replaced by this one
            kept = [r for r in old.get("reruns", []) if r.get("weights_sha256") is not None
                    or not _same_run(r, {k: v for k, v in rerun.items() if k != "weights_sha256"})]
            if rerun not in kept and not _same_run(old, rerun):
                old["reruns"] = [*kept, rerun]
            return
        if old and "task" not in run.meta and _same_run(old, {
                k: rec[k] for k in ("cpu_s", "wall_s", "train_s", "cpu", "final_step",
                                    "train_last")}):
            return  # this training recorded already
        earlier = old.pop("earlier", [])
        if old and run.local:
            earlier.append(old)
        if earlier:
            rec["earlier"] = earlier
        data["runs"][run.name] = rec

    update_ledger(add)
    return rec


def weights_sha256(model_dir: Path) -> str | None:
    """sha256 of a saved model's tensors (``model.safetensors``: names in sorted order, each
    name, dtype, shape and bytes), None where there is none. A teacher or the general student
    is trained again on every machine: equal hashes say the runs that learned from it on
    different machines learned from the same weights (whether fp32 training reproduces them
    across CPU kinds is what the hashes will show); the file's header may differ, the hash
    reads the tensors only."""
    import hashlib

    import torch
    from safetensors import safe_open

    path = model_dir / "model.safetensors"
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with safe_open(str(path), framework="pt") as weights:
        for name in sorted(weights.keys()):
            tensor = weights.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def update_ledger(change: Callable[[dict[str, Any]], None]) -> None:
    """Read, change and replace the ledger under a file lock (drivers and ``table`` write it)."""
    update_json(LEDGER, change, {"tasks": {}, "runs": {}})


def _same_run(rec: dict[str, Any], rerun: dict[str, Any]) -> bool:
    """``rerun`` is ``rec`` itself recorded again (the same machine, day and times)."""
    return all(rec.get(k) == v for k, v in rerun.items())


def _split_flags(task: str, *, fused: bool = False) -> tuple[str, ...]:
    """The data and run flags every run of ``task`` shares. ``fused=False`` steps with torch's
    per-parameter AdamW loop, as the teachers and the main phase's first runs did (they predate
    the engine's fused default): one optimiser implementation across the variants compared.
    The control, a family of its own, takes the engine's default fused kernel (1.52x faster a
    step for its 3 x 384 student on CoLA, AVX2, 1 thread: results/lrc_glue.md)."""
    rows, held = split_sizes(task, GLUE)
    flags = ("--task", task, "--glue-dir", str(GLUE), "--held-out", str(held),
             "--eval-on", "held_out", "--steps", "0", "--mixed-precision", "no",
             "--progress", "false", "--data-seed", "0")
    kernel = () if fused else ("--fused-optimizer", "false")
    return flags + kernel + (("--train-rows", str(rows)) if rows else ())


def teacher_run(task: str) -> Run:
    return Run(f"teacher-{task}", "bert_finetune.py",
               (*_split_flags(task), "--model", f"hf:{MINILM}", "--epochs", str(TEACHER_EPOCHS),
                "--lr", str(TEACHER_LR), "--seed", "0"),
               "teachers" if task in TASKS else "teachers2", {"task": task})


def student_run(task: str, variant: str, lr: float, seed: int, root: Path, *,
                start: str = "random", phase: str = "main", epochs: int = STUDENT_EPOCHS) -> Run:
    """A student of family ``start`` (``STARTS``) distilled from ``task``'s teacher; another
    number of ``epochs`` than the study's is a budget run (its own name)."""
    s = STARTS[start]
    name = (f"{s.prefix}-{task}-{variant}-lr{lr:g}-s{seed}" if epochs == STUDENT_EPOCHS else
            f"budget-{task}-{variant}-{start}-e{epochs}-s{seed}")
    meta = {"task": task, "variant": variant, "lr": lr, "seed": seed, "start": start}
    return Run(name, "lrc_bert.py",
               (*_split_flags(task, fused=s.fused), "--teacher",
                str(teacher_run(task).folder(root) / "model"), *s.student_flags(root),
                *VARIANTS[variant], "--epochs", str(epochs), "--lr", f"{lr:g}", "--seed",
                str(seed)), phase,
               meta if epochs == STUDENT_EPOCHS else {**meta, "epochs": epochs})


def corpus_path(root: Path) -> Path:
    """The pre-training distillation's sentences (``corpus``: ``glue_corpus.write_corpus``)."""
    return root / "general" / "corpus.txt"


def general_run(root: Path) -> Run:
    """The pre-training distillation (issue 51, step 5): COS-NCE from the un-fine-tuned MiniLM
    into the paper's 4 x 312 (the recipe's default student), one epoch of the corpus; its
    ``model/`` is the ``gen`` family's start."""
    return Run(GENERAL, "lrc_bert_pretrain.py",
               ("--teacher", f"hf:{MINILM}", "--data", str(corpus_path(root)), "--epochs", "1",
                "--steps", "0", "--batch-size", "16", "--lr", "1e-4", "--max-length", "128",
                "--eval", "none", "--mixed-precision", "no", "--progress", "false", "--seed",
                "0"), "general", {"meaning": GENERAL_MEANING})


def held_out_score(run: Run, root: Path) -> float | None:
    """The run's held-out score: from its folder when it trained here, else from the ledger
    (None for a run without a task)."""
    f = run.folder(root) / "results.json"
    if "task" not in run.meta:
        return None
    if not trained(run.folder(root)):
        rec = recorded().get(run.name)
        return None if rec is None or run.local else rec["held_out"]
    return float(json.loads(f.read_text())["held_out"]["glue_score"])


def chosen_lr(task: str, variant: str, root: Path, start: str = "random") -> float | None:
    """The grid's lr with the best held-out score at seed 0 among the search runs of family
    ``start`` (or of the family it takes its lrs from; ties: the smaller lr), or None while a
    search run is missing."""
    family = STARTS[start].lrs_of or start
    base, phase = LR_FROM[variant], STARTS[family].search_phase
    assert phase is not None, f"{start} has no lr search"
    scores = {lr: held_out_score(student_run(task, base, lr, 0, root, start=family, phase=phase),
                                 root) for lr in LR_GRID}
    if any(s is None for s in scores.values()):
        return None
    return max(LR_GRID, key=lambda lr: (scores[lr], -lr))


def family_lr(task: str, variant: str, root: Path, start: str) -> float | None:
    """The lr of family ``start``'s runs of ``variant``: the control's fixed one, the ``why``
    diagnostics' (random init), else the one its search chose (None while it runs, and for a
    variant the family does not run; on ``TASKS2`` only the random and pretrained starts'
    ``TASK2_VARIANTS``)."""
    if task in TASKS2:
        return (chosen_lr(task, variant, root, start) if start in SECOND_PHASES
                and variant in TASK2_VARIANTS else None)
    if start == "control":
        return CONTROL_LR if variant in STARTS[start].variants else None
    if start == "random" and variant in WHY_VARIANTS:
        return WHY_LR
    return chosen_lr(task, variant, root, start) if variant in STARTS[start].variants else None


def searched_family(root: Path, start: str, tasks: tuple[str, ...] = tuple(TASKS),
                    second: bool = False) -> tuple[list[Run], list[Run]]:
    """Family ``start``'s lr search (``ce`` and ``lrc`` over the grid, seed 0) and its main
    runs at the chosen lrs, every seed (those of a task whose search is unfinished are
    missing); ``second``: ``TASKS2``'s phases and variants (``SECOND_PHASES``)."""
    s = STARTS[start]
    assert s.search_phase is not None, f"{start} has no lr search"
    search_phase, main_phase = SECOND_PHASES[start] if second else (s.search_phase, s.main_phase)
    search = [student_run(t, v, lr, 0, root, start=start, phase=search_phase) for t in tasks
              for v in ("ce", "lrc") for lr in LR_GRID]
    return search, at_chosen_lr(root, start, tasks, TASK2_VARIANTS if second else s.variants,
                                main_phase)


def at_chosen_lr(root: Path, start: str, tasks: tuple[str, ...], variants: tuple[str, ...],
                 phase: str) -> list[Run]:
    """Family ``start``'s runs of ``variants`` on ``tasks`` at their chosen lrs, every seed (a
    task whose lr is not chosen yet is missing)."""
    runs = []
    for seed in SEEDS:
        for t in tasks:
            for v in variants:
                lr = chosen_lr(t, v, root, start)
                if lr is not None:
                    runs.append(student_run(t, v, lr, seed, root, start=start, phase=phase))
    return runs


def budget_start(task: str, root: Path) -> tuple[str, str] | None:
    """The start the budget runs of ``task`` take, and why: the one a recorded budget run of
    the task took, else, once every start that runs the task (gen only on ``TASKS``) has all
    three seeds of ``lrc`` scored, the one with the highest mean held-out score (ties:
    ``BUDGET_STARTS``' order); None before (a choice among some starts would be premature)."""
    for name, rec in recorded().items():
        if name.startswith(f"budget-{task}-") and "budget_start" in rec:
            return rec["budget_start"], rec["budget_why"]
    means: dict[str, float] = {}
    for start in BUDGET_STARTS:
        lr = chosen_lr(task, "lrc", root, start) if start != "gen" or task in TASKS else None
        scores = [] if lr is None else [held_out_score(student_run(task, "lrc", lr, s, root,
                                                                   start=start), root)
                                        for s in SEEDS]
        if scores and all(x is not None for x in scores):
            means[start] = statistics.fmean(x for x in scores if x is not None)
    applicable = [st for st in BUDGET_STARTS if st != "gen" or task in TASKS]
    if not means or any(st not in means for st in applicable):
        return None
    best = max(means, key=lambda st: (means[st], -BUDGET_STARTS.index(st)))
    return best, ("the highest mean held-out score of lrc over seeds 0-2 among the starts: "
                  + ", ".join(f"{st} {100 * m:.2f}" for st, m in means.items()))


def budget_runs(root: Path) -> list[Run]:
    """Cross-entropy and LRC-BERT at ``BUDGET_EPOCHS`` epochs, seed 0, on ``BUDGET_TASKS``, from
    each task's :func:`budget_start` at that start's chosen lrs (none before the choice)."""
    runs = []
    for task in BUDGET_TASKS:
        choice = budget_start(task, root)
        if choice is None:
            continue
        for v in BUDGET_VARIANTS:
            lr = chosen_lr(task, v, root, choice[0])
            if lr is not None:
                run = student_run(task, v, lr, 0, root, start=choice[0], phase="budget",
                                  epochs=BUDGET_EPOCHS)
                run.meta.update(budget_start=choice[0], budget_why=choice[1])
                runs.append(run)
    return runs


def plan(root: Path) -> list[Run]:
    """Every run, in the order they should go (later phases need earlier ones)."""
    search, main = searched_family(root, "random")
    runs = [teacher_run(t) for t in TASKS] + search
    runs += [student_run(t, v, WHY_LR, 0, root, phase="why") for t in WHY_TASKS
             for v in (*WHY_VARIANTS, "lrc_np")]
    runs += main
    runs += [student_run(t, v, CONTROL_LR, s, root, start="control", phase="control")
             for s in SEEDS for t in TASKS for v in STARTS["control"].variants]
    runs += [r for family in searched_family(root, "pre") for r in family]
    # issue 51, steps 3-6: new phases only add runs (the ones above keep their names and flags)
    runs += at_chosen_lr(root, "random", ABL_TASKS, ABL_VARIANTS, "abl")
    runs += [teacher_run(t) for t in TASKS2]
    for start in ("random", "pre"):
        runs += [r for family in searched_family(root, start, tuple(TASKS2), True)
                 for r in family]
    runs += at_chosen_lr(root, "random", tuple(TASKS), ("lrc_mse",), "bertm")
    runs += [general_run(root)]
    runs += at_chosen_lr(root, "gen", tuple(TASKS), STARTS["gen"].variants, "main-gen")
    runs += at_chosen_lr(root, "pre", ABL_PRE_TASKS, ABL_VARIANTS, "abl-pre")
    runs += budget_runs(root)
    unique: dict[str, Run] = {}
    for r in runs:  # an lr-search run at the chosen lr is also seed 0's main run
        unique.setdefault(r.name, r)
    return list(unique.values())


@functools.lru_cache
def kept_rows(task: str) -> int:
    """The training rows a run of ``task`` trains on (its held-out rows left out)."""
    return train_size(task, GLUE) - split_sizes(task, GLUE)[1]


def _cost_key(name: str, meta: dict[str, Any]) -> tuple[str, str, str]:
    """(model family, loss family, task) of a run for the CPU estimate: the run name's prefix
    (a budget run's start; ``gen``: the random init's 4 x 312), cross-entropy-like (ce, kd: no
    COS-NCE) or LRC-BERT-like, and its task."""
    prefix = STARTS[meta["start"]].prefix if name.startswith("budget-") else name.split("-")[0]
    loss = "teacher" if "variant" not in meta else "ce" if meta["variant"] in ("ce", "kd") else "lrc"
    return {"gen": "student"}.get(prefix, prefix), loss, meta["task"]


def cost_rates() -> dict[tuple[str, ...], float]:
    """Median recorded training seconds per kept training row and epoch (the ledger's
    ``train_s``, 1 thread) by :func:`_cost_key` and by its first two parts (any task)."""
    groups: dict[tuple[str, ...], list[float]] = {}
    for name, rec in recorded().items():
        if rec.get("train_s") and "task" in rec:
            key = _cost_key(name, rec)
            epochs = rec.get("epochs", TEACHER_EPOCHS if key[1] == "teacher" else STUDENT_EPOCHS)
            rate = rec["train_s"] / (kept_rows(rec["task"]) * epochs)
            for k in (key, key[:2]):
                groups.setdefault(k, []).append(rate)
    return {k: statistics.median(v) for k, v in groups.items()}


def cpu_hours(run: Run, rates: dict[tuple[str, ...], float]) -> float | None:
    """``run``'s estimated training hours on one thread (:func:`cost_rates` x its rows and
    epochs; the rate of its task when recorded, else of any task), None when unknown."""
    if "task" not in run.meta:
        return None
    key = _cost_key(run.name, run.meta)
    rate = rates.get(key) or rates.get(key[:2])
    epochs = int(run.args[run.args.index("--epochs") + 1])
    return None if rate is None else rate * kept_rows(run.meta["task"]) * epochs / 3600


def print_plan(root: Path) -> None:
    """Each run's state, phase, name and (to do) estimated hours; then each phase's total."""
    rates = cost_rates()
    totals: dict[str, tuple[int, float, int]] = {}
    for r in plan(root):
        done = r.done(root)
        hours = None if done else cpu_hours(r, rates)
        todo, known, unknown = totals.get(r.phase, (0, 0.0, 0))
        totals[r.phase] = (todo + (not done), known + (hours or 0.0),
                           unknown + (not done and hours is None))
        est = "" if done else "  unknown" if hours is None else f"  ~{hours:.2f} h"
        print(f"{'done' if done else 'todo'}  {r.phase:8s} {r.name}{est}")
    for phase in PHASES:
        todo, known, unknown = totals.get(phase, (0, 0.0, 0))
        print(f"phase {phase}: {todo} runs to do, ~{known:.1f} h"
              + (f" + {unknown} unknown" if unknown else "")
              + ("" if phase in totals else " (its runs appear once earlier phases chose)"))
    print("hours: training on 1 thread, from the ledger's median seconds per kept training row "
          "and epoch of the same family and loss (its task's, else any task's); unknown: "
          "nothing comparable recorded")


def score_on_dev(run: Run, root: Path) -> dict[str, float]:
    """The saved model of a finished run scored on the task's whole dev set (GLUE's metric)."""
    import torch

    from contrastive.data.text_tasks import load_task
    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.eval.classifier_folder import load_classifier
    from contrastive.eval.glue import evaluate

    task = run.meta["task"]
    rows, held = split_sizes(task, GLUE)
    dev = load_task(task, GLUE, train_rows=rows, held_out=held, seed=0).dev
    model_dir = run.folder(root) / "model"
    model, _ = load_classifier(model_dir)
    with torch.no_grad():
        return evaluate(model, dev, load_tokenizer(model_dir), task)


def execute(run: Run, root: Path, threads: int) -> dict[str, Any]:
    """Train (or resume) one run in a child process, then score it on dev; returns its timing,
    ``{"skipped": why}`` when its teacher is not trained yet or another driver holds it, or
    ``{"done": ...}`` when another driver finished it since this one made its plan."""
    if why := waits_for(run, root):
        return {"skipped": why}
    # the plan may be older than another driver's finish: then it is not scored again
    return exclusive(root, run.name, lambda: run.done(root), lambda: _execute(run, root, threads))


def guarded(run: Run, root: Path, threads: int) -> dict[str, Any]:
    """``execute``, with an error in it (a record or a score that fails) written to the run's
    log and returned as a failed run, so that the phase's other runs still go ahead."""
    try:
        return execute(run, root, threads)
    except Exception as error:  # noqa: BLE001 - one run's failure must not cancel the queue
        with (root / f"{run.name}.log").open("a") as log:
            log.write(traceback.format_exc())
        return {"rc": f"{type(error).__name__}: {error} (traceback in {run.name}.log)"}


def waits_for(run: Run, root: Path) -> str | None:
    """Why ``run`` cannot start yet: a run folder of this root whose model it loads (its
    teacher, the general run's student) is not trained here; None when it can."""
    for flag, what in (("--teacher", "its teacher"), ("--student", f"its student ({GENERAL})")):
        if flag in run.args:
            folder = Path(run.args[run.args.index(flag) + 1].removeprefix("hf:")).parent
            if folder.parent == root and not trained(folder):
                return f"{what} is not trained yet"
    return None


def _execute(run: Run, root: Path, threads: int) -> dict[str, Any]:
    folder = run.folder(root)
    if run.phase == "general" and not corpus_path(root).is_file():
        write_corpus(corpus_path(root).parent, GLUE)
    cmd = [sys.executable, str(ROOT / "recipes" / run.recipe), *run.args,
           "--output-dir", str(folder), "--resume", "auto"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    timing: dict[str, Any] = {}
    if not trained(folder):
        (folder / "dev.json").unlink(missing_ok=True)  # scored from an interrupted run's model
        commit = git_commit()  # the code the training process loads as it starts
        timing = {**run_timed(cmd, root / f"{run.name}.log", threads), "commit": commit}
        times = folder / "timing.json"
        old = json.loads(times.read_text()) if times.is_file() else []
        times.write_text(json.dumps(old + [timing], indent=1))
        if timing["rc"] != 0 or not trained(folder):
            return timing
        (root / "commands.txt").open("a").write(" ".join(cmd) + "\n")
    if "task" in run.meta:
        (folder / "dev.json").write_text(json.dumps(score_on_dev(run, root), indent=1))
    prune_checkpoints(folder)
    record(run, root)
    return timing


def run_phase(root: Path, phase: str | None, workers: int, threads: int,
              tasks: tuple[str, ...] = tuple(ALL_TASKS), wait_for_others: bool = True) -> None:
    """Run what is not done, phase by phase (a later phase's plan needs the earlier results),
    again while some runs were skipped (a teacher or another driver still busy), until every run
    is done or failed once (a failed run's log is ``ROOT/NAME.log``; the next call retries).
    ``tasks``: only these tasks' runs (a fresh machine then trains only their teachers; the
    general run, of no task, always). ``wait_for_others=False`` (``--no-wait``): a run another
    driver holds is left to it, so this driver goes on to the next phase at once instead of
    idling its core until that run ends; a later phase's runs that need it are then left to
    the other driver or a later call (a driver's last call should wait)."""
    phases = PHASES if phase is None else (phase,)
    failed: set[str] = set()
    said: dict[str, str] = {}  # what was last printed per phase / run: a waiting driver is quiet

    def say(key: str, text: str) -> None:
        if said.get(key) != text:
            said[key] = text
            print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    while True:
        skipped = progressed = 0
        for p in phases:
            todo = [r for r in plan(root) if r.phase == p and not r.done(root)
                    and ("task" not in r.meta or r.meta["task"] in tasks)
                    and r.name not in failed]
            say(p, f"phase {p}: {len(todo)} runs to do")
            with ThreadPoolExecutor(workers) as pool:
                for run, timing in zip(todo, pool.map(lambda r: guarded(r, root, threads), todo)):
                    say(run.name, f"{run.name}: {timing or 'scored'}")
                    if not wait_for_others and timing.get("skipped") == HELD:
                        continue  # left to the driver that holds it: neither a wait nor progress
                    skipped += "skipped" in timing
                    progressed += "skipped" not in timing
                    if timing.get("rc"):
                        failed.add(run.name)
        if not skipped or (root / NO_NEW_RUNS).exists():
            return
        if not progressed:
            time.sleep(60)


def encoder_flops(layers: int, hidden: int, intermediate: int, tokens: int) -> int:
    """Multiply-adds x 2 of a BERT encoder's forward over one sequence of ``tokens`` tokens:
    per layer the Q, K, V, output projections (4 d^2), the feed-forward (2 d f) per token, and
    the attention scores and their weighted sum (2 n d per token); embeddings are lookups."""
    per_token = 4 * hidden * hidden + 2 * hidden * intermediate + 2 * tokens * hidden
    return 2 * layers * tokens * per_token


def _summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "mean": statistics.fmean(values) if values else None,
            "min": min(values, default=None), "max": max(values, default=None),
            "values": values}


@functools.lru_cache
def label_prior(task: str) -> dict[str, float] | None:
    """The kept training rows' majority share and label entropy (nats): a classifier that
    predicts one class sits at this accuracy and this cross-entropy (None for a regression
    task, STS-B: no class to collapse to)."""
    import numpy as np

    labels = task_splits(task, GLUE)[0].labels
    if labels.dtype.kind == "f":
        return None
    counts = np.bincount(labels).astype(float)
    p = counts / counts.sum()
    return {"majority": float(p.max()), "entropy": float(-(p * np.log(p)).sum())}


def training_end(folder: Path) -> dict[str, float] | None:
    """The last logged training window of a student: its batch accuracy (%) and hard loss
    (cross-entropy; STS-B's, a regression, is the MSE and it has no accuracy), the evidence
    for or against a one-class collapse; with the perturbation those are of the perturbed
    pass, so ``accuracy_pass1`` (the unperturbed pass's accuracy) joins them where the run
    logged it."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
            if '"loss_hard"' in line] if (folder / "metrics.jsonl").is_file() else []
    if not rows:
        return None
    return {k: rows[-1][k] for k in ("accuracy", "loss_hard", "accuracy_pass1") if k in rows[-1]}


def _fit(end: dict[str, float]) -> str:
    """A training window as ``accuracy / hard CE``, the unperturbed pass's accuracy beside;
    a regression's as ``MSE loss``."""
    if "accuracy" not in end:
        return f"MSE {end['loss_hard']:.3f}"
    clean = f" (unperturbed {end['accuracy_pass1']:.1f})" if "accuracy_pass1" in end else ""
    return f"{end['accuracy']:.1f}{clean} / {end['loss_hard']:.3f}"


def last_window(folder: Path) -> dict[str, float] | None:
    """The last logged training window of a run (its step and losses): the training figures of
    a run without a dev score (the general run)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line] if (folder / "metrics.jsonl").is_file() else []
    return None if not rows else {k: v for k, v in rows[-1].items()
                                  if k == "step" or k.startswith("loss")}


def train_seconds(folder: Path) -> float | None:
    """A run's training time from its log: the median seconds per step over the logged
    windows x its last step. ``timing.json`` misses the processes a session's end killed (their
    driver died with them), and a window spanning a stop is an outlier the median ignores."""
    if not (folder / "metrics.jsonl").is_file():
        return None
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
            if '"time"' in line and '"loss"' in line]
    rates = [(b["time"] - a["time"]) / (b["step"] - a["step"])
             for a, b in zip(rows, rows[1:]) if b["step"] > a["step"]]
    return statistics.median(rates) * rows[-1]["step"] if rates else None


def collect(root: Path) -> dict[str, Any]:
    """Every recorded run's dev and held-out scores, grouped as the table shows them. Runs
    finished here but missing from the ledger (a driver older than the ledger, a teacher whose
    record differs) are recorded first."""
    ledger = recorded()
    for run in plan(root):
        rec = ledger.get(run.name)
        if run.finished_here(root) and (rec is None or run.local):
            record(run, root)  # a teacher's record notes a rerun once
    out: dict[str, Any] = {"tasks": {}, "runs": recorded()}
    for task in ALL_TASKS:
        rows: dict[str, Any] = {}
        teacher = out["runs"].get(teacher_run(task).name)
        rows["teacher"] = teacher and teacher["dev"]["score"]
        for key, (start, v, lr_v) in row_specs(task, root).items():
            names = {s: student_run(task, v, lr_v, s, root, start=start).name for s in SEEDS}
            by_seed = {s: out["runs"][n]["dev"]["score"] for s, n in names.items()
                       if n in out["runs"]}
            digests = {s: out["runs"][n].get("digest", UNKEYED_DIGEST) for s, n in names.items()
                       if n in out["runs"]}
            # a gen student's start: the general run's weights (each machine trains it again)
            starts = {s: out["runs"][n].get("start_sha256") for s, n in names.items()
                      if n in out["runs"]}
            rows[key] = {
                "lr": lr_v, **_summary(list(by_seed.values())), "by_seed": by_seed,
                "digests": digests, "starts": starts, "digests_agree":
                    len(set(digests.values())) <= 1 and len(set(starts.values())) <= 1}
        rows["prior"] = label_prior(task)
        rows["majority"] = majority_score(task)
        out["tasks"][task] = rows
    return out


def row_specs(task: str, root: Path) -> dict[str, tuple[str, str, float]]:
    """``collect``'s summary rows of ``task``: key -> (start, variant, lr). Each family's
    variants at their lrs (``family_lr``), then issue 51's rows at ``lrc``'s chosen lr: the
    ablations (``abl-VARIANT``; the pretrained student's ``pre-abl-VARIANT``) and BERT_M."""
    specs = {row_key(start, v): (start, v, lr) for v in VARIANTS for start in STARTS
             if (lr := family_lr(task, v, root, start)) is not None}
    for start, tasks, prefix in (("random", ABL_TASKS, "abl-"), ("pre", ABL_PRE_TASKS,
                                                                  "pre-abl-")):
        lr = chosen_lr(task, "lrc", root, start) if task in tasks else None
        specs.update({} if lr is None else {prefix + v: (start, v, lr) for v in ABL_VARIANTS})
    lr = chosen_lr(task, "lrc", root) if task in TASKS else None
    specs.update({} if lr is None else {"lrc_mse": ("random", "lrc_mse", lr)})
    return specs


def row_key(start: str, variant: str) -> str:
    """A summary row's key in ``collect``'s tasks: the variant, prefixed by a family other than
    the random init (``control-kd``, ``pre-lrc``)."""
    return variant if start == "random" else f"{start}-{variant}"


# (a, b): variant a's dev score minus b's, seed by seed (the same initialisation and data order)
_MAIN_PAIRS = (("lrc", "ce"), ("lrc", "kd"), ("lrc", "lrc_np"), ("kd", "ce"))
PAIRS = (*_MAIN_PAIRS, ("control-kd", "control-ce"))
PRE_PAIRS = tuple((row_key("pre", a), row_key("pre", b)) for a, b in _MAIN_PAIRS)


def paired(rows: dict[str, Any], a: str, b: str) -> dict[int, float]:
    """Seed -> ``a``'s dev score minus ``b``'s on one task (``collect``'s rows), for the seeds
    both have and whose recipe digest keys agree (runs of other training code are not
    compared; nor is a row whose seeds started from different general students): the same
    seed gives both the same student initialisation and data order, so the difference is free
    of the seed-to-seed spread that both share."""
    ra, rb = (rows.get(k, {}) for k in (a, b))
    sa, sb = ra.get("by_seed", {}), rb.get("by_seed", {})
    da, db = ra.get("digests", {}), rb.get("digests", {})
    if any(len(set(r.get("starts", {}).values())) > 1 for r in (ra, rb)):
        return {}  # a row's seeds learned from different general students: nothing to pair
    return {s: sa[s] - sb[s] for s in sorted(sa) if s in sb and da.get(s) == db.get(s)}


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The ``level`` t-interval of the mean of ``values`` (Student's t, df = n - 1): mean -+
    t * sd / sqrt(n); None for fewer than two values. With three seeds (df 2, t 4.30) it is
    wide: it says how little three seeds pin down."""
    from scipy.stats import t

    n = len(values)
    if n < 2:
        return None
    mean = statistics.fmean(values)
    half = float(t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(values) / n ** 0.5
    return mean - half, mean + half


MIN_MARGIN = 0.01  # a teacher closer to the majority class than 1 point has no margin to share


def margin_share(score: float, teacher: float, majority: float) -> float | None:
    """The share of the teacher's margin over the majority class that ``score`` closes:
    (score - majority) / (teacher - majority); 0 at the majority class, 1 at the teacher; None
    when the teacher is less than ``MIN_MARGIN`` above the majority (RTE's teacher here: 0.7
    points, where one dev row moves the share by 50 %). Unlike score / teacher it does not
    credit a student with the floor every classifier gets (MRPC's majority class keeps 93 % of
    its teacher)."""
    return None if teacher - majority < MIN_MARGIN else (score - majority) / (teacher - majority)


@functools.lru_cache
def majority_score(task: str) -> float:
    """The majority class's dev score (GLUE's metric) from ``results/glue_floors.json``."""
    return float(json.loads(FLOORS.read_text())["tasks"][task]["majority"]["score"])


def _paired_cell(diffs: dict[int, float]) -> str:
    if not diffs:
        return "-"
    each = " / ".join(f"{100 * d:+.1f}" for d in diffs.values())
    wins = sum(d > 0 for d in diffs.values())
    ci = t_interval(list(diffs.values()))
    interval = "" if ci is None else f", 95 % CI [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    return (f"{each} (seeds {', '.join(map(str, diffs))}; mean "
            f"{100 * statistics.fmean(diffs.values()):+.1f}{interval}, {wins} of {len(diffs)} "
            "above)")


def _pct(score: float | None) -> str:
    return "-" if score is None else f"{100 * score:.1f}"


def _summary_cell(data: dict[str, Any], task: str, key: str) -> str:
    """A table cell of ``collect``'s summary row ``key``: dev mean [min, max] (n, lr, % of
    the teacher retained, % of its margin over the majority closed)."""
    row = data["tasks"][task].get(key)
    teacher = data["tasks"][task].get("teacher")
    if key == "teacher":
        return "-" if row is None else f"{100 * row:.1f}"
    if not row or not row["n"]:
        return "-"
    if not row.get("digests_agree", True):
        return f"digests differ (n {row['n']}): not summarised"
    kept = f", {100 * row['mean'] / teacher:.0f} %" if teacher else ""
    share = teacher and margin_share(row["mean"], teacher, data["tasks"][task]["majority"])
    kept += "" if not teacher else (", margin -" if share is None
                                    else f", margin {100 * share:.0f} %")
    spread = f" [{100 * row['min']:.1f}, {100 * row['max']:.1f}]" if row["n"] > 1 else ""
    return f"{100 * row['mean']:.1f}{spread} (n {row['n']}, lr {row['lr']:g}{kept})"


def _summary_and_pairs(data: dict[str, Any], keys: tuple[str, ...],
                       pairs: tuple[tuple[str, str], ...],
                       tasks: tuple[str, ...] = tuple(TASKS)) -> list[str]:
    """The markdown of one family's summary rows ``keys`` and its paired differences."""
    head = "| {} | " + " | ".join(ALL_TASKS[t] for t in tasks) + " |"
    rule = "|---" * (len(tasks) + 1) + "|"
    lines = [head.format("variant"), rule]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(_summary_cell(data, t, key) for t in tasks)
                     + " |")
    lines.append("")
    lines.append("Cells: dev mean [min, max] (n seeds, lr, % of the teacher retained, % of the "
                 "teacher's margin over the majority class closed, \"-\" where the teacher "
                 "is less than 1 point above it; majority " + ", ".join(
                     f"{ALL_TASKS[t]} {100 * data['tasks'][t]['majority']:.1f}" for t in tasks)
                 + ").")
    lines.append("")
    lines.append("Paired by seed (a - b in dev score x 100, per seed; the same seed gives both "
                 "the same initialisation and data order; 95 % t-interval of the mean, df = n - "
                 "1; only runs whose recipe digest keys agree):")
    lines.append("")
    lines += [head.format("a - b"), rule]
    for a, b in pairs:
        lines.append(f"| {a} - {b} | " + " | ".join(
            _paired_cell(paired(data["tasks"][t], a, b)) for t in tasks) + " |")
    return lines


def _search_table(data: dict[str, Any], root: Path, start: str,
                  tasks: tuple[str, ...] = tuple(TASKS)) -> list[str]:
    """Family ``start``'s lr search: held-out (dev) per task, variant and lr at seed 0, the
    chosen lr marked."""
    lines = ["| task | variant | " + " | ".join(f"lr {lr:g}" for lr in LR_GRID) + " |",
             "|---|---|" + "---|" * len(LR_GRID)]
    for task in tasks:
        for v in ("ce", "lrc"):
            chosen = chosen_lr(task, v, root, start)
            cells = []
            for lr in LR_GRID:
                r = data["runs"].get(student_run(task, v, lr, 0, root, start=start).name)
                mark = " (chosen)" if lr == chosen else ""
                cells.append("-" if r is None else
                             f"{_pct(r['held_out'])} ({100 * r['dev']['score']:.1f}){mark}")
            lines.append(f"| {ALL_TASKS[task]} | {v} | " + " | ".join(cells) + " |")
    return lines


def _searched(data: dict[str, Any], root: Path, start: str, tasks: tuple[str, ...]) -> bool:
    """Whether any run of family ``start``'s lr search on ``tasks`` is recorded."""
    return any(student_run(t, v, lr, 0, root, start=start).name in data["runs"]
               for t in tasks for v in ("ce", "lrc") for lr in LR_GRID)


def _recorded_rows(data: dict[str, Any], tasks: tuple[str, ...], keys: tuple[str, ...]) -> bool:
    """Whether any of the summary rows ``keys`` holds a recorded run on ``tasks``."""
    return any((data["tasks"][t].get(k) or {}).get("n") for t in tasks for k in keys)


def _section(title: str, data: dict[str, Any], tasks: tuple[str, ...], own: tuple[str, ...],
             keys: tuple[str, ...], pairs: tuple[tuple[str, str], ...]) -> list[str]:
    """An issue-51 section: its title, and its summary rows and pairs once one of its ``own``
    rows has a recorded run ("not run yet" before)."""
    if not _recorded_rows(data, tasks, own):
        return ["", f"{title.removesuffix(':')}: not run yet."]
    return ["", title, "", *_summary_and_pairs(data, ("teacher", *keys), pairs, tasks)]


def _paper_line(tasks: tuple[str, ...]) -> str:
    """The paper's Table 1 rows (test server) on ``tasks``, with the share of its teacher."""
    return ("The paper (Table 1, GLUE test server, x 100; % of its BERT-base teacher): " + "; ".join(
        f"{ALL_TASKS[t]} teacher {PAPER[t][0]:.1f}, LRC-BERT1 {PAPER[t][1]:.1f} "
        f"({100 * PAPER[t][1] / PAPER[t][0]:.1f} %), LRC-BERT {PAPER[t][2]:.1f} "
        f"({100 * PAPER[t][2] / PAPER[t][0]:.1f} %)" for t in tasks) + ".")


def _floors_line(tasks: tuple[str, ...]) -> str:
    floors = json.loads(FLOORS.read_text())["tasks"]
    return ("Floors (dev x 100), majority class / bag of words: " + ", ".join(
        f"{ALL_TASKS[t]} {100 * floors[t]['majority']['score']:.1f} / "
        f"{100 * floors[t]['bag_of_words']['score']:.1f}" for t in tasks)
        + " (STS-B's majority is the mean score, a constant: no correlation, 0).")


def _stsb_line(data: dict[str, Any], root: Path, start: str) -> str:
    """STS-B's two metrics (GLUE's score is their mean) per variant, mean over the seeds."""
    cells = []
    for v in TASK2_VARIANTS:
        lr = family_lr("stsb", v, root, start)
        devs = [] if lr is None else [
            data["runs"][n]["dev"] for s in SEEDS
            if (n := student_run("stsb", v, lr, s, root, start=start).name) in data["runs"]]
        if devs:
            cells.append(f"{row_key(start, v)} {100 * statistics.fmean(d['pearson'] for d in devs):.1f}"
                         f" / {100 * statistics.fmean(d['spearman'] for d in devs):.1f} "
                         f"(n {len(devs)})")
    return "STS-B dev Pearson / Spearman x 100, mean over seeds: " + ("; ".join(cells) or "-")


def _general_line(data: dict[str, Any]) -> str:
    """The general run's training figures (it has no dev score)."""
    rec = data["runs"].get(GENERAL)
    if rec is None:
        return f"{GENERAL}: not recorded (phase general)."
    hours = "-" if rec.get("train_s") is None else f"{rec['train_s'] / 3600:.2f}"
    return (f"{GENERAL}: {rec.get('final_step')} steps, {hours} wall hours of training, last "
            f"window {rec.get('train_last')}, corpus sha256 {rec.get('corpus_sha256')}.")


def _budget_table(data: dict[str, Any], root: Path) -> list[str]:
    """The budget runs beside the same start's 3-epoch run (seed 0, the same lr)."""
    runs = [r for r in budget_runs(root) if r.name in data["runs"]]
    if not runs:
        return ["", "The budget (issue 51, step 6): not run yet."]
    lines = ["", f"The budget (issue 51, step 6): {BUDGET_EPOCHS} epochs against 3, seed 0, the "
             "same start and lr; dev (held-out) x 100:", "",
             "| task | variant | start | lr | 10 epochs | 3 epochs | 10 - 3 |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r.meta
        long = data["runs"][r.name]
        short = data["runs"].get(student_run(m["task"], m["variant"], m["lr"], 0, root,
                                             start=m["start"]).name)
        diff = "-" if short is None else f"{100 * (long['dev']['score'] - short['dev']['score']):+.1f}"
        lines.append(f"| {ALL_TASKS[m['task']]} | {m['variant']} | {m['start']} | {m['lr']:g} | "
                     f"{100 * long['dev']['score']:.1f} ({_pct(long['held_out'])}) | "
                     + ("-" if short is None else f"{100 * short['dev']['score']:.1f} "
                        f"({_pct(short['held_out'])})") + f" | {diff} |")
    lines += [""] + [f"- {t}: start {c[0]}: {c[1]}" for t in BUDGET_TASKS
                     if (c := budget_start(t, root))]
    return lines


def issue51_sections(data: dict[str, Any], root: Path) -> list[str]:
    """The table's sections of issue 51's steps 3-6 (each "not run yet" until it has a run)."""
    abl = tuple(f"abl-{v}" for v in ABL_VARIANTS)
    pre_abl = tuple(f"pre-abl-{v}" for v in ABL_VARIANTS)
    lines = _section("The ablations (issue 51, step 3; the paper's Table 3): random init, "
                     "lrc's chosen lr, each paired with the full lrc:", data, ABL_TASKS, abl,
                     ("lrc", *abl), tuple((a, "lrc") for a in abl))
    paper_abl = ["", "The paper's Table 3 (dev x 100), MRPC / CoLA: " + "; ".join(
        f"{v} {m:.1f} / {c:.1f}" for v, (m, c) in PAPER_ABLATIONS.items())
        + " (its one-stage ablation is on MNLI-m: two stages 83.4, one 79.4)."]
    lines += paper_abl if _recorded_rows(data, ABL_TASKS, abl) else []
    second = tuple(row_key(st, v) for st in SECOND_PHASES for v in TASK2_VARIANTS)
    for start, phase in (("random", "lr2"), ("pre", "lr2-pre")):
        keys = tuple(row_key(start, v) for v in TASK2_VARIANTS)
        title = (f"RTE and STS-B, {start} start (issue 51, step 4; phases {phase}, "
                 f"{SECOND_PHASES[start][1]}):")
        rows = _recorded_rows(data, tuple(TASKS2), keys)
        searched = _searched(data, root, start, tuple(TASKS2))
        lines += (["", title, "", "No lr chosen yet: its lr search so far is below."]
                  if searched and not rows else
                  _section(title, data, tuple(TASKS2), keys, keys,
                           tuple((row_key(start, a), row_key(start, b))
                                 for a, b in (("lrc", "ce"), ("lrc", "kd"), ("kd", "ce")))))
        if rows or searched:
            lines += ["", _stsb_line(data, root, start), "", "Its lr search, seed 0, held-out "
                      "(dev) x 100:", "", *_search_table(data, root, start, tuple(TASKS2))]
    if _recorded_rows(data, tuple(TASKS2), second) or any(
            _searched(data, root, st, tuple(TASKS2)) for st in SECOND_PHASES):
        lines += ["", _floors_line(tuple(TASKS2)), "", _paper_line(tuple(TASKS2))]
    lines += _section("BERT_M (issue 51, step 4: MSE in place of COS-NCE between the layers), "
                      "random init, lrc's chosen lr:", data, tuple(TASKS), ("lrc_mse",),
                      ("lrc", "lrc_mse"), (("lrc", "lrc_mse"),))
    lines += _section("Pre-training distillation first (issue 51, step 5: the paper's LRC-BERT "
                      "condition) against the random init (its LRC-BERT1 condition), lrc at the "
                      "random init's lr, paired by seed:", data, tuple(TASKS), ("gen-lrc",),
                      ("lrc", "gen-lrc"), (("gen-lrc", "lrc"),))
    if GENERAL in data["runs"] or _recorded_rows(data, tuple(TASKS), ("gen-lrc",)):
        lines += ["", _general_line(data), "", _paper_line(tuple(TASKS))]
    lines += _section("The ablations with the pretrained student on MRPC and CoLA (issue 51, "
                      "step 3; phase abl-pre), pre-lrc's lr:", data, ABL_PRE_TASKS, pre_abl,
                      ("pre-lrc", *pre_abl), tuple((a, "pre-lrc") for a in pre_abl))
    lines += paper_abl if _recorded_rows(data, ABL_PRE_TASKS, pre_abl) else []
    return lines + _budget_table(data, root)


def table(root: Path) -> str:
    """Write the collected summaries into the ledger and return the markdown table."""
    data = collect(root)
    update_ledger(lambda ledger: ledger.update(tasks=data["tasks"]))
    random_keys = (*MAIN_VARIANTS, *(row_key("control", v) for v in STARTS["control"].variants),
                   *WHY_VARIANTS)
    lines = _summary_and_pairs(data, ("teacher", *random_keys), PAIRS)
    runs = plan(root)
    lines.append("")
    for phase in PHASES:
        done = [r.name for r in runs if r.phase == phase and r.name in data["runs"]]
        train = sum(data["runs"][n]["train_s"] or 0.0 for n in done)
        lines.append(f"- {phase}: {len(done)} of {sum(r.phase == phase for r in runs)} runs "
                     f"done, {train / 3600:.2f} wall hours of training (1 thread each, the machine "
                     "shared)")
    lines.append("")
    lines.append("The pretrained student (issue 51: MiniLM's layers 1, 2, 4, 5, 4 x 384; phases "
                 "lr-pre and main-pre; no run here mixes with the random-init rows above):")
    lines.append("")
    lines += _summary_and_pairs(
        data, ("teacher", *(row_key("pre", v) for v in STARTS["pre"].variants)), PRE_PAIRS)
    lines.append("")
    lines.append("Its lr search, seed 0: held-out (dev) x 100; the chosen lr has the best "
                 "held-out score (ties: the smaller lr), kd takes ce's, lrc_np lrc's:")
    lines.append("")
    lines += _search_table(data, root, "pre")
    lines.append("")
    lines.append(f"The `why` grid at lr {WHY_LR:g}, seed 0: dev (held-out) and the last "
                 "training window (accuracy / hard CE):")
    lines.append("")
    lines.append("| task | schedule | with perturbation | without |")
    lines.append("|---|---|---|---|")
    for task in WHY_TASKS:
        for stages in ("two", "one"):
            cells = []
            for noise in ("perturb", "none"):
                r = data["runs"].get(student_run(task, WHY_GRID[stages, noise], WHY_LR, 0,
                                                 root).name)
                end = r and r.get("train_end")
                cells.append("-" if r is None else
                             f"{100 * r['dev']['score']:.1f} ({_pct(r['held_out'])})"
                             + (f"; {_fit(end)}" if end else ""))
            lines.append(f"| {TASKS[task]} | {stages} {'stages' if stages == 'two' else 'stage'} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("A student that predicts one class ends training at the majority share and the "
                 "label entropy: " + "; ".join(
                     f"{TASKS[t]} {100 * data['tasks'][t]['prior']['majority']:.1f} % / "
                     f"{data['tasks'][t]['prior']['entropy']:.3f} nats" for t in TASKS) + ".")
    lines += issue51_sections(data, root)
    lines.append("")
    lines.append("| run | held-out | dev | last training window: accuracy / hard CE | "
                 "train wall s (median s/step x steps) | CPU s recorded (finished processes "
                 "only: a process cut by a session's end is missing) |")
    lines.append("|---|---|---|---|---|---|")
    for name, r in data["runs"].items():
        held = _pct(r.get("held_out"))
        end = r.get("train_end")
        fit = "-" if not end else _fit(end)
        dev = "-" if "dev" not in r else f"{100 * r['dev']['score']:.1f}"
        lines.append(f"| {name} | {held} | {dev} | {fit} | "
                     f"{'-' if r['train_s'] is None else round(r['train_s'])} | "
                     f"{r['cpu_s']:.0f} |")
    return "\n".join(lines)


def speed(root: Path, repeats: int = 5) -> dict[str, Any]:
    """Teacher (MiniLM, 6 x 384), the 4 x 312 student and the 3 x 384 control student forward on
    SST-2 dev batches of 32, side by side, alternated, at 1 and 2 threads (ms per sentence, the
    best of ``repeats``); parameters; FLOPs per 128-token sequence. Speed does not depend on the
    weights: the students are built from their shapes (random init), the teacher is MiniLM."""
    import torch

    from contrastive.data.text_tasks import load_task
    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.methods.text_classifier import TextClassifier
    from contrastive.nn.text_encoders import text_encoder

    torch.manual_seed(0)
    tok = load_tokenizer(MINILM)
    encoders = {"teacher 6x384": text_encoder(f"hf:{MINILM}"),
                "student 4x312": text_encoder("bert", vocab_size=tok.vocab_size, layers=4,
                                              hidden=312, heads=12, intermediate_size=1200),
                "control 3x384": text_encoder(f"hf:{MINILM}", keep_layers="1,3,5")}
    models = {n: TextClassifier(e, 2).eval() for n, e in encoders.items()}
    dev = load_task("sst2", GLUE).dev
    batches = [tok.collate([dev[i] for i in range(s, s + 32)]) for s in range(0, 320, 32)]
    shapes = {"teacher 6x384": (6, 384, 1536), "student 4x312": (4, 312, 1200),
              "control 3x384": (3, 384, 1536)}
    result: dict[str, Any] = {
        "params": {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()},
        "gflops_per_128_tokens": {n: encoder_flops(*shapes[n], 128) / 1e9 for n in models},
        "tokens_per_sentence": float(sum(int(b["attention_mask"].sum()) for b in batches)
                                     / (32 * len(batches)))}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        times: dict[str, list[float]] = {n: [] for n in models}
        with torch.no_grad():
            for _ in range(repeats):
                for n, m in models.items():
                    t0 = time.perf_counter()
                    for b in batches:
                        m.predict(b)
                    times[n].append(time.perf_counter() - t0)
        result[f"ms_per_sentence_threads{threads}"] = {
            n: min(v) / (32 * len(batches)) * 1e3 for n, v in times.items()}
    return result


TARGET_TEMPERATURES = (1.0, 1.1, 2.0, 4.0)  # no softening, the paper's t, DistilBERT's t, Hinton's


def target_softness(logits: Any, labels: Any, temperature: float) -> dict[str, float]:
    """What a teacher's softened targets ``softmax(logits / t)`` add to the labels, row mean:
    the top probability, the share of rows whose top probability exceeds 0.99 (a one-hot target
    in all but name), the entropy in nats (0: one-hot; log C: uniform) and the probability of
    the gold label. Soft targets near one-hot that agree with the labels carry no more than
    the labels: KD's soft loss then repeats the cross-entropy."""
    import torch

    p = (torch.as_tensor(logits, dtype=torch.float64) / temperature).softmax(1)
    top = p.max(1).values
    entropy = -(p * p.clamp_min(1e-300).log()).sum(1)
    gold = p.gather(1, torch.as_tensor(labels, dtype=torch.long)[:, None]).squeeze(1)
    return {"mean_top_p": float(top.mean()),
            "share_top_p_above_0.99": float((top > 0.99).double().mean()),
            "mean_entropy_nats": float(entropy.mean()), "mean_p_gold": float(gold.mean())}


def teacher_targets(root: Path, tasks: tuple[str, ...] = tuple(TASKS),
                    temperatures: tuple[float, ...] = TARGET_TEMPERATURES) -> dict[str, Any]:
    """Each trained teacher's targets on the rows its students train on (drawn as the recipes
    draw them): its accuracy there and :func:`target_softness` at each temperature."""
    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.eval.classifier_folder import load_classifier
    from contrastive.eval.glue import predict_all

    out: dict[str, Any] = {}
    for task in tasks:
        model_dir = teacher_run(task).folder(root) / "model"
        if not model_dir.is_dir():
            raise FileNotFoundError(f"lrc_glue targets: no teacher model in {model_dir}; train "
                                    f"it first: python benchmarks/lrc_glue.py run --root {root} "
                                    f"--phase teachers --tasks {task}")
        z, y = predict_all(load_classifier(model_dir)[0], task_splits(task, GLUE)[0],
                           load_tokenizer(model_dir), batch_size=128)
        out[task] = {"rows": len(y), "teacher_accuracy": float((z.argmax(1) == y).double().mean()),
                     **{f"t {t:g}": target_softness(z, y, t) for t in temperatures}}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("plan", "run", "table", "speed", "targets", "corpus"))
    p.add_argument("--root", type=Path, default=ROOT / "runs" / "lrc_glue")
    p.add_argument("--phase", choices=PHASES)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tasks", default=",".join(ALL_TASKS),
                   help="run (or `targets`: read) only these tasks, comma-separated (default: all)")
    p.add_argument("--no-wait", action="store_true",
                   help="run: leave runs another driver holds to it and go on at once (the "
                        "default waits for them: a later phase may need their results)")
    p.add_argument("--ledger", type=Path, default=_DEFAULT_LEDGER,
                   help="the runs' records, kept by git (default: %(default)s)")
    a = p.parse_args(argv)
    global LEDGER
    LEDGER = a.ledger
    if not GLUE.is_dir() or not MINILM.is_dir():
        print(f"lrc_glue: needs the real GLUE files and MiniLM in {SHARED} (see its README)")
        return 2
    tasks = tuple(t.strip() for t in a.tasks.split(",") if t.strip())
    if unknown := sorted(set(tasks) - set(ALL_TASKS)):
        print(f"lrc_glue: --tasks {','.join(unknown)} unknown; known: {','.join(ALL_TASKS)}")
        return 2
    if a.command == "plan":
        print_plan(a.root)
    elif a.command == "corpus":
        info = write_corpus(corpus_path(a.root).parent, GLUE)
        print(f"{corpus_path(a.root)}: {info['lines']} sentences, sha256 {info['sha256']}")
    elif a.command == "run":
        run_phase(a.root, a.phase, a.workers, a.threads, tasks, wait_for_others=not a.no_wait)
    elif a.command == "table":
        print(table(a.root))
    elif a.command == "targets":
        try:
            print(json.dumps(teacher_targets(a.root, tuple(t for t in tasks if t != "stsb")),
                             indent=1))  # STS-B's regression teacher has no class targets
        except FileNotFoundError as e:
            print(e)
            return 2
    else:
        print(json.dumps(speed(a.root), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
