"""The SimCSE step through the engine (recipes/simcse.py) against the loop it replaced, side by side.

- ``loop``: the hand-written loop of the old ``recipes/simcse.py`` (before issue 28), reproduced
  here: a ``DataLoader`` (shuffle, drop_last, 0 workers) with ``GroupCollate`` over the generated
  NLI triples, AdamW, ``LambdaLR`` linear decay, ``model(batch)``, ``zero_grad``, ``backward``,
  grad-norm clip 1.0, ``step``.
- ``engine``: ``recipes/simcse.py`` (the engine's seeded sampler, the text adapter tokenising
  in the loader's collate, the step with its non-finite guard, metrics windows), fp32.
- ``engine_bf16`` (unless ``--no-bf16``): the same in bf16 autocast, for the bf16 / fp32 ratio.

Both: supervised SimCSE with hard negatives on ``--n-train`` generated triples, a BERT of
``--layers`` x ``--hidden`` (the learning check's tiny model), avg pooling, a 300-piece
WordPiece vocabulary, max length 32, global batch ``--batch-size``, one process. ``--warmup``
steps untimed, then ``--steps`` timed (the engine's from its metrics.jsonl timestamps, which
exclude set-up, evaluation and checkpoints: none fall inside the timed window). Repeats
alternate loop, engine, (engine_bf16,) loop, engine ... in one process; we report the median
time per step of each, the spread (min-max) and the ratio of the medians (engine speed / loop
speed). About 1-2 minutes on 2 CPU cores.

    python benchmarks/bench_simcse_step.py [--repeats 5 --warmup 5 --steps 20 --threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(layers=2, hidden=64, heads=2, vocab_size=300)


def _data(n_train: int):
    from contrastive.data.generated_text import generate_nli
    from contrastive.data.text_batches import nli_groups
    from contrastive.data.tokenizer import train_wordpiece

    groups = nli_groups(generate_nli(n_train, seed=0, split="train"))
    tok = train_wordpiece([s for g in groups.groups for s in g], vocab_size=MODEL["vocab_size"],
                          max_length=32)
    return groups, tok


def loop_seconds_per_step(args: argparse.Namespace, seed: int = 0) -> float:
    """The old loop's time per step over ``--steps`` steps after ``--warmup`` untimed ones."""
    from torch.utils.data import DataLoader

    from contrastive.data.text_batches import GroupCollate
    from contrastive.methods import SimCSE

    groups, tok = _data(args.n_train)
    torch.manual_seed(seed)
    method = SimCSE("bert", pooling="avg", temperature=0.05, encoder_kwargs=dict(
        num_layers=MODEL["layers"], hidden_size=MODEL["hidden"], num_heads=MODEL["heads"],
        vocab_size=tok.vocab_size, dropout=0.1, attention_dropout=0.1))
    loader = DataLoader(groups, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        collate_fn=GroupCollate(tok),
                        generator=torch.Generator().manual_seed(seed))
    total = args.warmup + args.steps
    opt = torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=1e-3,
                            betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
    method.train()
    step, t0 = 0, 0.0
    for batch in loader:
        if step == args.warmup:
            t0 = time.perf_counter()
        out = method(batch)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(method.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step == total:
            break
    return (time.perf_counter() - t0) / args.steps


def engine_seconds_per_step(args: argparse.Namespace, precision: str = "no",
                            seed: int = 0) -> float:
    """recipes/simcse.py's time per step, from the timestamps of its metrics records."""
    import importlib.util

    from contrastive.engine import reset_accelerate_state

    spec = importlib.util.spec_from_file_location("recipe_simcse", ROOT / "recipes" / "simcse.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]  (its dataclass looks itself up)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        reset_accelerate_state()
        out = Path(tmp) / "run"
        mod.main(["--output-dir", str(out), "--seed", str(seed), "--mode", "sup", "--pooling",
                  "avg", "--lr", "1e-3", "--n-train", str(args.n_train), "--batch-size",
                  str(args.batch_size), "--steps", str(args.warmup + args.steps), "--layers",
                  str(MODEL["layers"]), "--hidden", str(MODEL["hidden"]), "--heads",
                  str(MODEL["heads"]), "--vocab-size", str(MODEL["vocab_size"]), "--eval",
                  "none", "--keep-best", "", "--log-every", str(args.warmup),
                  "--save-every-steps", "0", "--save-every-epochs", "0", "--mixed-precision",
                  precision, "--progress", "false", "--num-workers", "0", "--cpu"])
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        times = {r["step"]: r["time"] for r in recs if "loss" in r}
        return (times[args.warmup + args.steps] - times[args.warmup]) / args.steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-bf16", action="store_true", help="skip the engine's bf16 runs")
    args = p.parse_args(argv)
    if args.steps % args.warmup:
        raise SystemExit("--steps must be a multiple of --warmup (the metrics window)")
    if args.n_train < (args.warmup + args.steps) * args.batch_size:
        raise SystemExit("--n-train must cover the timed steps in one epoch (no epoch-end save)")
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.basicConfig(level=logging.WARNING)
    from contrastive.hardware import cpu_kind_line

    runs = {"loop": lambda: loop_seconds_per_step(args),
            "engine": lambda: engine_seconds_per_step(args, "no")}
    if not args.no_bf16:
        runs["engine_bf16"] = lambda: engine_seconds_per_step(args, "bf16")
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.repeats):
        for name, fn in runs.items():
            t = fn()
            times[name].append(t)
            print(f"repeat {r} {name}: {t * 1000:.1f} ms/step", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    report = {
        "cpu": cpu_kind_line(), "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(), "torch": torch.__version__,
        "ms_per_step_median": {k: round(v * 1000, 2) for k, v in med.items()},
        "ms_per_step_spread": {k: [round(min(v) * 1000, 2), round(max(v) * 1000, 2)]
                               for k, v in times.items()},
        "engine_speed_vs_loop": round(med["loop"] / med["engine"], 3)}
    if "engine_bf16" in med:
        report["bf16_over_fp32_step_time"] = round(med["engine_bf16"] / med["engine"], 3)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
