#!/usr/bin/env python
"""Issue 49 step 6: start from the pretrained EfficientNet-Lite0 or not, on CIFAR-10 (JPEG copy)
at CPU scale; every run of the table, resumable across sessions, and the table itself.

    python benchmarks/init_cifar.py plan  [--root R]      # the runs, their state and CPU estimate
    python benchmarks/init_cifar.py run   [--root R] [--phase seed0|seeds] [--workers 1]
    python benchmarks/init_cifar.py table [--root R]      # results/init_cifar.md from the ledger
    python benchmarks/init_cifar.py run --smoke --root /tmp/x   # 2 steps, 100 images, 64 px

Runs live in ``--root`` (outside git); a training run is a run folder of its recipe started with
``--resume auto`` (a checkpoint every ``SAVE_EVERY`` steps), so a killed driver loses at most
that many steps: start ``run`` again. A run is done when it is in the ledger
(``results/init_cifar_runs.json``, ``--ledger``, kept by git): after training, the project's
eval CLIs (``tools/knn_eval.py`` = ``contrastive-knn-eval``, ``tools/linear_eval.py`` =
``contrastive-linear-eval``) read its ``encoder.pt`` and write ``knn.json`` / ``probe.json`` into
its folder; then its resume checkpoints are deleted and its record (both top-1s, the CPU and wall
seconds of training and of evaluation, the CPU kind, the commit, the date, the final step, the
recipe's digest key, the commands) is written to the ledger. A lock file per run
(``ROOT/NAME.lock``) keeps two drivers off one run; ``touch ROOT/no-new-runs`` lets the running
runs finish and starts no other.

The design (the issue's step 6):
- data: the first ``PER_CLASS`` = 1,000 files of each class of ``--data-root``'s ``train/`` in
  file-name order (``0000.jpg`` .. ``0999.jpg``: the first 1,000 images of the class in
  CIFAR-10's ``data_batch_1..5`` order, ``../shared/data/README.md``) = 10,000 images, and the
  whole ``test/`` split (10,000), as a folder of symbolic links the driver makes,
  ``ROOT/data/{train,test}/<class>/`` (``selection.json`` beside it says what it holds).
  Every row at ``IMAGE_SIZE`` = 128 px (the 32 px images upsampled by the crops / the eval
  resize), fp32, one thread a run.
- evaluation of every row: kNN (k 200, t 0.1) and the cached linear probe (lr / wd chosen on
  10 % of the training images, the CLI's default), the 10,000 training images as the bank /
  the probe's training set, the whole test split as queries; never tuned on the test split.
- (a) the pretrained file as it is (``--encoder timm:efficientnet_lite0``, its normalisation
  mean = std = 0.5); (b) MoCo v2 (``recipes/moco_r50.py``) and DINO (``recipes/dino_cifar.py``
  with ``--encoder timm:efficientnet_lite0``) continued from it (``--init``, its normalisation
  travels with it); (c) the same from random initialisation; (d) COS-NCE distillation
  (``recipes/distill_cosnce.py``) of the file (its own 0.5 normalisation) into a random-init
  ``STUDENT`` against the same student trained by MoCo v2. (b)-(d): one epoch = 156 steps at
  batch 64, ``--steps 0 --epochs 1`` (the recipes' schedules over that epoch).
- settings that the one-epoch budget forces away from a recipe's defaults (``ARMS``, each with
  its reason): MoCo's queue 4,096 (the MoCo CIFAR demo's K: the default 65,536 exceeds the
  9,984 keys one epoch makes, so most negatives would stay random vectors); DINO's multi-crop
  sized for 128 px as the official 224 px one scales: 2 global crops of 128 px (scale 0.4-1)
  and ``DINO_LOCAL_CROPS`` = 2 local crops of 56 px (96 x 128 / 224 = 54.9, rounded to a
  multiple of 8; scale 0.05-0.4; the official default is 8 local crops, which cost 30.2 CPU s
  a step here against 18.5 with 2: 8 would put the plan 1 CPU hour further over its 6),
  teacher momentum 0.996 (the official ``main_dino.py`` default; the CIFAR recipe's
  0.9995 is for 195k steps and would leave the teacher at 93 % of its start after 156 steps),
  warmup 0.1 epoch (the official 10 of 100 epochs) and the last layer not frozen (the official
  1 of 100 epochs; the recipe's 1 epoch would freeze it for the whole run); distillation
  without the labels (``--no-use-labels``: a self-supervised comparison; the teacher's ImageNet
  head does not match CIFAR's 10 classes, so there is no KD term either: COS-NCE only).
- seeds: 0 for every row; 1 and 2 for a trained row whose seed 0 trained in under
  ``EXTRA_SEEDS_UNDER_CPU_S`` CPU seconds (its record's ``cpu_s``, training only); (a) has no
  seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import run_ledger  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
EFFNET = SHARED / "image-models" / "efficientnet_lite0" / "model.safetensors"
EFFNET_ENCODER = "timm:efficientnet_lite0"
EFFNET_NORM = ("0.5", "0.5", "0.5")  # the TF-Lite training's mean = std (../shared/data/README.md)
STUDENT = "timm:resnet18"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")
IMAGE_SIZE, PER_CLASS, BATCH, EPOCHS, SAVE_EVERY = 128, 1000, 64, 1, 20
SEEDS = (0, 1, 2)
DINO_LOCAL_CROPS = 2  # the official 8 cost 1.6x a step (docstring)
EXTRA_SEEDS_UNDER_CPU_S = 15 * 60
PHASES = ("seed0", "seeds")
DEFAULT_LEDGER = ROOT / "benchmarks" / "results" / "init_cifar_runs.json"
DEFAULT_TABLE = ROOT / "benchmarks" / "results" / "init_cifar.md"
NO_NEW_RUNS = run_ledger.NO_NEW_RUNS
READING = "## Reading"  # the lead's section of the table file: kept when the table is rewritten


@dataclass(frozen=True)
class Scale:
    """The sizes of a measurement: the real one, or ``--smoke``'s seconds-long one."""

    image_size: int
    per_class: int
    test_per_class: int | None  # None: the whole test split
    budget: tuple[str, ...]  # the training length flags

    def local_size(self) -> int:
        """DINO's local crop side: the official 96 of 224 px scaled to ``image_size``, rounded to
        a multiple of 8."""
        return 8 * round(self.image_size * 96 / 224 / 8)


REAL = Scale(IMAGE_SIZE, PER_CLASS, None, ("--steps", "0", "--epochs", str(EPOCHS)))
SMOKE = Scale(64, 10, 10, ("--steps", "2"))


@dataclass(frozen=True)
class Arm:
    """One row of the table: its letter, method and start, its recipe (None: no training, the
    pretrained file evaluated as it is) and the recipe's flags beyond the shared ones."""

    key: str
    row: str
    method: str
    start: str
    recipe: str | None
    flags: tuple[str, ...] = ()
    encoder: str = EFFNET_ENCODER


INIT = ("--init", str(EFFNET), "--init-mean", *EFFNET_NORM, "--init-std", *EFFNET_NORM)
MOCO = ("--queue-size", "4096")  # the demo's K: 65,536 > the keys of one epoch (docstring)
DINO = ("--momentum", "0.996", "--warmup-epochs", "0.1", "--freeze-last-layer-epochs", "0")
PRETRAINED = "EfficientNet-Lite0 (ImageNet)"
ARMS = (
    Arm("a-pretrained", "a", "none (the file as it is)", PRETRAINED, None),
    Arm("b-moco", "b", "MoCo v2", PRETRAINED, "moco_r50.py",
        ("--encoder", EFFNET_ENCODER, *INIT, *MOCO)),
    Arm("b-dino", "b", "DINO", PRETRAINED, "dino_cifar.py",
        ("--encoder", EFFNET_ENCODER, *INIT, *DINO)),
    Arm("c-moco", "c", "MoCo v2", "random", "moco_r50.py", ("--encoder", EFFNET_ENCODER, *MOCO)),
    Arm("c-dino", "c", "DINO", "random", "dino_cifar.py", ("--encoder", EFFNET_ENCODER, *DINO)),
    Arm("d-distill", "d", "COS-NCE distillation of the file", "random", "distill_cosnce.py",
        ("--student", STUDENT, "--teacher", EFFNET_ENCODER, "--teacher-checkpoint", str(EFFNET),
         "--teacher-mean", *EFFNET_NORM, "--teacher-std", *EFFNET_NORM, "--no-use-labels"),
        STUDENT),
    Arm("d-moco", "d", "MoCo v2", "random", "moco_r50.py", ("--encoder", STUDENT, *MOCO),
        STUDENT),
)
ARM = {a.key: a for a in ARMS}

# CPU seconds (user + system, the process and its loader worker) of a training step (batch 64,
# 128 px, 1 thread, fp32) and of a row's evaluation (kNN + probe CLIs, 10,000 + 10,000 images):
# `plan`'s estimates until the ledger records a run. Measured 2026-11-29 10:30-10:57 UTC on the
# AMD EPYC (family 25 model 1, AVX2) of the lead's machine, under a load average of 7 to 11 on its
# 2 cores (no quiet machine; 40 % of the evaluation's CPU was system time, memory pressure), so
# they are upper bounds: a step from the CPU ticks between logged steps 1..4 of a
# --max-steps run (DINO with 2 local crops 17.7 / 19.3, with 8: 30.7 / 31.3 / 28.6;
# distillation 11.3 / 11.0; MoCo ResNet-18 8.8 / 9.4);
# MoCo EfficientNet from one 6-step run (65.8 CPU s less ~10 s of start-up); the evaluation from
# the kNN and probe CLIs on 1,000 + 1,000 images (96 and 100 CPU s, ~12 s of each start-up)
# scaled to 20,000 images; the ResNet-18 taken equal (its training step costs the
# EfficientNet's on this CPU).
STEP_CPU_S = {"b-moco": 9.2, "b-dino": 18.5, "c-moco": 9.2, "c-dino": 18.5, "d-distill": 11.2,
              "d-moco": 9.1}
EVAL_CPU_S = {EFFNET_ENCODER: 1750.0, STUDENT: 1750.0}
STEPS_PER_EPOCH = 10 * PER_CLASS // BATCH  # 156: the loader drops the last partial batch


@dataclass
class Run:
    """One seed of one arm: its folder ``root / name``."""

    arm: Arm
    seed: int
    phase: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.arm.key}-s{self.seed}"

    def folder(self, root: Path) -> Path:
        return root / self.name


@dataclass
class Driver:
    """Where the runs, their data and their records live, and at what scale they run."""

    root: Path
    data_root: Path
    ledger: Path = DEFAULT_LEDGER
    scale: Scale = REAL
    threads: int = 1

    @property
    def data(self) -> Path:
        return self.root / "data"

    def recorded(self) -> dict[str, dict[str, Any]]:
        """The ledger's run records (name -> record); empty without a ledger."""
        return json.loads(self.ledger.read_text()).get("runs", {}) if self.ledger.is_file() else {}

    def train_command(self, run: Run) -> list[str]:
        arm, s = run.arm, self.scale
        assert arm.recipe is not None
        flags = list(arm.flags)
        if arm.recipe == "dino_cifar.py":
            flags += ["--local-crops", str(DINO_LOCAL_CROPS), "--local-size",
                      str(s.local_size())]
        return [sys.executable, str(ROOT / "recipes" / arm.recipe), *flags,
                "--data", str(self.data), "--image-size", str(s.image_size),
                "--batch-size", str(BATCH), *s.budget, "--seed", str(run.seed),
                "--knn-every", "0", "--cpu", "--mixed-precision", "no", "--num-workers", "1",
                "--progress", "false", "--save-every-steps", str(SAVE_EVERY),
                "--output-dir", str(run.folder(self.root)), "--resume", "auto"]

    def eval_command(self, run: Run, kind: str) -> list[str]:
        """``kind`` knn or probe: the project's eval CLI on the run's ``encoder.pt`` (row (a):
        the pretrained file, its encoder and normalisation named)."""
        folder = run.folder(self.root)
        tool = {"knn": "knn_eval.py", "probe": "linear_eval.py"}[kind]
        source = (["--checkpoint", str(EFFNET), "--encoder", EFFNET_ENCODER, "--mean",
                   *EFFNET_NORM, "--std", *EFFNET_NORM] if run.arm.recipe is None
                  else ["--checkpoint", str(folder / "encoder.pt")])
        return [sys.executable, str(ROOT / "tools" / tool), *source, "--data", str(self.data),
                "--image-size", str(self.scale.image_size), "--cpu", "--mixed-precision", "no",
                "--num-workers", "1", "--output", str(folder / f"{kind}.json")]


def plan(records: dict[str, dict[str, Any]]) -> list[Run]:
    """Every run, in order: seed 0 of every arm, then seeds 1 and 2 of each trained arm whose
    seed 0 is recorded with under ``EXTRA_SEEDS_UNDER_CPU_S`` CPU seconds of training."""
    runs = [Run(a, 0, "seed0") for a in ARMS]
    for a in ARMS:
        first = records.get(Run(a, 0, "seed0").name)
        if a.recipe is not None and first is not None and first["cpu_s"] < EXTRA_SEEDS_UNDER_CPU_S:
            runs += [Run(a, s, "seeds") for s in SEEDS[1:]]
    return runs


def estimate_cpu_s(arm: Arm) -> tuple[float, float]:
    """(training, evaluation) CPU seconds of one seed of ``arm`` at the real scale."""
    train = 0.0 if arm.recipe is None else STEP_CPU_S[arm.key] * STEPS_PER_EPOCH
    return train, EVAL_CPU_S[arm.encoder]


def plan_lines(records: dict[str, dict[str, Any]]) -> list[str]:
    """``plan``'s report: every run with its state and its CPU minutes (recorded, else
    estimated), the arms expected to get seeds 1 and 2 while seed 0 is not recorded, and the
    total."""
    lines, total = [], 0.0
    for r in plan(records):
        rec = records.get(r.name)
        if rec is not None:
            cpu, how = rec["cpu_s"] + rec["eval_cpu_s"], "recorded"
        else:
            cpu, how = sum(estimate_cpu_s(r.arm)), "estimated"
        total += cpu
        lines.append(f"{'done' if rec else 'todo'}  {r.phase:5s} {r.name:14s} "
                     f"{cpu / 60:6.1f} CPU min ({how})")
    for a in ARMS:
        first = Run(a, 0, "seed0").name
        train, evaluate = estimate_cpu_s(a)
        if a.recipe is not None and first not in records and train < EXTRA_SEEDS_UNDER_CPU_S:
            total += 2 * (train + evaluate)
            lines.append(f"(expected) seeds {a.key}-s1, -s2: {2 * (train + evaluate) / 60:.1f} "
                         "CPU min (estimated training under the seeds' limit)")
    lines.append(f"total {total / 3600:.2f} CPU hours (recorded + estimated; seeds 1, 2 only "
                 f"where seed 0 trained in under {EXTRA_SEEDS_UNDER_CPU_S / 60:.0f} CPU min; "
                 "the estimates were measured under a load of 7-11 on 2 cores: upper bounds)")
    return lines


def make_data(data_root: Path, dest: Path, scale: Scale) -> None:
    """The training subset and the test split as symbolic links in ``dest`` (see the module
    docstring); kept when ``selection.json`` says it holds the same selection. Raises
    ``FileNotFoundError`` (one line) when ``data_root`` is not the unpacked JPEG copy."""
    selection = {"source": str(data_root.resolve()), "train_per_class": scale.per_class,
                 "test_per_class": scale.test_per_class, "order": "file name",
                 "classes": list(CLASSES)}
    record = dest / "selection.json"
    if record.is_file() and json.loads(record.read_text()) == selection:
        return
    for split, n in (("train", scale.per_class), ("test", scale.test_per_class)):
        for c in CLASSES:
            src = data_root / split / c
            files = sorted(src.glob("*.jpg")) if src.is_dir() else []
            if len(files) < (n or 1):
                raise FileNotFoundError(
                    f"init_cifar: {src} holds {len(files)} .jpg files, {n or 'some'} needed; "
                    "give --data-root the unpacked CIFAR-10 JPEG copy (tar -xf "
                    "../shared/data/cifar10-jpeg.tar -C DIR: DIR/train/<class>/NNNN.jpg)")
            out = dest / split / c
            out.mkdir(parents=True, exist_ok=True)
            for f in out.iterdir():
                f.unlink()
            for f in files[:n]:
                (out / f.name).symlink_to(f.resolve())
    record.write_text(json.dumps(selection, indent=1) + "\n")


def top1(path: Path) -> float:
    """Top-1 (percent) from an eval CLI's result JSON."""
    return float(json.loads(path.read_text())["top1"])


def execute(run: Run, d: Driver) -> dict[str, Any]:
    """Train (or resume) and evaluate one run in child processes, then record it; returns what
    happened: its timings, ``{"skipped": why}`` (another driver holds it, or no new runs), or
    ``{"done": ...}`` when another driver recorded it since this one made its plan."""
    return run_ledger.exclusive(d.root, run.name, lambda: run.name in d.recorded(),
                                lambda: _execute(run, d))


def _execute(run: Run, d: Driver) -> dict[str, Any]:
    folder = run.folder(d.root)
    folder.mkdir(parents=True, exist_ok=True)
    times = folder / "timing.json"
    timings = json.loads(times.read_text()) if times.is_file() else []
    steps: list[tuple[str, list[str]]] = []
    if run.arm.recipe is not None:
        steps.append(("train", d.train_command(run)))
    steps += [(kind, d.eval_command(run, kind)) for kind in ("knn", "probe")]
    for what, cmd in steps:
        if (folder / f"{what}.json").is_file() if what != "train" else run_ledger.trained(folder):
            continue
        if what == "train":  # evaluated from an interrupted run's weights: evaluate again
            for kind in ("knn", "probe"):
                (folder / f"{kind}.json").unlink(missing_ok=True)
        timing = {"what": what,
                  **run_ledger.run_timed(cmd, d.root / f"{run.name}.log", d.threads)}
        timings.append(timing)
        times.write_text(json.dumps(timings, indent=1))
        if timing["rc"] != 0 or (what == "train" and not run_ledger.trained(folder)):
            return timing
    run_ledger.prune_checkpoints(folder)
    return record(run, d, timings, [cmd for _, cmd in steps])


def record(run: Run, d: Driver, timings: list[dict[str, Any]],
           commands: list[list[str]]) -> dict[str, Any]:
    """Write a run finished here into the ledger; returns its record."""
    from contrastive.hardware import cpu_kind_line

    folder = run.folder(d.root)

    def spent(key: str, train: bool) -> float:
        return round(sum(t[key] for t in timings if (t["what"] == "train") == train), 1)

    rec: dict[str, Any] = {
        "arm": run.arm.key, "row": run.arm.row, "method": run.arm.method,
        "start": run.arm.start, "seed": run.seed, "knn_top1": top1(folder / "knn.json"),
        "probe_top1": top1(folder / "probe.json"), "cpu_s": spent("cpu_s", True),
        "wall_s": spent("wall_s", True), "eval_cpu_s": spent("cpu_s", False),
        "eval_wall_s": spent("wall_s", False), "load": [t["load"] for t in timings],
        "cpu": cpu_kind_line(), "date": time.strftime("%Y-%m-%d"),
        "commit": run_ledger.git_commit(),
        "final_step": run_ledger.final_step(folder) if run.arm.recipe else None,
        "digest": run_ledger.recipe_digest(run.arm.recipe) if run.arm.recipe else None,
        "smoke": d.scale != REAL,
        "commands": [" ".join(c).replace(str(ROOT) + "/", "") for c in commands]}
    run_ledger.update_json(d.ledger, lambda data: data["runs"].__setitem__(run.name, rec),
                           {"runs": {}})
    return rec


def run_phase(d: Driver, phase: str | None, workers: int,
              arms: tuple[str, ...] = tuple(ARM)) -> None:
    """Run what is not recorded, phase by phase (the seeds phase needs seed 0's records), until
    every run is recorded or failed once (its log: ``ROOT/NAME.log``; the next call retries).
    ``arms``: only these rows' runs."""
    make_data(d.data_root, d.data, d.scale)
    failed: set[str] = set()
    for p in PHASES if phase is None else (phase,):
        todo = [r for r in plan(d.recorded()) if r.phase == p and r.name not in d.recorded()
                and r.arm.key in arms]
        print(f"[{time.strftime('%H:%M:%S')}] phase {p}: {len(todo)} runs to do", flush=True)
        with ThreadPoolExecutor(workers) as pool:
            for run, result in zip(todo, pool.map(lambda r: execute(r, d), todo)):
                said = {k: result[k] for k in ("knn_top1", "probe_top1", "cpu_s", "eval_cpu_s")
                        } if "knn_top1" in result else result
                print(f"[{time.strftime('%H:%M:%S')}] {run.name}: {said}", flush=True)
                if result.get("rc"):
                    failed.add(run.name)
    if failed:
        print(f"failed: {', '.join(sorted(failed))} (logs in {d.root})")


def summary(values: list[float]) -> str:
    """A table cell: the one value, or mean +- sample sd (n) over seeds."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} +- {statistics.stdev(values):.2f} (n {len(values)})"


def table(records: dict[str, dict[str, Any]], reading: str = "") -> str:
    """The markdown of ``results/init_cifar.md``: one row per arm (its seeds summarised), the
    CPU kinds, the commands of each arm's seed 0, and the lead's reading (``reading``: the text
    under ``READING`` of the file being replaced, else a placeholder)."""
    lines = ["# Issue 49 step 6: continue from pretrained weights, or not (CIFAR-10 JPEG copy, "
             "CPU scale)", "",
             "Written by `python benchmarks/init_cifar.py table` from "
             "`results/init_cifar_runs.json`; the design is in the driver's docstring: 10,000 "
             f"training images (the first {PER_CLASS} of each class), the whole test split as "
             f"queries, {IMAGE_SIZE} px, one epoch ({STEPS_PER_EPOCH} steps at batch {BATCH}) "
             "for (b)-(d), fp32, one thread a run. kNN: k 200, t 0.1; probe: the cached linear "
             "probe (lr / wd chosen on 10 % of the training images). Top-1 in %; with three "
             "seeds mean +- sample sd; CPU s: training + evaluation, mean per seed, on the CPU "
             "kind named by its letter (CPU seconds of two kinds do not compare).", "",
             "| row | method | start | kNN top-1 | probe top-1 | seeds | CPU s (train + eval) | CPU |",
             "|---|---|---|---|---|---|---|---|"]
    kinds = sorted({r["cpu"] for r in records.values()})
    letter = {kind: chr(ord("A") + i) for i, kind in enumerate(kinds)}
    for a in ARMS:
        recs = [r for r in records.values() if r["arm"] == a.key]
        recs.sort(key=lambda r: r["seed"])
        if not recs:
            lines.append(f"| {a.row} | {a.method} | {a.start} | - | - | - | - | - |")
            continue
        cpu = statistics.fmean(r["cpu_s"] for r in recs)
        ev = statistics.fmean(r["eval_cpu_s"] for r in recs)
        smoke = " (smoke)" if any(r.get("smoke") for r in recs) else ""
        lines.append(f"| {a.row} | {a.method}{smoke} | {a.start} | "
                     f"{summary([r['knn_top1'] for r in recs])} | "
                     f"{summary([r['probe_top1'] for r in recs])} | "
                     f"{', '.join(str(r['seed']) for r in recs)} | {cpu:.0f} + {ev:.0f} | "
                     f"{', '.join(sorted({letter[r['cpu']] for r in recs}))} |")
    lines += ["", "CPU kinds: " + ("; ".join(f"{letter[k]}: {k}" for k in kinds) or "-") + ". Commits: "
              + ", ".join(sorted({str(r["commit"]) for r in records.values()}) or ["-"]) + ".",
              "", "Commands of each row's seed 0 (run folders under the driver's `--root`):", ""]
    for a in ARMS:
        rec = records.get(Run(a, 0, "seed0").name)
        if rec is not None:
            lines += [f"- {a.key}:", *(f"  - `{c}`" for c in rec["commands"])]
    lines += ["", READING, "", reading.strip() or "(the lead's reading of the answer: to be "
              "written once the runs are in)", ""]
    return "\n".join(lines)


def read_reading(path: Path) -> str:
    """The text under ``READING`` in an existing table file (the lead's), else empty."""
    text = path.read_text() if path.is_file() else ""
    return text.split(READING, 1)[1] if READING in text else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("plan", "run", "table"))
    p.add_argument("--root", type=Path, default=ROOT.parent / "runs49" / "cifar",
                   help="the run folders (outside git; default %(default)s)")
    p.add_argument("--data-root", type=Path, default=Path("/tmp/ft49"),
                   help="the unpacked CIFAR-10 JPEG copy: train/<class>/, test/<class>/")
    p.add_argument("--phase", choices=PHASES)
    p.add_argument("--workers", type=int, default=1, help="runs at once (a DINO run holds ~7 GB)")
    p.add_argument("--arms", default=",".join(ARM),
                   help="run only these rows, comma-separated (default: all: %(default)s)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ledger", type=Path, default=None,
                   help=f"the runs' records (default {DEFAULT_LEDGER}; --smoke: ROOT/ledger.json)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"the table (default {DEFAULT_TABLE}; --smoke: ROOT/init_cifar.md)")
    p.add_argument("--smoke", action="store_true",
                   help="2 steps, 10 + 10 images a class, 64 px: the driver end to end in minutes")
    a = p.parse_args(argv)
    if a.smoke and a.root.resolve() == p.get_default("root").resolve():
        print("init_cifar: --smoke needs its own --root (e.g. /tmp/init_cifar_smoke): its runs "
              "have the real runs' names")
        return 2
    arms = tuple(k.strip() for k in a.arms.split(",") if k.strip())
    if unknown := sorted(set(arms) - set(ARM)):
        print(f"init_cifar: --arms {','.join(unknown)} unknown; known: {','.join(ARM)}")
        return 2
    ledger = a.ledger or (a.root / "ledger.json" if a.smoke else DEFAULT_LEDGER)
    d = Driver(a.root, a.data_root, ledger, SMOKE if a.smoke else REAL, a.threads)
    if a.command == "plan":
        print("\n".join(plan_lines(d.recorded())))
    elif a.command == "run":
        if not EFFNET.is_file():
            print(f"init_cifar: needs the pretrained file {EFFNET} (see ../shared/data/README.md)")
            return 2
        try:
            run_phase(d, a.phase, a.workers, arms)
        except FileNotFoundError as e:
            print(e)
            return 2
    else:
        out = a.out or (a.root / "init_cifar.md" if a.smoke else DEFAULT_TABLE)
        text = table(d.recorded(), read_reading(out))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
