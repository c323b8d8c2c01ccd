"""Gradient caching (``--grad-cache-chunk``): peak memory against views per step, the time of the
extra pass, and the SimCLR CIFAR recipe at SimCLR's ImageNet batch (4096).

Three parts, each printing a Markdown table:

- ``memory``: one training step (SimCLR's forward, backward) of ``--encoder`` at 32 px in a FRESH
  subprocess per setting (its peak resident set, ``ru_maxrss``, is the setting's alone), for
  several views per step, without chunks and with ``--chunk`` rows. The slope of the unchunked
  line (MB per view) extrapolates to the recipe's 8192 views per step (batch 4096 x 2 views),
  compared with this machine's memory: nothing that large is ever started.
- ``time``: the plain step and the cached step on the same batch in ONE process, alternated,
  ``--repeats`` each; the ratio of the medians is the cost of the extra (no-gradient) backbone
  pass. Run it under ``hold_nice`` on a shared machine.
- ``recipe``: ``recipes/simclr_cifar.py --batch-size 4096 --grad-cache-chunk N --max-steps 2`` on
  real CIFAR-10 in a subprocess: its wall time per step and peak resident set (minutes per step
  on a 2-core CPU).

Usage::

    python benchmarks/bench_grad_cache.py memory --views 32 64 128 --chunk 32
    hold_nice python benchmarks/bench_grad_cache.py time --views 128 --chunk 32
    nice -n 12 python benchmarks/bench_grad_cache.py recipe --data /path/cifar10-jpeg --chunk 256
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _mem_total_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def _build(encoder: str, views: int, seed: int = 0):
    import torch

    from contrastive.methods import SimCLR

    torch.manual_seed(seed)
    method = SimCLR(encoder=encoder, dim=128, mlp_hidden=512).train()
    n = views // 2
    g = torch.Generator().manual_seed(seed)
    batch = method.make_batch([torch.randn(n, 3, 32, 32, generator=g) for _ in range(2)])
    return method, batch


def _step(method, batch, chunk: int, bf16: bool = False) -> None:
    import torch

    from contrastive.engine.grad_cache import GradCache

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    if chunk:
        cache = GradCache(method, chunk)
        with cache.recording(), autocast:
            loss = method(batch)["loss"]
        loss.backward()
        cache.backward()
    else:
        with autocast:
            loss = method(batch)["loss"]
        loss.backward()
    method.zero_grad(set_to_none=True)


def child(encoder: str, views: int, chunk: int, bf16: bool) -> None:
    """One step in this fresh process; prints its peak resident set in MB (JSON)."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    method, batch = _build(encoder, views)
    _step(method, batch, chunk, bf16)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"views": views, "chunk": chunk, "peak_mb": peak, "import_mb": base}))


def memory(args: argparse.Namespace) -> None:
    rows = []
    for views in args.views:
        for chunk in (0, args.chunk):
            out = subprocess.run([sys.executable, __file__, "child", "--encoder", args.encoder,
                                  "--views", str(views), "--chunk", str(chunk),
                                  *(["--bf16"] if args.bf16 else [])],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"views {views} chunk {chunk}: {rows[-1]['peak_mb']:.0f} MB", file=sys.stderr)
    plain = [(r["views"], r["peak_mb"]) for r in rows if r["chunk"] == 0]
    (v0, m0), (v1, m1) = plain[0], plain[-1]
    slope = (m1 - m0) / (v1 - v0)
    print(f"\n{args.encoder} at 32 px, SimCLR step (forward + backward), "
          f"{'bf16 autocast' if args.bf16 else 'fp32'}, "
          f"{_cpu()}, load {_load()}\n")
    print("| views per step | peak RSS, no chunks (MB) | peak RSS, chunks of "
          f"{args.chunk} (MB) |\n|---|---|---|")
    for views in args.views:
        a = next(r["peak_mb"] for r in rows if r["views"] == views and r["chunk"] == 0)
        b = next(r["peak_mb"] for r in rows if r["views"] == views and r["chunk"])
        print(f"| {views} | {a:.0f} | {b:.0f} |")
    need = m0 + slope * (8192 - v0)
    print(f"\nslope without chunks: {slope:.1f} MB per view; extrapolated to 8192 views (batch "
          f"4096 x 2): {need / 1024:.0f} GB, this machine has {_mem_total_mb() / 1024:.0f} GB")


def timing(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    method, batch = _build(args.encoder, args.views[0])
    times: dict[int, list[float]] = {0: [], args.chunk: []}
    _step(method, batch, 0)  # warm-up
    _step(method, batch, args.chunk)
    for _ in range(args.repeats):
        for chunk in (0, args.chunk):  # alternated
            t = time.perf_counter()
            _step(method, batch, chunk)
            times[chunk].append(time.perf_counter() - t)
    plain, cached = statistics.median(times[0]), statistics.median(times[args.chunk])
    print(f"\n{args.encoder} at 32 px, SimCLR, {args.views[0]} views per step, fp32, "
          f"{torch.get_num_threads()} threads, {_cpu()}, load {_load()}\n")
    print(f"| step | median of {args.repeats} (s) |\n|---|---|\n| whole batch | {plain:.3f} |\n"
          f"| chunks of {args.chunk} | {cached:.3f} |\n\ncached / whole: {cached / plain:.2f}x")


def recipe(args: argparse.Namespace) -> None:
    out = Path(args.output_dir)
    cmd = [sys.executable, str(ROOT / "recipes" / "simclr_cifar.py"), "--data", args.data,
           "--batch-size", "4096", "--grad-cache-chunk", str(args.chunk), "--max-steps", "2",
           "--log-every", "1", "--knn-every", "0", "--save-every-steps", "0",
           "--num-workers", str(args.num_workers), "--no-progress", "--output-dir", str(out)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r for r in records if "loss" in r]
    print(f"\nsimclr_cifar (cifar_resnet18, 32 px), batch 4096 (8192 views per step), chunks of "
          f"{args.chunk}, {_cpu()}, load {_load()}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}\n")
    print("| step | loss | images/s | seconds per step |\n|---|---|---|---|")
    for r in steps:
        print(f"| {r['step']} | {r['loss']:.4f} | {r['images_per_s']:.1f} | "
              f"{4096 / r['images_per_s']:.0f} |")
    print(f"\nwall time {wall:.0f} s (set-up included); peak resident set of the run "
          f"{peak / 1024:.1f} GB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=("memory", "time", "recipe", "child"))
    p.add_argument("--encoder", default="cifar_resnet18")
    p.add_argument("--views", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--data", default="")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--output-dir", default="/tmp/bench_grad_cache_recipe")
    p.add_argument("--bf16", action="store_true", help="memory: bf16 autocast, as the recipe")
    args = p.parse_args()
    if args.part == "child":
        child(args.encoder, args.views[0], args.chunk, args.bf16)
    elif args.part == "memory":
        memory(args)
    elif args.part == "time":
        timing(args)
    else:
        recipe(args)


if __name__ == "__main__":
    main()
