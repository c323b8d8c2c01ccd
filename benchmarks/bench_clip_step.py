"""The CLIP step through the engine (recipes/clip.py) against the loop it replaced, side by side.

- ``loop``: the hand-written loop of the deleted ``recipes/clip_shapes.py`` (the reference
  approach): ``build_loader`` over ``shapes_captions`` (shuffle, 0 workers, images scaled in
  the data set), ``set_lr``, ``model(batch)``, ``zero_grad``, ``backward``, ``step``.
- ``engine``: ``recipes/clip.py`` (the engine's seeded sampler, the image-text adapter with its
  device half, the step with its non-finite guard and post-step hook, metrics windows).

Both: the recipe's defaults (shapes 32 px, small_cnn + 2 x 64 BERT, batch 128, AdamW, fp32),
``--warmup`` steps untimed, then ``--steps`` steps timed (the engine's from its metrics.jsonl
windows, which exclude set-up, checkpoints and evaluation). Repeats alternate loop, engine,
loop, engine ... in one process; we report the median time per step of each, the spread
(min-max) and the ratio of the medians (engine speed / loop speed).

    python benchmarks/bench_clip_step.py [--repeats 5 --warmup 5 --steps 20 --threads 2]
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

from contrastive.hardware import cpu_kind_line

ROOT = Path(__file__).resolve().parents[1]
BATCH = 128


def loop_seconds_per_step(warmup: int, steps: int, seed: int = 0) -> float:
    """The old loop's time per step over ``steps`` steps after ``warmup`` untimed ones."""
    from contrastive.data import build_loader
    from contrastive.data.captions import caption_tokenizer, shapes_captions
    from contrastive.data.generated import shape_captions
    from contrastive.engine.optim import build_optimizer, set_lr
    from contrastive.methods import CLIP

    tok = caption_tokenizer(shape_captions(5000, 0, "train"), vocab_size=200, max_length=16)
    torch.manual_seed(seed)
    model = CLIP(encoder="small_cnn", text_encoder="bert", dim=64, text_kwargs=dict(
        num_layers=2, hidden_size=64, num_heads=2, vocab_size=tok.vocab_size,
        max_position_embeddings=16, pooling="mean"))
    opt = build_optimizer(model, "adamw", lr=2e-3, weight_decay=0.1, betas=(0.9, 0.98))
    train = shapes_captions(tok, n=5000, size=32, seed=0, transform=lambda x: x.float() / 255)
    loader = build_loader(train, BATCH, shuffle=True, num_workers=0, seed=seed)
    model.train()
    step, t0 = 0, 0.0
    for images, _, tokens in loader:
        if step == warmup:
            t0 = time.perf_counter()
        set_lr(opt, 2e-3)
        res = model({"views": [images], **tokens})
        opt.zero_grad(set_to_none=True)
        res["loss"].backward()
        opt.step()
        step += 1
        if step == warmup + steps:
            break
    return (time.perf_counter() - t0) / steps


def engine_seconds_per_step(warmup: int, steps: int, seed: int = 0) -> float:
    """recipes/clip.py's time per step from its metrics windows (``warmup`` steps a window)."""
    import importlib.util

    from contrastive.engine import reset_accelerate_state

    spec = importlib.util.spec_from_file_location("recipe_clip", ROOT / "recipes" / "clip.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["recipe_clip"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        reset_accelerate_state()
        out = Path(tmp) / "run"
        mod.main(["--output-dir", str(out), "--seed", str(seed), "--max-steps",
                  str(warmup + steps), "--log-every", str(warmup), "--save-every-steps", "0",
                  "--eval-max", "0", "--mixed-precision", "no", "--progress", "false",
                  "--cpu"])
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        windows = [r for r in recs if "samples_per_s" in r and r["step"] > warmup]
        if steps % warmup:
            raise SystemExit("--steps must be a multiple of --warmup (the metrics window)")
        seconds = sum(warmup * BATCH / r["samples_per_s"] for r in windows)
        return seconds / (len(windows) * warmup)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.basicConfig(level=logging.WARNING)
    times: dict[str, list[float]] = {"loop": [], "engine": []}
    for r in range(args.repeats):
        for name, fn in (("loop", loop_seconds_per_step), ("engine", engine_seconds_per_step)):
            t = fn(args.warmup, args.steps)
            times[name].append(t)
            print(f"repeat {r} {name}: {t * 1000:.1f} ms/step", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "cpu": cpu_kind_line(), "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(), "torch": torch.__version__,
        "ms_per_step_median": {k: round(v * 1000, 1) for k, v in med.items()},
        "ms_per_step_spread": {k: [round(min(v) * 1000, 1), round(max(v) * 1000, 1)]
                               for k, v in times.items()},
        "engine_speed_vs_loop": round(med["loop"] / med["engine"], 3)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
