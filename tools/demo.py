#!/usr/bin/env python
"""``make demo``: pretrain MoCo (the CIFAR-10 demo setup) for a few CPU minutes, then show what it learned.

1. Pretrain: the ``recipes/moco_cifar.py`` setup (the official MoCo CIFAR-10 demo: linear head,
   MoCo v2 augmentation without blur, split BN 8) scaled down to a 2-core CPU: the ``small_cnn``
   encoder (~0.4M parameters), 24 px images, batch 128, SGD lr 0.06 with a per-step cosine
   schedule, a 2,048-key queue, momentum 0.99, temperature 0.2, whole-image crops (aspect-ratio
   jitter, flips and colour jitter only), ``--mixed-precision auto`` (bf16 autocast where the
   CPU or GPU computes bf16 natively, fp32 elsewhere: emulated bf16 is ~10x slower), the kNN
   monitor a few times during training. It is the setup of the engine's learning check
   (``tests/recipes/test_learning.py``), run longer. Data: the built-in ``shapes`` (10 classes
   of drawn shapes, generated offline), or any ``--data`` spec.
2. Evaluate the random-init encoder and the pretrained one with the linear probe (cached
   protocol, its default 100 epochs; until 2026-11-27 the demo ran 50, which left its figure
   1.5 points lower on the AVX-512-bf16 kind) and the weighted kNN (k 200, t 0.1) on the
   held-out split; print a table.
3. Write the training curves (``<run>/curves.png``) and a t-SNE map of the pretrained
   embeddings (``<run>/embedding.png``); the figures also go to ``<run>/demo.json`` with what
   they depend on besides the seed (library versions, thread count, the CPU kind, the
   precision, git commit): the run is seeded, but another torch / thread count / CPU /
   precision sums floats in another order, and 1,248 training steps turn that into a few points
   of accuracy. ``--record FILE`` appends them to a collection (benchmarks/results/demo.md
   quotes benchmarks/results/demo_figures.json).

    python tools/demo.py                       # shapes: 1,248 steps, 7 minutes on 2 AVX2 cores (fp32)
    python tools/demo.py --data imagefolder:/path/to/folder --steps 1000
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from contrastive.hardware import PRECISIONS, cpu_kind, cpu_kind_line

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("demo")


def load_recipe(name: str = "moco_cifar"):
    """The recipe module (recipes/ is a folder of scripts, not a package)."""
    path = ROOT / "recipes" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"recipe not found: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def train_size(data: str) -> int:
    from contrastive.data import get_dataset

    return len(get_dataset(data, "train"))


def evaluate(loaded, data: str, *, image_size: int, mean, std, workers: int, probe_epochs: int) -> dict:
    from contrastive.eval.runner import knn_eval, linear_eval

    common = {"image_size": image_size, "mean": mean, "std": std, "num_workers": workers, "batch_size": 256}
    lin = linear_eval(loaded, data, protocol="cached", epochs=probe_epochs, **common)
    knn = knn_eval(loaded, data, k=200, temperature=0.1, **common)
    return {"linear_top1": lin["top1"], "knn_top1": knn["top1"], "linear": lin, "knn": knn}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="shapes:size=24", help="any --data spec with a labelled test split")
    p.add_argument("--output-dir", default="runs/demo")
    p.add_argument("--steps", type=int, default=1248, help="about this many optimiser steps (whole epochs)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.06, help="absolute (no batch-size scaling)")
    p.add_argument("--encoder", default="small_cnn")
    p.add_argument("--image-size", type=int, default=24)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--probe-epochs", type=int, default=100,
                   help="cached linear probe epochs (100: the protocol's default, as "
                   "contrastive-linear-eval and benchmarks/bench_methods.py)")
    p.add_argument("--crop-min", type=float, default=1.0,
                   help="smallest RandomResizedCrop area: 1.0 keeps the whole (small) image with "
                   "aspect-ratio jitter only; with 0.08-0.2 crops often cut the shape away and "
                   "MoCo on shapes fell below random init at CPU-minute budgets (measured)")
    p.add_argument("--split-bn", type=int, default=8,
                   help="split-BN groups, as the MoCo CIFAR demo (0 = plain BN)")
    p.add_argument("--mixed-precision", default="auto", choices=PRECISIONS,
                   help="auto: bf16 where the CPU / GPU computes it natively, fp32 elsewhere")
    p.add_argument("--keep", action="store_true", help="keep an existing output folder (resume)")
    p.add_argument("--record", default=None, metavar="JSON",
                   help="also append this run's figures to JSON's 'runs' (the figures "
                   "benchmarks/results/demo.md quotes: benchmarks/results/demo_figures.json)")
    args, recipe_extra = p.parse_known_args(argv)
    from contrastive.engine import run, setup_logging
    from contrastive.eval.checkpoint import load_encoder
    from contrastive.eval.plot import plot_curves, plot_embedding, read_metrics

    setup_logging()
    env = environment()  # before the run: the commit and versions it started with
    out = Path(args.output_dir)
    if out.exists() and not args.keep:
        shutil.rmtree(out)  # the demo's own folder: a fresh run each time
    recipe = load_recipe("moco_cifar")
    n_train = train_size(args.data)
    steps_per_epoch = max(1, n_train // args.batch_size)
    epochs = max(1, math.ceil(args.steps / steps_per_epoch))
    recipe_argv = [
        "--data", args.data, "--encoder", args.encoder, "--image-size", str(args.image_size),
        "--epochs", str(epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
        "--lr-scaling", "none", "--schedule-per", "step", "--crop-min", str(args.crop_min),
        "--knn-feature", "backbone", "--queue-size", "2048", "--temperature", "0.2", "--momentum", "0.99",
        "--split-bn", str(args.split_bn), "--mixed-precision", args.mixed_precision, "--num-workers", str(args.workers),
        "--output-dir", str(out), "--knn-every", str(max(1, epochs // 4)), "--knn-max-train", "5000",
        "--knn-max-test", "1000", "--save-every-epochs", "0", "--save-every-steps", "0", "--log-every", "5",
        *(["--cpu"] if not torch.cuda.is_available() else []),
        *(["--resume", "auto"] if args.keep else []),
        *recipe_extra,
    ]
    log.info("pretraining MoCo (%s, %d epochs of %d steps) on %s", args.encoder, epochs, steps_per_epoch, args.data)
    t0 = time.perf_counter()
    result = run(recipe.MoCoCifar, recipe.build_method, recipe.build_pipeline, argv=recipe_argv, name="demo")
    train_s = time.perf_counter() - t0

    torch.manual_seed(0)
    random_init = load_encoder("random", encoder=args.encoder)
    pretrained = load_encoder(out)
    norm = {k: pretrained.setting(k) for k in ("mean", "std")}  # recorded by the engine in encoder.pt
    t1 = time.perf_counter()
    figures = {
        "random init": evaluate(random_init, args.data, image_size=args.image_size, workers=args.workers,
                                probe_epochs=args.probe_epochs, **norm),
        f"MoCo, {result.step} steps": evaluate(pretrained, args.data, image_size=args.image_size,
                                                  workers=args.workers, probe_epochs=args.probe_epochs, **norm),
    }
    eval_s = time.perf_counter() - t1

    logged = {k for r in read_metrics(out) for k in r}
    keys = [k for k in ("loss", "lr", "knn_top1", "pos_acc", "embedding_std", "images_per_s") if k in logged]
    curves = plot_curves(out, out / "curves.png", keys=keys or None)
    from torch.utils.data import Subset

    from contrastive.eval.runner import encode_split, eval_transform, load_split

    test = load_split(args.data, "test", eval_transform(args.image_size, **norm))
    test = Subset(test, list(range(0, len(test), max(1, len(test) // 1500))))
    feats, labels = encode_split(pretrained, test, num_workers=args.workers)
    names = getattr(test.dataset, "classes", None)
    emb = plot_embedding(feats, labels, out / "embedding.png", class_names=names,
                         title=f"t-SNE of {len(labels)} test embeddings after {result.step} MoCo steps")

    width = max(len(k) for k in figures) + 2
    lines = [
        "",
        f"{'encoder':<{width}}{'linear top-1':>14}{'kNN top-1':>12}",
        *(f"{k:<{width}}{v['linear_top1']:>13.1f}%{v['knn_top1']:>11.1f}%" for k, v in figures.items()),
        "",
        f"data {args.data}: {n_train} training images; pretraining {train_s / 60:.1f} min, "
        f"evaluation {eval_s / 60:.1f} min",
        f"curves: {curves}   embedding map: {emb}",
    ]
    print("\n".join(lines))
    env["precision"] = json.loads((out / "config.json").read_text())["mixed_precision"]
    summary = summarise(args.data, result.step, train_s, eval_s, figures, env)
    (out / "demo.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.record:
        record(summary, Path(args.record))
    return 0


def record(summary: dict, path: Path) -> None:
    """Append a demo.json summary to the ``runs`` of a collection file (created if missing)."""
    collection = json.loads(path.read_text()) if path.exists() else {"format": DEMO_FORMAT, "runs": []}
    collection["runs"].append(summary)
    path.write_text(json.dumps(collection, indent=2) + "\n")


DEMO_FORMAT = 1  # version of demo.json: bump when a key changes meaning
FIGURE_KEYS = ("linear_top1", "knn_top1")


def summarise(data: str, steps: int, train_s: float, eval_s: float, figures: dict,
              env: dict | None = None) -> dict:
    """What ``<run>/demo.json`` holds: the figures (percent, 2 decimals) per encoder row, and the
    environment they depend on (``env``, default :func:`environment` now).
    benchmarks/results/demo_figures.json collects such files."""
    return {
        "format": DEMO_FORMAT,
        "data": data,
        "steps": steps,
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(eval_s, 1),
        "results": {row: {k: round(float(v[k]), 2) for k in FIGURE_KEYS} for row, v in figures.items()},
        "environment": env if env is not None else environment(),
    }


def environment() -> dict:
    """What the demo's figures depend on besides its seed: library versions, the thread count
    (float sums are reduced in a different order with another count), the CPU / GPU."""
    import platform

    import numpy

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "machine": platform.machine(),
        "cpu": cpu_kind_line(),
        "cpu_kind": cpu_kind(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "git_commit": _git_commit(),
    }
    for name in ("faiss", "PIL", "sklearn"):
        try:
            env[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            env[name] = None
    return env


def _git_commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def cli(argv: list[str] | None = None) -> int:
    """``main`` for a person at a terminal: data problems (an unknown spec, a missing folder, no
    network for a download, a corrupt image) end in one line naming the fix, exit status 2."""
    from contrastive.data.download import DownloadError
    from contrastive.data.io import CorruptImageError
    from contrastive.data.spec import UnknownDatasetError

    try:
        return main(argv)
    except (DownloadError, UnknownDatasetError, CorruptImageError, FileNotFoundError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"demo: error: {message}\n(the demo needs a --data spec with a labelled test split; "
              "make demo uses the built-in shapes data)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
