#!/usr/bin/env python
"""Every method of the toolkit on equal terms: one table of linear and kNN top-1.

"Same budget" = the same encoder, data, image size, global batch, number of optimiser steps
(``--epochs`` over the same data), precision, loader workers and seed for every method. Each
method keeps its own recipe otherwise: its heads, loss, optimiser and learning-rate rule
(scaled to the shared batch by the recipe's own rule), augmentation, momentum schedules. The
few overrides that the budget forces are in ``METHODS`` and each is explained there.

Each method is trained by its recipe as a program (``python recipes/<recipe>.py ...``, the
command is in the table), then its ``encoder.pt`` is evaluated with the evaluation code
(``contrastive.eval``: features of both splits encoded once, centre crops normalised with the
statistics the run recorded; weighted kNN, k 200, t 0.1, bank = the whole training split,
queries = the held-out split; the cached linear probe, 100 epochs, lr / wd chosen on a
held-out 10 % of the training split: what ``knn_eval`` / ``linear_eval`` compute). A
random-init row (the same encoder, seed ``--seed``) is the floor. images/s = median of the
training log's windows after the first (which holds the start-up); wall = the whole training
process (start-up included, evaluation not); CPU s = that process's user + system time, the
figure that a shared machine's load inflates least.

    python benchmarks/bench_methods.py                          # shapes, benchmarks/results/methods.md's table
    python benchmarks/bench_methods.py --methods BYOL,SimSiam   # a subset
    python benchmarks/bench_methods.py --data cifar10-jpeg --image-size 32 --crop-min 0.2 \
        --fraction 0.2   # slow: a stratified 10,000 / 2,000 images, 156 steps as on shapes

``--data cifar10-jpeg`` unpacks ``../shared/data/cifar10-jpeg.tar`` once into
``~/.cache/contrastive/cifar10-jpeg`` (as the slow CIFAR learning test does); any other value
is a data spec (``shapes:size=24``, ``imagefolder:/path``, ...).

Adding a method to the table is one line in ``METHODS``: its name, its recipe, and the
overrides the shared budget forces (with the reason in a comment).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED_TAR = ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar"


@dataclass(frozen=True)
class Entry:
    """One row: ``recipes/<recipe>.py`` with ``args`` on top of the shared budget flags.
    ``{epoch_steps}`` in an argument is replaced by the number of optimiser steps per epoch."""

    recipe: str
    args: tuple[str, ...] = ()


# The overrides, and why (none of them tunes a method to the data):
# - MoCo v1: the MoCo CIFAR-10 demo recipe (MoCo v1's linear head and loss; the demo's 4,096-key
#   queue, split BN for shuffle BN on one process) rather than the ImageNet one, whose 65,536-key
#   queue is 13x the 5,000 shapes images. MoCo v2: the same queue size, for the same reason.
# - SwAV: prototypes frozen for one epoch (the recipe's 390 steps are one CIFAR-10 epoch at
#   batch 128; on a short run they would stay frozen for the whole run).
METHODS: dict[str, Entry] = {
    "MoCo v1": Entry("moco_cifar"),
    "MoCo v2": Entry("moco_r50", ("--queue-size", "4096")),
    "MoCo v3": Entry("mocov3_r50"),
    "SimCLR": Entry("simclr_cifar"),
    "BYOL": Entry("byol_cifar"),
    "SimSiam": Entry("simsiam_cifar"),
    "SupCon": Entry("supcon_cifar"),
    "NNCLR": Entry("nnclr_cifar"),
    "Barlow Twins": Entry("barlow_twins_cifar"),
    "VICReg": Entry("vicreg_cifar"),
    "SwAV": Entry("swav_cifar", ("--freeze-prototypes-steps", "{epoch_steps}")),
    "DINO": Entry("dino_cifar"),
    "Deep InfoMax": Entry("dim_cifar"),  # skipped (with a note) while the recipe is missing
    # DenseCL: its CIFAR recipe (the MoCo demo's 4,096-key queues and split BN, as MoCo v1's row)
    "DenseCL": Entry("densecl_cifar"),
    # VICRegL: its CIFAR recipe (crop boxes come with the batch, so it runs beside VICReg)
    "VICRegL": Entry("vicregl_cifar"),
    # the ViT block (--encoder timm:... --encoder-kwargs): MAE takes one view; iBOT and DINOv2
    # without local crops, as DINO's CIFAR recipe (their defaults of 10 and 8 would give them
    # 6x and 5x the crops)
    "MAE": Entry("mae_cifar"),
    "SimMIM": Entry("simmim_cifar"),
    "iBOT": Entry("ibot_cifar", ("--local-crops", "0")),
    "DINOv2": Entry("dinov2_cifar", ("--local-crops", "0")),
    # MSN without its focal views (as iBOT / DINOv2 without local crops); I-JEPA with min_keep 2
    # (the ViT block's 6 x 6 patch grid: a 2 x 2 target block cannot keep more than the default 4)
    "MSN": Entry("msn_cifar", ("--focal-views", "0")),
    "I-JEPA": Entry("ijepa_cifar", ("--min-keep", "2")),
}



def data_spec(data: str, fraction: float = 1.0) -> str:
    """The data spec for ``--data`` (``cifar10-jpeg``: the shared copy, unpacked once), with
    a stratified seeded ``fraction`` of both splits when below 1."""
    if data == "cifar10-jpeg":
        from contrastive.data import unpack_image_folder

        if not SHARED_TAR.exists():
            raise SystemExit(f"--data cifar10-jpeg: {SHARED_TAR} is missing")
        data = f"imagefolder:{unpack_image_folder(SHARED_TAR)}"
    if not 0 < fraction <= 1:
        raise SystemExit(f"--fraction must be in (0, 1], got {fraction}")
    return data if fraction == 1 else f"{data},fraction={fraction}"


def budget_args(args: argparse.Namespace, data: str) -> list[str]:
    """The flags every method gets: the shared budget."""
    kwargs = ["--encoder-kwargs", args.encoder_kwargs] if args.encoder_kwargs else []
    return ["--data", data, "--encoder", args.encoder, *kwargs,
            "--image-size", str(args.image_size),
            "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
            "--warmup-epochs", str(args.warmup_epochs), "--crop-min", str(args.crop_min),
            "--mixed-precision", args.precision, "--num-workers", str(args.workers),
            "--seed", str(args.seed), "--knn-every", "0", "--save-every-epochs", "0",
            "--save-every-steps", "0", "--log-every", str(args.log_every), "--progress", "false"]


def train_size(data: str) -> int:
    from contrastive.eval.runner import load_split

    return len(load_split(data, "train", None))  # type: ignore[arg-type]


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = str(threads)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")
    return env


def train(name: str, entry: Entry, args: argparse.Namespace, data: str, epoch_steps: int,
          out: Path) -> dict[str, Any]:
    extra = [a.replace("{epoch_steps}", str(epoch_steps)) for a in entry.args]
    cmd = [sys.executable, f"recipes/{entry.recipe}.py", *budget_args(args, data), *extra,
           "--output-dir", str(out)]
    out.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(args.threads), stdout=log_file,
                                stderr=subprocess.STDOUT)
        # wait4: this child's own CPU time (user + sys), a cost figure that the load on a
        # shared machine inflates far less than the wall time
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: {' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{log_path.read_text()[-3000:]}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in records if "images_per_s" in r]
    steps = max(r["step"] for r in records if "step" in r)
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    stds = [r["embedding_std"] for r in records if r.get("embedding_std") is not None]
    shown = " ".join(cmd[1:-2]).replace(str(ROOT) + "/", "")
    return {"method": name, "recipe": entry.recipe, "steps": steps,
            "images_per_s": statistics.median(rates[1:] or rates), "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "final_loss": losses[-1] if losses else None,
            "final_embedding_std": stds[-1] if stds else None, "command": f"python {shown}"}


def evaluate(checkpoint: str, args: argparse.Namespace, data: str) -> dict[str, float]:
    """kNN and linear-probe top-1 of ``checkpoint`` (or ``"random"``) with the evaluation code:
    features of both splits encoded once (``encode_split``: centre crops, the run's recorded
    normalisation), then ``knn_accuracy`` (k 200, t 0.1, the whole training split as the bank)
    and ``fit_linear_cached`` (100 epochs, lr / wd chosen on a held-out 10 % of the training
    split) + ``evaluate_head`` on the held-out split: what ``knn_eval`` and ``linear_eval``
    compute, without encoding the data twice."""
    import torch

    from contrastive.eval import evaluate_head, fit_linear_cached, knn_accuracy, load_encoder
    from contrastive.eval.runner import encode_split, eval_transform, load_split

    torch.manual_seed(args.seed)  # the random-init row's weights
    random = checkpoint == "random"
    loaded = load_encoder(checkpoint, encoder=args.encoder if random else None,
                          encoder_kwargs=json.loads(args.encoder_kwargs or "{}") if random
                          else None)
    transform = eval_transform(args.image_size, loaded.setting("mean"), loaded.setting("std"))
    (xtr, ytr), (xte, yte) = (
        encode_split(loaded, load_split(data, split, transform), num_workers=args.workers)
        for split in ("train", "test"))
    knn = knn_accuracy(xtr, ytr, xte, yte, k=200, temperature=0.1)
    probe = fit_linear_cached(xtr, ytr, epochs=args.probe_epochs, seed=args.seed)
    lin = evaluate_head(probe.head, xte, yte)
    row = {"knn_top1": round(knn["top1"], 2), "linear_top1": round(lin["top1"], 2)}
    return row | (segmentation(loaded.encoder, data, transform, args.seed) if args.segmentation
                  else {})


SEGMENTATION_TRAIN = 1000  # training images of the segmentation probe (all held-out ones score)


def segmentation(encoder: Any, data: str, transform: Any, seed: int) -> dict[str, float]:
    """Per-pixel linear segmentation of ``shapes`` (background + 10 shape classes) on the
    encoder's last-stage map (``contrastive.eval.segmentation``, 50 epochs): the dense probe."""
    import torch

    from contrastive.data import SHAPE_CLASSES
    from contrastive.eval.features import unwrap_views
    from contrastive.eval.runner import load_split
    from contrastive.eval.segmentation import linear_segmentation

    splits = [load_split(data, split, transform) for split in ("train", "test")]
    if not all(hasattr(ds, "masks") for ds in splits):
        raise SystemExit(f"--segmentation needs a shapes data spec (its masks); got {data!r}")
    n = min(SEGMENTATION_TRAIN, len(splits[0]))
    (xtr, mtr), (xte, mte) = ((torch.stack([unwrap_views(ds[i][0]) for i in range(count)]),
                               ds.masks()[:count])
                              for ds, count in ((splits[0], n), (splits[1], len(splits[1]))))
    s = linear_segmentation(encoder.cpu().float(), xtr, mtr, xte, mte, len(SHAPE_CLASSES) + 1,
                            epochs=50, seed=seed)
    return {"seg_miou": round(s["miou"], 2), "seg_pixel_accuracy": round(s["pixel_accuracy"], 2)}


def evaluate_child(checkpoint: Path, args: argparse.Namespace, data: str) -> dict[str, float]:
    """:func:`evaluate` in a child process (so that ``--jobs`` evaluates in parallel too)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--evaluate", str(checkpoint),
           "--data", data, "--encoder", args.encoder, "--image-size", str(args.image_size),
           "--encoder-kwargs", args.encoder_kwargs, "--workers", str(args.workers), "--seed", str(args.seed),
           "--probe-epochs", str(args.probe_epochs), *(["--segmentation"] if args.segmentation else [])]
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(args.threads), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"evaluation of {checkpoint} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]]) -> str:
    seg = any("seg_miou" in r for r in rows)  # --segmentation: one more column
    head = ("| method | linear top-1 % | kNN top-1 % | " + ("seg. mIoU % | " if seg else "")
            + "images/s | wall s | CPU s | steps | command |\n|---|---|---|---|---|---|---|---|"
            + ("---|" if seg else ""))
    lines = [head]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['method']} | - | - | {'- | ' if seg else ''}- | - | - | - | "
                         f"skipped: {r['skipped']} |")
            continue
        ips = f"{r['images_per_s']:.0f}" if r.get("images_per_s") else "-"
        miou = f"{r['seg_miou']:.1f} | " if seg else ""
        lines.append(f"| {r['method']} | {r['linear_top1']:.1f} | {r['knn_top1']:.1f} | {miou}{ips} | "
                     f"{r.get('wall_s', '-')} | {r.get('cpu_s', '-')} | {r.get('steps', 0)} | `{r.get('command', '')}` |")
    return "\n".join(lines)


def main() -> None:
    from contrastive.hardware import cpu_kind_line

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="shapes:size=24",
                   help="data spec, or cifar10-jpeg (the shared JPEG copy)")
    p.add_argument("--fraction", type=float, default=1.0,
                   help="train and evaluate on this stratified seeded fraction of both splits "
                   "(0.2 of CIFAR-10: 10,000 / 2,000 images, 156 steps per epoch at batch 64)")
    p.add_argument("--encoder", default="small_cnn")
    p.add_argument("--encoder-kwargs", default="",
                   help="create_encoder keyword arguments (JSON), e.g. a ViT's img_size")
    p.add_argument("--image-size", type=int, default=24)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=float, default=2, help="the step budget, in epochs")
    p.add_argument("--warmup-epochs", type=float, default=0.5)
    p.add_argument("--crop-min", type=float, default=1.0,
                   help="crop minimum scale for every method (1.0: whole images, as the shapes "
                   "learning checks; 0.2 or 0.08 on CIFAR)")
    p.add_argument("--precision", default="bf16", choices=("no", "bf16"))
    p.add_argument("--workers", type=int, default=-1,
                   help="loader workers; default 0 for shapes (in memory), 2 otherwise")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each training")
    p.add_argument("--jobs", type=int, default=1,
                   help="methods trained at once (1 for images/s on otherwise idle cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--probe-epochs", type=int, default=100)
    p.add_argument("--segmentation", action="store_true",
                   help="shapes only: also per-pixel linear segmentation mIoU of the last-stage "
                   "map (the dense probe of DenseCL / VICRegL; first 1,000 training images)")
    p.add_argument("--methods", default="", help="comma-separated subset of: "
                   + ", ".join(METHODS))
    p.add_argument("--out-dir", default="runs/bench_methods")
    p.add_argument("--json", default="", help="append one JSON line per row to this file")
    p.add_argument("--evaluate", default="", help=argparse.SUPPRESS)  # the evaluation child
    args = p.parse_args()
    if args.evaluate:
        print(json.dumps(evaluate(args.evaluate, args, args.data)))
        return
    if args.epochs != int(args.epochs):
        raise SystemExit("--epochs must be a whole number here (the recipes take an int)")
    args.epochs = int(args.epochs)
    names = [m.strip() for m in args.methods.split(",") if m.strip()] or list(METHODS)
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    data = data_spec(args.data, args.fraction)
    if args.workers < 0:
        args.workers = 0 if data.startswith("shapes") else 2
    epoch_steps = train_size(data) // args.batch_size
    out_root = Path(args.out_dir)
    print(f"# {cpu_kind_line()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()}, data {data}, {epoch_steps} steps/epoch x {args.epochs}", flush=True)
    rows: list[dict[str, Any]] = [{"method": "random init", **evaluate("random", args, data)}]

    def one(name: str) -> dict[str, Any]:
        entry = METHODS[name]
        if not (ROOT / "recipes" / f"{entry.recipe}.py").exists():
            return {"method": name, "skipped": f"no recipes/{entry.recipe}.py"}
        out = out_root / entry.recipe
        shutil.rmtree(out, ignore_errors=True)
        row = train(name, entry, args, data, epoch_steps, out)
        row["load_after_training"] = [round(x, 1) for x in os.getloadavg()]
        row["cpu_kind"] = cpu_kind_line()
        return row | evaluate_child(out / "encoder.pt", args, data)

    # --jobs > 1 trains several methods at once (their images/s then share the cores)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        trained = list(pool.map(one, names))
    for row in trained:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
