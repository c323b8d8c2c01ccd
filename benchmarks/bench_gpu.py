#!/usr/bin/env python
"""The main job on one GPU: ``recipes/moco_r50.py`` (MoCo v2, ResNet-50, 224 px, bf16) on
generated ImageNet-size JPEGs, one recipe command per configuration, and the epoch time of
``recipes/moco_cifar.py`` (CIFAR ResNet-18, batch 512) on generated CIFAR-size JPEGs.

Configurations (each at every ``--batch-sizes`` value), cumulative:
- ``base``: the path before the GPU work: NCHW (``--channels-last false``), eager, JPEGs decoded
  by the loader workers, the rest of the augmentation batched on the GPU;
- ``cl``: + channels_last (the default on CUDA now);
- ``compile``: + ``--compile`` (the backbone and the key encoder);
- ``gpudecode``: + ``--decode device`` (nvJPEG through torchvision, crop + resize on the GPU).

What is measured: the recipe's own ``metrics.jsonl`` (``images_per_s`` and ``data_wait_frac``
per ``--log-every`` window: the log line syncs the device, so a window's time is real),
aggregated over the windows after ``--skip-steps`` (compilation, cuDNN autotuning and worker
start-up fall before). MFU = images/s x 32.7 GFLOP per image (4 passes x 2 x 4.09 GMAC: query
forward + backward = 3, key forward = 1; torchvision's model table counts multiply-adds) / the
bf16 rate of an 8192^3 ``torch.mm`` measured in the same command. Data wait = the share of
the window the training loop spent waiting for the loader (host time: a wait while the GPU
still runs queued work overstates the GPU's idle time).

The CIFAR part times whole epochs of 50,000 generated 32 px JPEGs (the demo's data set size),
the kNN monitor off (no labelled test split): seconds per epoch = 50,000 / images/s.

Usage (on the GPU machine; writes JSON lines and a summary to ``--out``)::

    PYTHONPATH=. python benchmarks/bench_gpu.py --out /tmp/gpu --budget-s 420
    PYTHONPATH=. python benchmarks/bench_gpu.py --configs base,cl --batch-sizes 256 --no-cifar
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GFLOP_PER_IMAGE = 4 * 2 * 4.09  # MoCo v2 R50 step per image (module docstring)
CONFIGS = {
    "base": ["--channels-last", "false"],
    "cl": ["--channels-last", "true"],
    "compile": ["--channels-last", "true", "--compile"],
    "gpudecode": ["--channels-last", "true", "--compile", "--decode", "device"],
}


def _jpeg(args: tuple[str, int, int, int]) -> int:
    """One smooth photo-like JPEG (a random low-resolution colour field upsampled, plus grain):
    it compresses like a photo (tens of kB at ImageNet size), unlike noise or flat colour."""
    import numpy as np
    from PIL import Image

    path, index, size_lo, size_hi = args
    rng = np.random.default_rng(index)
    w, h = (int(v) for v in rng.integers(size_lo, size_hi + 1, 2))
    small = rng.integers(0, 256, (int(rng.integers(8, 64)), int(rng.integers(8, 64)), 3))
    img = Image.fromarray(small.astype("uint8")).resize((w, h), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-16, 17, (h, w, 3))
    Image.fromarray(arr.clip(0, 255).astype("uint8")).save(path, quality=90)
    return os.path.getsize(path)


def make_jpegs(root: Path, n: int, size: tuple[int, int], classes: int = 10) -> dict[str, Any]:
    """``n`` generated JPEGs in ``root/train/c<k>/`` (labelled folders), in parallel."""
    jobs = []
    for k in range(classes):
        (root / "train" / f"c{k}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        jobs.append((str(root / "train" / f"c{i % classes}" / f"{i:06d}.jpg"), i, *size))
    t0 = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        sizes = pool.map(_jpeg, jobs, chunksize=64)
    return {"images": n, "mean_kB": round(sum(sizes) / n / 1024, 1),
            "seconds": round(time.perf_counter() - t0, 1)}


def matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    """bf16 ``torch.mm`` rate on the GPU (TFLOP/s), the MFU denominator."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only for dry runs
    n = n if dev == "cuda" else 1024
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if dev == "cuda":
        torch.cuda.synchronize()
    return 2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12


def summarise(metrics: Path, skip_steps: int, unit: str = "images") -> dict[str, Any]:
    """Images/s and data-wait share over the log windows after ``skip_steps``."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if f"{unit}_per_s" in r and r["step"] > skip_steps]
    if not rows:
        return {"error": f"no log window after step {skip_steps}"}
    steps = [r["step"] for r in rows]
    widths = [b - a for a, b in zip([skip_steps] + steps[:-1], steps)]
    rates = [r[f"{unit}_per_s"] for r in rows]
    seconds = [w / rate for w, rate in zip(widths, rates)]  # in units of "per image": scaled
    rate = sum(widths) / sum(seconds)
    wait = sum(r["data_wait_frac"] * s for r, s in zip(rows, seconds)) / sum(seconds)
    return {"images_per_s": round(rate, 1), "data_wait_frac": round(wait, 3),
            "windows": len(rows), "last_loss": rows[-1].get("loss")}


def run_recipe(recipe: str, argv: list[str], out: Path, timeout: float) -> tuple[int, float, str]:
    """One recipe command in a fresh process: (exit code, seconds, the output's tail)."""
    cmd = [sys.executable, str(ROOT / "recipes" / recipe), *argv, "--output-dir", str(out),
           "--progress", "false", "--save-every-steps", "0"]
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        code, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired as e:
        code, tail = 124, str(e)[-500:]
    return code, time.perf_counter() - t0, tail


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/bench_gpu")
    p.add_argument("--work", default="/tmp/bench_gpu_work", help="data and run folders")
    p.add_argument("--configs", default="base,cl,compile,gpudecode")
    p.add_argument("--batch-sizes", default="256,128")
    p.add_argument("--images", type=int, default=10500, help="ImageNet-size JPEGs generated")
    p.add_argument("--steps", type=int, default=40, help="--max-steps of each r50 run (b256; "
                   "scaled up for smaller batches to see as many images)")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--skip-steps", type=int, default=15, help="warm-up steps not measured")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--run-timeout", type=float, default=200)
    p.add_argument("--budget-s", type=float, default=1e9, help="stop starting runs after this")
    p.add_argument("--extra", default="", help="more recipe flags for every run, e.g. a CPU dry "
                   "run: '--encoder small_cnn --image-size 32 --mixed-precision no'")
    p.add_argument("--no-cifar", action="store_true")
    p.add_argument("--cifar-epochs", type=int, default=2)
    p.add_argument("--cifar-configs", default="eager,compile")
    args = p.parse_args()
    start = time.perf_counter()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "gpu_bench.jsonl"

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)
        with open(results, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    import torch

    from contrastive.hardware import cpu_kind_line

    emit({"kind": "env", "torch": torch.__version__, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
          "cpus": os.cpu_count(), "cpu": cpu_kind_line(), "workers": args.workers})
    tflops = matmul_tflops()
    emit({"kind": "matmul", "bf16_tflops": round(tflops, 1)})
    data = work / "imagenet_like"
    if not (data / "train").is_dir():
        emit({"kind": "data", "what": "imagenet_like", **make_jpegs(data, args.images,
                                                                    (333, 500))})
    common = ["--data", str(data), "--mixed-precision", "bf16", "--num-workers",
              str(args.workers), "--log-every", str(args.log_every), "--knn-every", "0"]
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        steps = args.steps * 256 // batch
        for name in args.configs.split(","):
            if time.perf_counter() - start > args.budget_s:
                emit({"kind": "skipped", "config": name, "batch": batch, "why": "budget"})
                continue
            run_dir = work / f"r50_{name}_{batch}"
            argv = [*common, "--batch-size", str(batch), "--max-steps", str(steps),
                    *CONFIGS[name], *args.extra.split()]
            code, secs, tail = run_recipe("moco_r50.py", argv, run_dir, args.run_timeout)
            rec: dict[str, Any] = {"kind": "moco_r50", "config": name, "batch": batch,
                                   "exit": code, "wall_s": round(secs, 1)}
            if code == 0:
                rec.update(summarise(run_dir / "metrics.jsonl",
                                     args.skip_steps * 256 // batch))
                if "images_per_s" in rec:
                    rec["mfu"] = round(rec["images_per_s"] * GFLOP_PER_IMAGE / 1e3 / tflops, 4)
            else:
                rec["tail"] = tail
            emit(rec)
    if args.no_cifar:
        return
    cifar = work / "cifar_like"
    if not (cifar / "train").is_dir():
        emit({"kind": "data", "what": "cifar_like", **make_jpegs(cifar, 50000, (32, 32))})
    for name in args.cifar_configs.split(","):
        if time.perf_counter() - start > args.budget_s:
            emit({"kind": "skipped", "config": f"cifar_{name}", "why": "budget"})
            continue
        run_dir = work / f"cifar_{name}"
        argv = ["--data", str(cifar), "--mixed-precision", "bf16", "--num-workers",
                str(args.workers), "--log-every", "14", "--knn-every", "0",
                "--max-steps", str(97 * args.cifar_epochs)]
        if name == "compile":
            argv.append("--compile")
        argv += args.extra.split()
        code, secs, tail = run_recipe("moco_cifar.py", argv, run_dir, args.run_timeout)
        rec = {"kind": "moco_cifar", "config": name, "exit": code, "wall_s": round(secs, 1)}
        if code == 0:
            rec.update(summarise(run_dir / "metrics.jsonl", 28))
            if "images_per_s" in rec:
                rec["s_per_epoch"] = round(50000 / rec["images_per_s"], 2)
            (out / f"cifar_{name}_metrics.jsonl").write_text(
                (run_dir / "metrics.jsonl").read_text())
        else:
            rec["tail"] = tail
        emit(rec)


if __name__ == "__main__":
    main()
