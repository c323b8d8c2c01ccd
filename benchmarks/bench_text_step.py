#!/usr/bin/env python
"""The text training step through the engine (``recipes/bert_finetune.py``) against the old side
loop it replaced (``contrastive/text/loop.py``, deleted; give its file), in one process,
alternated repeats: steady-state seconds per optimiser step, and the engine's bf16 / fp32 ratio.

    git show ea6ddf9:contrastive/text/loop.py > /tmp/old_loop.py
    OMP_NUM_THREADS=1 hold_nice python benchmarks/bench_text_step.py --old-loop /tmp/old_loop.py

The model is the LRC-BERT learning check's teacher (BERT 6 x 128, 4 heads), batch 32 of the
generated task, AdamW; the time per step is taken between the logs of steps ``--skip`` and
``--steps`` (the first steps and the set-up excluded), from ``metrics.jsonl``'s time stamps for
the engine and from the log callback for the old loop.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZE = dict(num_layers=6, hidden_size=128, num_heads=4)


def main() -> None:
    from lrc_check import run_recipe

    from contrastive.data.text_tasks import generated_tokenizer, load_task
    from contrastive.hardware import cpu_kind_line
    from contrastive.methods.text_classifier import TextClassifier
    from contrastive.nn.text_encoders import build_text_encoder

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old-loop", required=True, help="the old contrastive/text/loop.py")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("old_loop", args.old_loop)
    assert spec is not None and spec.loader is not None
    old_loop = importlib.util.module_from_spec(spec)
    sys.modules["old_loop"] = old_loop  # its dataclass looks its module up
    spec.loader.exec_module(old_loop)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.disable(logging.INFO)
    k, w, b = args.steps, args.skip, args.batch_size
    tok = generated_tokenizer()
    task = load_task("generated", n_train=4000, n_dev=200)

    def old() -> float:
        torch.manual_seed(0)
        model = TextClassifier(build_text_encoder(**SIZE, vocab_size=tok.vocab_size), 2)
        stamps: dict[int, float] = {}
        cfg = old_loop.TextTrainConfig(steps=k, batch_size=b, lr=5e-4, log_every=w)
        old_loop.train_text(model, task.train, tok.collate, cfg,
                            on_log=lambda r: stamps.__setitem__(r["step"], time.perf_counter()))
        return (stamps[k] - stamps[w]) / (k - w)

    def engine(precision: str) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            run_recipe("bert_finetune", [
                "--task", "generated", "--n-train", "4000", "--n-dev", "200", "--layers", "6",
                "--hidden", "128", "--heads", "4", "--intermediate-size", "0", "--batch-size",
                str(b), "--steps", str(k), "--lr", "5e-4", "--max-length", "64", "--log-every",
                str(w), "--mixed-precision", precision, "--progress", "false", "--num-workers",
                "0", "--save-every-steps", "0"], out)
            recs = {r["step"]: r["time"] for r in map(json.loads, (out / "metrics.jsonl")
                                                      .read_text().splitlines()) if "loss" in r}
        return (recs[k] - recs[w]) / (k - w)

    print(f"{cpu_kind_line()}; load average {os.getloadavg()[0]:.2f}; threads "
          f"{torch.get_num_threads()}", flush=True)
    res: dict[str, list[float]] = {"old_fp32": [], "engine_fp32": [], "engine_bf16": []}
    for i in range(args.repeats):
        res["old_fp32"].append(old())
        res["engine_fp32"].append(engine("no"))
        res["engine_bf16"].append(engine("bf16"))
        print(i, {n: round(v[-1], 4) for n, v in res.items()}, flush=True)
    med = {n: statistics.median(v) for n, v in res.items()}
    print("median s/step", {n: round(v, 4) for n, v in med.items()}, "range",
          {n: (round(min(v), 4), round(max(v), 4)) for n, v in res.items()})
    print(f"engine speed / old loop (fp32): {med['old_fp32'] / med['engine_fp32']:.3f}; engine "
          f"bf16 / fp32 step time: {med['engine_bf16'] / med['engine_fp32']:.3f}; load average "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
