#!/usr/bin/env python
"""``recipes/moco_cifar.py`` step time, side by side: the tree at ``--before`` vs this tree.

Written for issue 14 (one method contract: ``forward(batch)``, schedules evaluated by the loop,
parameter groups): it checks that the new contract costs nothing per step. Each run is a fresh
subprocess of the recipe from one tree (``PYTHONPATH`` = that tree), alternating before / after
``--repeats`` times, on generated 32 px data (no disk I/O in the timing); the step time is taken
from ``metrics.jsonl``'s wall-clock ``time`` between step ``--warmup`` and the last step (start-up
excluded), and the median per tree is reported with the spread of the repeats. On a shared
machine the load of other jobs changes a run's mean step time several-fold, so the fastest single
step of each run (``min``, as ``timeit`` reports) is given too: it is the least disturbed figure.

    python benchmarks/bench_contract.py --before b7ea12a --encoders cifar_resnet18,small_cnn
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def export_tree(rev: str, dest: Path) -> Path:
    """The files of revision ``rev`` (``git archive``) under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return dest


def step_seconds(tree: Path, encoder: str, args: argparse.Namespace,
                 out: Path) -> tuple[float, float]:
    """(mean, fastest) seconds per optimiser step of one fresh run, steps warmup..last."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(args.threads),
               CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, str(tree / "recipes" / "moco_cifar.py"),
           "--data", f"synthetic:n={args.images},size=32", "--image-size", "32",
           "--encoder", encoder, "--batch-size", str(args.batch_size), "--epochs", "1",
           "--max-steps", str(args.steps), "--num-workers", str(args.workers),
           "--log-every", "1", "--progress", "false", "--knn-every", "0",
           "--mixed-precision", "no", "--save-every-epochs", "0", "--seed", "0",
           "--output-dir", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    times = {r["step"]: r["time"] for r in records if "loss" in r}
    steps = [times[s + 1] - times[s] for s in range(args.warmup, args.steps)]
    return (times[args.steps] - times[args.warmup]) / (args.steps - args.warmup), min(steps)


def main() -> int:
    from contrastive.hardware import cpu_kind_line

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision to compare against")
    p.add_argument("--encoders", default="cifar_resnet18,small_cnn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--json", default="")
    args = p.parse_args()
    results: dict[str, dict[str, list[tuple[float, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": export_tree(args.before, Path(tmp) / "before"), "after": ROOT}
        for encoder in args.encoders.split(","):
            results[encoder] = {"before": [], "after": []}
            for rep in range(args.repeats):
                for name, tree in trees.items():  # alternate A B A B
                    sec, fastest = step_seconds(tree, encoder, args,
                                                Path(tmp) / f"run_{encoder}_{name}_{rep}")
                    results[encoder][name].append((sec, fastest))
                    print(f"{encoder} {name} repeat {rep}: {1000 * sec:.1f} ms/step mean, "
                          f"{1000 * fastest:.1f} fastest", flush=True)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
                         capture_output=True, text=True).stdout.strip()
    print(f"\nmoco_cifar, batch {args.batch_size}, 32 px, {args.workers} loader worker(s), "
          f"{args.threads} threads, steps {args.warmup}-{args.steps}, {args.repeats} repeats, "
          f"{cpu_kind_line()}; before = {rev}\n")
    print("| encoder | statistic | before ms/step: median (min-max of runs) | after | "
          "after / before |")
    print("| --- | --- | --- | --- | --- |")
    for encoder, r in results.items():
        for i, stat in enumerate(("mean step", "fastest step")):
            b = [x[i] * 1000 for x in r["before"]]
            a = [x[i] * 1000 for x in r["after"]]
            mb, ma = statistics.median(b), statistics.median(a)
            print(f"| {encoder} | {stat} | {mb:.0f} ({min(b):.0f}-{max(b):.0f}) | {ma:.0f} "
                  f"({min(a):.0f}-{max(a):.0f}) | {ma / mb:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
