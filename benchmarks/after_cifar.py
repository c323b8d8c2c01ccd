#!/usr/bin/env python
"""Issue 50 step 5: what users do after pretraining, measured on CIFAR-10 (the JPEG copy) at CPU
scale: kNN, linear probe, full fine-tuning and fine-tuning on 10 % and 1 % of the labels, for a
MoCo v2 CIFAR ResNet-18 pretrained here and for the EfficientNet-Lite0 file; every run
resumable across sessions, and the table.

    python benchmarks/after_cifar.py plan  [--root R]     # the runs, their state and CPU estimate
    python benchmarks/after_cifar.py run   [--root R] [--data-root D] [--workers 1] [--sources effnet]
    python benchmarks/after_cifar.py table [--root R]     # results/after_cifar.md from the ledger
    python benchmarks/after_cifar.py run --smoke --root /tmp/x   # 2 steps, 120 + 10 images a class

The runs live in ``--root`` (outside git), each a run folder started with ``--resume auto`` and a
checkpoint every ``SAVE_EVERY`` steps, so a killed driver loses at most that many steps; a run is
done when the ledger (``results/after_cifar_runs.json``, kept by git) records it. The machinery
(locks, the ledger, timed child processes) is ``run_ledger``'s, the data selection and the
pretrained file are those of ``init_cifar.py`` (issue 49 step 6), whose ledger already holds the
EfficientNet's kNN and probe (its row (a), the same commands): they are read from it, not run
twice.

The design (the issue's step 5; about 12 CPU hours in all, at most about 1 a fine-tuning run):
- sources: ``moco``: ``recipes/moco_cifar.py`` (MoCo v2, CIFAR ResNet-18) on all 50,000
  training images at 32 px for one epoch at batch 256 (``PRETRAIN_STEPS`` = 195 steps: the
  issue's "about 2 CPU hours" as estimated on the AVX2 kind under load; 0.76 CPU hour measured on
  the AVX-512 kind, 1 thread), queue 4,096 (one epoch makes 50,000 keys: the recipe's 4,096 is the MoCo
  CIFAR demo's K); ``effnet``: the EfficientNet-Lite0 file (ImageNet, its normalisation
  mean = std = 0.5) at 128 px, as in issue 49.
- kNN (k 200, t 0.1) and the cached linear probe: the project's CLIs on ``init_cifar``'s
  selection (the first 1,000 training images of each class as bank / probe set, the whole test
  split as queries).
- fine-tuning: ``contrastive-finetune --protocol sgd`` (SimCLR's: Nesterov SGD, cosine, crop and
  flip, the whole network at one lr, BatchNorm training) on the whole training split less a
  class-balanced 10 % validation part (``--val-fraction 0.1``, the same for every run: the
  figures a user would choose settings on), with ``--label-fraction`` 1, 0.1 or 0.01 of the rest
  (``--data-seed`` = the seed: each seed its own class-balanced subset, as SimCLR's 1 % / 10 %
  lists are one draw); ``FT_STEPS`` = 300 steps at batch 64 for every fraction (the same
  compute: 0.43 epoch of the full labels, 4.3 of 10 %, 43 of 1 %, where SimCLR fine-tunes 1 %
  for 60 epochs and 10 % for 30), lr 0.05 x 64 / 256; the test split scored once at the end.
  Seeds: 0 for the full labels, 0, 1, 2 for 10 % and 1 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import init_cifar  # noqa: E402
import run_ledger  # noqa: E402

DEFAULT_LEDGER = ROOT / "benchmarks" / "results" / "after_cifar_runs.json"
DEFAULT_TABLE = ROOT / "benchmarks" / "results" / "after_cifar.md"
READING = init_cifar.READING
SAVE_EVERY = 50
FRACTIONS = (1.0, 0.1, 0.01)
SEEDS = {1.0: (0,), 0.1: (0, 1, 2), 0.01: (0, 1, 2)}

# CPU seconds, `plan`'s estimates until the ledger records a run: from init_cifar's step costs on
# this AVX2 CPU under load (upper bounds): a MoCo step of a ResNet-18 at 128 px, batch 64, 9.1
# CPU s (two forward passes and one backward: ~4 forward units); a CIFAR ResNet-18 at 32 px
# costs about the same per image (0.56 against 0.60 GFLOPs), so a MoCo step at batch 256 is about
# 36 s and a fine-tuning step at batch 64 (3 units) about 6.8 s; scoring 15,000 images (the
# validation part and the test split, forward only) about 530 s.
PRETRAIN_STEP_CPU_S = 36.0
FT_STEP_CPU_S = 6.8
FT_SCORE_CPU_S = 530.0
EVAL_CPU_S = {"moco": 900.0, "effnet": 1750.0}


@dataclass(frozen=True)
class Scale:
    """The real measurement, or ``--smoke``'s seconds-long one."""

    pretrain: tuple[str, ...]  # the pretraining length flags
    ft_steps: int
    eval_per_class: int  # init_cifar's selection for kNN / probe
    eval_test_per_class: int | None
    ft_batch: int = 64
    smoke: bool = False


PRETRAIN_STEPS = 50_000 // 256  # one epoch: the loader drops the last partial batch
REAL = Scale(("--steps", "0", "--epochs", "1"), 300, 1000, None)
SMOKE = Scale(("--steps", "2"), 2, 120, 10, ft_batch=8, smoke=True)  # 1 % of 108 a class: one image each


@dataclass(frozen=True)
class Source:
    """A starting point: its name, how it is described, its crop size and its ``--init``."""

    key: str
    title: str
    image_size: int


SOURCES = (Source("moco", "MoCo v2 CIFAR ResNet-18 (one epoch here)", 32),
           Source("effnet", "EfficientNet-Lite0 (ImageNet file)", 128))
SOURCE = {s.key: s for s in SOURCES}


@dataclass(frozen=True)
class Run:
    """One run: ``pretrain-moco``, ``eval-<source>`` or ``ft-<source>-<percent>-s<seed>``."""

    kind: str  # pretrain | eval | ft
    source: str
    fraction: float = 1.0
    seed: int = 0

    @property
    def name(self) -> str:
        if self.kind == "ft":
            return f"ft-{self.source}-{self.fraction * 100:g}pc-s{self.seed}"
        return f"{self.kind}-{self.source}"


def plan() -> list[Run]:
    """Every run, in the order they are run: the pretraining first (its encoder is a source),
    then each source's evaluation and fine-tuning runs, the cheap fractions first."""
    runs = [Run("pretrain", "moco")]
    for s in SOURCES:
        runs.append(Run("eval", s.key))
        runs += [Run("ft", s.key, f, seed) for f in reversed(FRACTIONS) for seed in SEEDS[f]]
    return runs


def estimate_cpu_s(run: Run) -> float:
    """A run's CPU seconds at the real scale (see the constants)."""
    if run.kind == "pretrain":
        return PRETRAIN_STEPS * PRETRAIN_STEP_CPU_S
    if run.kind == "eval":
        return EVAL_CPU_S[run.source]
    return REAL.ft_steps * FT_STEP_CPU_S + FT_SCORE_CPU_S


@dataclass
class Driver:
    """Where the runs, the data and the records live, and at what scale the runs go."""

    root: Path
    data_root: Path
    ledger: Path = DEFAULT_LEDGER
    scale: Scale = REAL
    threads: int = 1
    init_ledger: Path = init_cifar.DEFAULT_LEDGER

    @property
    def eval_data(self) -> Path:
        return self.root / "eval-data"

    @property
    def ft_data(self) -> Path:
        """The whole split (``--smoke``: init_cifar's small selection)."""
        return self.eval_data if self.scale.smoke else self.data_root

    def recorded(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.ledger.read_text()).get("runs", {}) if self.ledger.is_file() else {}

    def source_flags(self, source: str) -> list[str]:
        """``--init`` and what goes with it for a fine-tuning run from ``source``."""
        if source == "moco":
            return ["--init", str(self.root / "pretrain-moco" / "encoder.pt")]
        return ["--init", str(init_cifar.EFFNET), "--encoder", init_cifar.EFFNET_ENCODER,
                "--init-mean", *init_cifar.EFFNET_NORM, "--init-std", *init_cifar.EFFNET_NORM]

    def commands(self, run: Run) -> list[tuple[str, list[str]]]:
        """(what, command) of each step of ``run``: ``train``, or ``knn`` and ``probe``."""
        folder = self.root / run.name
        common = ["--cpu", "--mixed-precision", "no", "--num-workers", "1"]
        train = ["--progress", "false", "--save-every-steps", str(SAVE_EVERY),
                 "--output-dir", str(folder), "--resume", "auto", "--seed", str(run.seed)]
        if run.kind == "pretrain":
            return [("train", [sys.executable, str(ROOT / "recipes" / "moco_cifar.py"),
                               "--data", str(self.ft_data), "--image-size", "32",
                               "--batch-size", "256", "--queue-size", "4096",
                               *self.scale.pretrain, "--knn-every", "0", *common, *train])]
        source = SOURCE[run.source]
        if run.kind == "eval":
            weights = (["--checkpoint", str(self.root / "pretrain-moco" / "encoder.pt")]
                       if run.source == "moco" else
                       ["--checkpoint", str(init_cifar.EFFNET), "--encoder", init_cifar.EFFNET_ENCODER,
                        "--mean", *init_cifar.EFFNET_NORM, "--std", *init_cifar.EFFNET_NORM])
            return [(kind, [sys.executable, str(ROOT / "tools" / tool), *weights,
                            "--data", str(self.eval_data), "--image-size", str(source.image_size),
                            *common, "--output", str(folder / f"{kind}.json")])
                    for kind, tool in (("knn", "knn_eval.py"), ("probe", "linear_eval.py"))]
        return [("train", [sys.executable, "-m", "contrastive.launch.finetune", "--protocol", "sgd",
                           *self.source_flags(run.source), "--data", str(self.ft_data),
                           "--image-size", str(source.image_size), "--batch-size", str(self.scale.ft_batch),
                           "--steps", str(self.scale.ft_steps), "--val-fraction", "0.1",
                           "--label-fraction", f"{run.fraction:g}", "--data-seed", str(run.seed),
                           *common, *train])]

    def from_init_cifar(self, run: Run) -> dict[str, Any] | None:
        """The EfficientNet's kNN and probe from init_cifar's ledger (its row (a)), if there."""
        if run.kind != "eval" or run.source != "effnet" or self.scale.smoke or not self.init_ledger.is_file():
            return None
        rec = json.loads(self.init_ledger.read_text()).get("runs", {}).get("a-pretrained-s0")
        if rec is None:
            return None
        return {"knn_top1": rec["knn_top1"], "probe_top1": rec["probe_top1"], "cpu_s": 0.0,
                "eval_cpu_s": rec["eval_cpu_s"], "cpu": rec["cpu"], "commit": rec["commit"],
                "date": rec.get("date"), "commands": rec["commands"],
                "from": "benchmarks/results/init_cifar_runs.json a-pretrained-s0"}


def _finished(folder: Path, what: str) -> bool:
    return run_ledger.trained(folder) if what == "train" else (folder / f"{what}.json").is_file()


def execute(run: Run, d: Driver) -> dict[str, Any]:
    """Run (or resume) ``run``'s steps in child processes and record it; what happened."""
    return run_ledger.exclusive(d.root, run.name, lambda: run.name in d.recorded(),
                                lambda: _execute(run, d))


def _execute(run: Run, d: Driver) -> dict[str, Any]:
    borrowed = d.from_init_cifar(run)
    if borrowed is not None:
        return _record(run, d, borrowed)
    if run.kind != "pretrain" and run.source == "moco" and not run_ledger.trained(d.root / "pretrain-moco"):
        return {"skipped": "the MoCo pretraining is not finished"}
    folder = d.root / run.name
    folder.mkdir(parents=True, exist_ok=True)
    times = folder / "timing.json"
    timings = json.loads(times.read_text()) if times.is_file() else []
    steps = d.commands(run)
    for what, cmd in steps:
        if _finished(folder, what):
            continue
        timing = {"what": what, **run_ledger.run_timed(cmd, d.root / f"{run.name}.log", d.threads)}
        timings.append(timing)
        times.write_text(json.dumps(timings, indent=1))
        if timing["rc"] != 0 or not _finished(folder, what):
            return timing
    if run.kind == "ft":
        run_ledger.prune_checkpoints(folder)
    return _record(run, d, _result(run, d, folder, timings, [c for _, c in steps]))


def _result(run: Run, d: Driver, folder: Path, timings: list[dict[str, Any]],
            commands: list[list[str]]) -> dict[str, Any]:
    from contrastive.hardware import cpu_kind_line

    rec: dict[str, Any] = {
        "cpu_s": round(sum(t["cpu_s"] for t in timings if t["what"] == "train"), 1),
        "wall_s": round(sum(t["wall_s"] for t in timings if t["what"] == "train"), 1),
        "eval_cpu_s": round(sum(t["cpu_s"] for t in timings if t["what"] != "train"), 1),
        "load": [t["load"] for t in timings], "cpu": cpu_kind_line(),
        "date": time.strftime("%Y-%m-%d"), "commit": run_ledger.git_commit(),
        "commands": [" ".join(c).replace(str(ROOT) + "/", "") for c in commands]}
    if run.kind == "eval":
        rec |= {k: init_cifar.top1(folder / f"{k.split('_')[0]}.json") for k in ("knn_top1", "probe_top1")}
    elif run.kind == "ft":
        results = json.loads((folder / "results.json").read_text())
        rec |= {k: results.get(k) for k in ("val_top1", "val_top5", "test_top1", "test_top5")}
        rec["final_step"] = run_ledger.final_step(folder)
    else:
        rec |= {"final_step": run_ledger.final_step(folder),
                "digest": run_ledger.recipe_digest("moco_cifar.py")}
    return rec


def _record(run: Run, d: Driver, rec: dict[str, Any]) -> dict[str, Any]:
    rec = {"kind": run.kind, "source": run.source, "fraction": run.fraction, "seed": run.seed,
           "smoke": d.scale.smoke, **rec}
    run_ledger.update_json(d.ledger, lambda data: data["runs"].__setitem__(run.name, rec), {"runs": {}})
    return rec


def plan_lines(records: dict[str, dict[str, Any]]) -> list[str]:
    """``plan``'s report: every run, done or to do, its CPU minutes (recorded, else estimated)."""
    lines, total = [], 0.0
    for r in plan():
        rec = records.get(r.name)
        cpu = rec["cpu_s"] + rec["eval_cpu_s"] if rec else estimate_cpu_s(r)
        total += cpu
        lines.append(f"{'done' if rec else 'todo'}  {r.name:22s} {cpu / 60:6.1f} CPU min "
                     f"({'recorded' if rec else 'estimated'})")
    lines.append(f"total {total / 3600:.2f} CPU hours (recorded + estimated; the estimates are "
                 "upper bounds from a loaded machine)")
    return lines


def run_all(d: Driver, workers: int, sources: tuple[str, ...] = tuple(SOURCE)) -> None:
    """Run what is not recorded (the pretraining first: the MoCo runs wait for it); a failed run
    is retried by the next call (its log: ``ROOT/NAME.log``). ``sources``: only these sources'
    runs (``effnet`` alone needs no pretraining: its runs fit on a machine with an hour or two
    left, where the MoCo pretraining, about 2 CPU hours, might not finish)."""
    init_cifar.make_data(d.data_root, d.eval_data,
                         init_cifar.Scale(32, d.scale.eval_per_class, d.scale.eval_test_per_class, ()))
    chosen = [r for r in plan() if r.source in sources]
    for batch in ([r for r in chosen if r.kind == "pretrain"], [r for r in chosen if r.kind != "pretrain"]):
        todo = [r for r in batch if r.name not in d.recorded()]
        print(f"[{time.strftime('%H:%M:%S')}] {len(todo)} runs to do", flush=True)
        with ThreadPoolExecutor(workers) as pool:
            for run, result in zip(todo, pool.map(lambda r: execute(r, d), todo)):
                shown = {k: v for k, v in result.items() if k in ("knn_top1", "probe_top1", "test_top1",
                                                                  "cpu_s", "rc", "skipped", "done")}
                print(f"[{time.strftime('%H:%M:%S')}] {run.name}: {shown}", flush=True)


def table(records: dict[str, dict[str, Any]], reading: str = "") -> str:
    """The markdown of ``results/after_cifar.md``: one row per source (seeds summarised: mean
    +- sample sd), the CPU kinds, and the lead's reading (kept from the file replaced)."""
    lines = ["# Issue 50 step 5: after pretraining (CIFAR-10 JPEG copy, CPU scale)", "",
             "Written by `python benchmarks/after_cifar.py table` from `results/after_cifar_runs.json`; "
             "the design is in the driver's docstring. Top-1 on the test split in %; fine-tuning: "
             f"{REAL.ft_steps} steps at batch {REAL.ft_batch} (SimCLR's SGD protocol) on the fraction of the "
             "labels named, validation top-1 in brackets.", "",
             "| source | kNN | linear probe | fine-tuned, 100 % | 10 % | 1 % |", "|---|---|---|---|---|---|"]
    smoke = any(r.get("smoke") for r in records.values())
    for s in SOURCES:
        ev = records.get(Run("eval", s.key).name, {})
        cells = [init_cifar.summary([ev["knn_top1"]]) if "knn_top1" in ev else "-",
                 init_cifar.summary([ev["probe_top1"]]) if "probe_top1" in ev else "-"]
        for f in FRACTIONS:
            recs = [records[n] for n in (Run("ft", s.key, f, seed).name for seed in SEEDS[f]) if n in records]
            test = [r["test_top1"] for r in recs if r.get("test_top1") is not None]
            val = [r["val_top1"] for r in recs if r.get("val_top1") is not None]
            cells.append(f"{init_cifar.summary(test)} ({init_cifar.summary(val)})" if test else "-")
        lines.append(f"| {s.title}{' (smoke)' if smoke else ''} | " + " | ".join(cells) + " |")
    kinds = sorted({r["cpu"] for r in records.values()})
    cpu_h = sum(r["cpu_s"] + r["eval_cpu_s"] for r in records.values()) / 3600
    lines += ["", f"CPU kind: {'; '.join(kinds) or '-'}. CPU hours recorded: {cpu_h:.2f}.", "",
              READING, "", reading.strip() or "(the lead's reading: to be written once the runs are in)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("plan", "run", "table"))
    p.add_argument("--root", type=Path, default=ROOT.parent / "runs50" / "cifar",
                   help="the run folders (outside git; default %(default)s)")
    p.add_argument("--data-root", type=Path, default=Path("/tmp/ft49"),
                   help="the unpacked CIFAR-10 JPEG copy: train/<class>/, test/<class>/")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ledger", type=Path, default=None,
                   help=f"the runs' records (default {DEFAULT_LEDGER}; --smoke: ROOT/ledger.json)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"the table (default {DEFAULT_TABLE}; --smoke: ROOT/after_cifar.md)")
    p.add_argument("--smoke", action="store_true", help="2 steps, 120 + 10 images a class: minutes")
    p.add_argument("--sources", default=",".join(SOURCE),
                   help="run only these sources' runs, comma-separated (default: %(default)s)")
    a = p.parse_args(argv)
    sources = tuple(s.strip() for s in a.sources.split(",") if s.strip())
    if not sources or set(sources) - set(SOURCE):
        print(f"after_cifar: --sources {a.sources!r}: give some of {','.join(SOURCE)}")
        return 2
    if a.smoke and a.root.resolve() == p.get_default("root").resolve():
        print("after_cifar: --smoke needs its own --root (its runs have the real runs' names)")
        return 2
    d = Driver(a.root, a.data_root, a.ledger or (a.root / "ledger.json" if a.smoke else DEFAULT_LEDGER),
               SMOKE if a.smoke else REAL, a.threads)
    if a.command == "plan":
        print("\n".join(plan_lines(d.recorded())))
    elif a.command == "run":
        if not init_cifar.EFFNET.is_file():
            print(f"after_cifar: needs the pretrained file {init_cifar.EFFNET} (../shared/data/README.md)")
            return 2
        try:
            run_all(d, a.workers, sources)
        except FileNotFoundError as e:
            print(e)
            return 2
    else:
        out = a.out or (a.root / "after_cifar.md" if a.smoke else DEFAULT_TABLE)
        text = table(d.recorded(), init_cifar.read_reading(out))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
