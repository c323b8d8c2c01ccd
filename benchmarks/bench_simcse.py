"""SimCSE on the generated task: STS Spearman of the random-init and the trained encoder, per seed.

Runs ``recipes/simcse.py`` in-process (through the engine, fp32) for a few settings and seeds and
prints a markdown table (and one JSON line per run); the figures are its STS evaluator's records
(``sts_when`` start and end) in ``metrics.jsonl``. The settings are the learning check's
(tests/text/test_simcse_recipe.py ``FAST`` / ``SLOW``) plus the paper's [CLS] pooling and the
unsupervised variant at the SLOW budget (no learning claim for those).

Usage:
    python benchmarks/bench_simcse.py [--seeds 0 1 2] [--settings fast slow slow_cls unsup_slow]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--layers", "2", "--hidden", "64", "--heads", "2", "--vocab-size", "300",
        "--log-every", "50", "--progress", "false", "--mixed-precision", "no", "--num-workers",
        "0", "--save-every-steps", "0"]
FAST = ["--mode", "sup", "--pooling", "avg", "--lr", "1e-3", "--n-train", "2000",
        "--batch-size", "32", "--steps", "40", "--eval-every", "0", "--n-eval", "500", *TINY]
SLOW = ["--lr", "1e-3", "--n-train", "8000", "--batch-size", "64", "--steps", "100",
        "--eval-every", "0", "--n-eval", "1000", *TINY]
SETTINGS = {
    "fast": FAST,
    "slow": ["--mode", "sup", "--pooling", "avg", *SLOW],
    "slow_cls": ["--mode", "sup", "--pooling", "cls", *SLOW],
    "unsup_slow": ["--mode", "unsup", "--pooling", "cls", *SLOW],
    "unsup_slow_avg": ["--mode", "unsup", "--pooling", "avg", *SLOW],
}


def _recipe():
    spec = importlib.util.spec_from_file_location("simcse_recipe", ROOT / "recipes" / "simcse.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["simcse_recipe"] = module
    spec.loader.exec_module(module)
    return module


def _train(recipe, argv: list[str]) -> dict[str, float]:
    """One run through the engine: STS Spearman before (``initial``) and after (``final``)."""
    from contrastive.engine import reset_accelerate_state

    with tempfile.TemporaryDirectory() as tmp:
        reset_accelerate_state()
        out = Path(tmp) / "run"
        start = time.time()
        recipe.main([*argv, "--output-dir", str(out)])
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = {r["sts_when"]: r["sts_spearman"] for r in recs if "sts_when" in r}
    return {"initial": evals["start"], "final": evals["end"], "seconds": time.time() - start}


def main() -> None:
    from contrastive.hardware import cpu_kind_line

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = p.parse_args()
    recipe = _recipe()
    rows = []
    for name in args.settings:
        initial, final = [], []
        start = time.time()
        for seed in args.seeds:
            res = _train(recipe, [*SETTINGS[name], "--seed", str(seed)])
            initial.append(res["initial"])
            final.append(res["final"])
            print(json.dumps({"setting": name, "seed": seed, "initial": res["initial"],
                              "final": res["final"], "seconds": res["seconds"]}), flush=True)
        per_run = (time.time() - start) / len(args.seeds)
        rows.append((name, initial, final, per_run))
    print(f"\n{cpu_kind_line()}; load average at the end: {os.getloadavg()[0]:.1f}\n")
    print("| setting | random init (per seed) | trained (per seed) | mean gain | spread (max-min) "
          "init / trained | s per run |")
    print("|---|---|---|---|---|---|")
    for name, initial, final, per_run in rows:
        gain = statistics.mean(f - i for f, i in zip(final, initial))
        print(f"| {name} | {', '.join(f'{x:.3f}' for x in initial)} | "
              f"{', '.join(f'{x:.3f}' for x in final)} | {gain:+.3f} | "
              f"{max(initial) - min(initial):.3f} / {max(final) - min(final):.3f} | {per_run:.0f} |")


if __name__ == "__main__":
    main()
