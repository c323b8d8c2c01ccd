#!/usr/bin/env python
"""Method training steps: each method's step, ours against lightly's implementation of it.

One training step of each method (``--setup byol,simsiam,nnclr,barlow_twins,vicreg,swav,dino``
or ``methods``), ours (the method module, its CIFAR preset) against lightly's implementation of
the same method (``lightly.loss``, the heads of ``lightly.models.modules``, ``update_momentum`` /
``cosine_schedule``, written as lightly's examples), on the SAME model: our CIFAR ResNet-18
backbone for both, the same head widths (BYOL 4096->256 + predictor; SimSiam 3-layer 2048
projector, 512 predictor; NNCLR 2048->256, 4096 predictor, 65,536-entry support set, tau 0.2;
Barlow Twins and VICReg 2048-2048-2048; SwAV 2048->128, 3000 prototypes, no queue; DINO
2048-2048-256 -> 4096, no BN). What is timed: forward of both views (+ the momentum encoder and
its update where the method has one), the loss, backward and a torch SGD step (momentum 0.9), on
the same PRE-MADE tensors (two batches of N(0, 1) 32 px views, alternating): no data loading, no
augmentation, so the figure is the method's own cost. ms/step between step ``--warmup`` and the
last; fresh subprocess per run, configurations alternated, median over ``--repeats``; the 1-min
load average before each run is printed beside the figures (``--threads`` fixes torch's thread
count). Whole training steps with data loading: ``bench_train.py``, which forwards a method
``--setup`` here, so its command lines keep working.

Examples::

    python benchmarks/bench_train_methods.py --setup methods --batch-size 32 --steps 7 \\
        --warmup 2 --repeats 3 --threads 1                 # method steps, ours vs lightly
    python benchmarks/bench_train_methods.py --interleave --setup methods --batch-size 16 \\
        --steps 22 --warmup 2 --threads 1   # the same, alternating step by step in one process
    python benchmarks/bench_train_methods.py --count-ops --setup methods --batch-size 16
    python benchmarks/bench_train_methods.py --worker ours --setup barlow_twins \\
        --result /tmp/r.jsonl --batch-size 16 --steps 4 --warmup 2 --profile 20  # top operators
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

STEP_SETUPS = ("byol", "simsiam", "nnclr", "barlow_twins", "vicreg", "swav", "dino")
STEP_GMAC = 0.556  # CIFAR ResNet-18 forward at 32 px (REFERENCES.md)


def _views(args: argparse.Namespace, generator: Any) -> list[Any]:
    """Two 32 px views (+ ``--local-crops`` 16 px ones) of a batch, N(0, 1) pixels."""
    import torch

    b = args.batch_size
    shapes = [(b, 3, 32, 32)] * 2 + [(b, 3, 16, 16)] * args.local_crops
    return [torch.randn(s, generator=generator) for s in shapes]


def build_ours_step(setup: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """Our method (the CIFAR preset with the widths lightly's heads take) and its step."""
    from contrastive.methods import (
        BYOL,
        DINO,
        NNCLR,
        BarlowTwins,
        SimSiam,
        SwAV,
        VICReg,
    )

    make = {
        "byol": lambda: BYOL.from_preset("cifar"),
        # lightly's SimSiamProjectionHead has 3 layers: our ImageNet depth at the CIFAR widths
        "simsiam": lambda: SimSiam.from_preset("cifar", proj_layers=3),
        "nnclr": lambda: NNCLR.from_preset("cifar"),
        "barlow_twins": lambda: BarlowTwins.from_preset("cifar"),
        "vicreg": lambda: VICReg.from_preset("cifar"),
        "swav": lambda: SwAV.from_preset("cifar", queue_size=0),  # lightly's example: no queue
        "dino": lambda: DINO.from_preset("cifar"),
    }
    method = make[setup]()
    total = args.steps

    def step(views: list[Any], i: int) -> Any:
        return method(method.make_batch(views, step=i, total_steps=total))["loss"]

    return method, step


def build_lightly_step(setup: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """lightly's example of the method (lightly.loss, lightly.models.modules heads,
    update_momentum, cosine_schedule), written for our CIFAR ResNet-18 and the same widths."""
    import copy

    import torch
    from lightly import loss as L
    from lightly.models import modules as M
    from lightly.models.modules import heads
    from lightly.models.utils import deactivate_requires_grad, update_momentum
    from lightly.utils.scheduler import cosine_schedule
    from torch import nn
    from torch.nn import functional as F

    from contrastive.nn import create_encoder

    model = nn.Module()
    model.backbone = create_encoder("cifar_resnet18")
    total = args.steps

    def feats(x: Any) -> Any:
        return model.backbone(x).flatten(start_dim=1)

    def momentum_copy(*names: str) -> None:
        for n in names:
            setattr(model, n + "_momentum", copy.deepcopy(getattr(model, n)))
            deactivate_requires_grad(getattr(model, n + "_momentum"))

    if setup == "byol":
        model.projection_head = M.BYOLProjectionHead(512, 4096, 256)
        model.prediction_head = M.BYOLPredictionHead(256, 4096, 256)
        momentum_copy("backbone", "projection_head")
        crit = L.NegativeCosineSimilarity()

        def step(views: list[Any], i: int) -> Any:
            m = cosine_schedule(i, total, 0.99, 1.0)
            update_momentum(model.backbone, model.backbone_momentum, m=m)
            update_momentum(model.projection_head, model.projection_head_momentum, m=m)
            p = [model.prediction_head(model.projection_head(feats(x))) for x in views[:2]]
            with torch.no_grad():
                z = [model.projection_head_momentum(model.backbone_momentum(x).flatten(1))
                     for x in views[:2]]
            return 0.5 * (crit(p[0], z[1]) + crit(p[1], z[0]))
    elif setup == "simsiam":
        model.projection_head = M.SimSiamProjectionHead(512, 2048, 2048)
        model.prediction_head = M.SimSiamPredictionHead(2048, 512, 2048)
        crit = L.NegativeCosineSimilarity()

        def step(views: list[Any], i: int) -> Any:
            z = [model.projection_head(feats(x)) for x in views[:2]]
            p = [model.prediction_head(x) for x in z]
            return 0.5 * (crit(z[0].detach(), p[1]) + crit(z[1].detach(), p[0]))
    elif setup == "nnclr":
        model.projection_head = M.NNCLRProjectionHead(512, 2048, 256)
        model.prediction_head = M.NNCLRPredictionHead(256, 4096, 256)
        bank = M.NNMemoryBankModule(size=(65536, 256))
        crit = L.NTXentLoss(temperature=0.2)

        def step(views: list[Any], i: int) -> Any:
            z = [model.projection_head(feats(x)) for x in views[:2]]
            p = [model.prediction_head(x) for x in z]
            n0 = bank(z[0].detach(), update=False)
            n1 = bank(z[1].detach(), update=True)
            return 0.5 * (crit(n0, p[1]) + crit(n1, p[0]))
    elif setup in ("barlow_twins", "vicreg"):
        if setup == "barlow_twins":
            model.projection_head = M.BarlowTwinsProjectionHead(512, 2048, 2048)
            crit = L.BarlowTwinsLoss(lambda_param=0.0051)
            scale = 0.1  # solo-learn's CIFAR scale, as our preset
        else:
            model.projection_head = heads.VICRegProjectionHead(512, 2048, 2048, num_layers=3)
            crit, scale = L.VICRegLoss(), 1.0

        def step(views: list[Any], i: int) -> Any:
            z = [model.projection_head(feats(x)) for x in views[:2]]
            return scale * crit(z[0], z[1])
    elif setup == "swav":
        model.projection_head = M.SwaVProjectionHead(512, 2048, 128)
        model.prototypes = M.SwaVPrototypes(128, 3000)
        crit = L.SwaVLoss(temperature=0.1, sinkhorn_iterations=3, sinkhorn_epsilon=0.05)

        def step(views: list[Any], i: int) -> Any:
            model.prototypes.normalize()
            out = [model.prototypes(F.normalize(model.projection_head(feats(x)), dim=1), i)
                   for x in views]
            return crit(out[:2], out[2:])
    elif setup == "dino":
        model.head = M.DINOProjectionHead(512, 2048, 256, 4096, batch_norm=False)
        momentum_copy("backbone")
        # a second head, as lightly's example (weight_norm modules cannot be deep-copied)
        model.head_momentum = M.DINOProjectionHead(512, 2048, 256, 4096, batch_norm=False)
        model.head_momentum.load_state_dict(model.head.state_dict())
        deactivate_requires_grad(model.head_momentum)
        crit = L.DINOLoss(output_dim=4096, warmup_teacher_temp=0.04, teacher_temp=0.04,
                          warmup_teacher_temp_epochs=0)

        def step(views: list[Any], i: int) -> Any:
            m = cosine_schedule(i, total, 0.9995, 1.0)
            update_momentum(model.backbone, model.backbone_momentum, m=m)
            update_momentum(model.head, model.head_momentum, m=m)
            with torch.no_grad():
                t = [model.head_momentum(model.backbone_momentum(x).flatten(1))
                     for x in views[:2]]
            s = [model.head(feats(x)) for x in views]
            return crit(t, s, epoch=0)
    else:  # pragma: no cover
        raise ValueError(setup)
    return model, step


def interleaved_steps(args: argparse.Namespace) -> None:
    """Ours and lightly's step of one method in ONE process, alternating step by step (A B A B
    ...), so that both see the same load on a shared machine; prints each pair's times and the
    median ratio over the pairs after ``--warmup``. Complements the fresh-subprocess runs."""
    import torch

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    batches = [_views(args, gen) for _ in range(2)]
    runs = []
    for build in (build_ours_step, build_lightly_step):
        model, step = build(args.setup, args)
        model.train()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05,
                              momentum=0.9, weight_decay=1e-5)
        runs.append((step, opt))
    times: list[list[float]] = [[], []]
    for i in range(args.steps):
        for k, (step, opt) in enumerate(runs if i % 2 == 0 else runs[::-1]):
            k = k if i % 2 == 0 else 1 - k
            t = time.perf_counter()
            loss = step(batches[i % 2], i)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times[k].append(time.perf_counter() - t)
    ratios = [b / a for a, b in zip(times[0][args.warmup:], times[1][args.warmup:])]
    print(json.dumps({"setup": args.setup, "ours_ms": [round(1000 * x) for x in times[0]],
                      "lightly_ms": [round(1000 * x) for x in times[1]],
                      "median_lightly_over_ours": statistics.median(ratios),
                      "load": os.getloadavg()[0]}))


def count_ops(args: argparse.Namespace) -> None:
    """Load-independent comparison of one step (after one warm-up step), ours vs lightly:
    FLOPs of the matrix products and convolutions (torch.profiler ``with_flops``), the number
    of aten operator calls, and the operators whose call counts differ. On a shared machine
    where timings move by 20 % from step to step, this says whether ours does more work."""
    import torch

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads or 1)
    gen = torch.Generator().manual_seed(args.seed)
    batches = [_views(args, gen) for _ in range(2)]
    counts = {}
    for name, build in (("ours", build_ours_step), ("lightly", build_lightly_step)):
        model, step = build(args.setup, args)
        model.train()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05,
                              momentum=0.9, weight_decay=1e-5)
        for i in range(2):
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                          with_flops=True) if i else None
            if prof is not None:
                prof.__enter__()
            loss = step(batches[i], i)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        prof.__exit__(None, None, None)
        events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        counts[name] = ({e.key: e.count for e in events},
                        sum(e.flops for e in prof.key_averages()) / 1e9)
    ours, lightly = counts["ours"], counts["lightly"]
    diff = {k: (ours[0].get(k, 0), lightly[0].get(k, 0))
            for k in sorted(set(ours[0]) | set(lightly[0]))
            if ours[0].get(k, 0) != lightly[0].get(k, 0)}
    print(json.dumps({"setup": args.setup, "gflop": {"ours": round(ours[1], 3),
                                                     "lightly": round(lightly[1], 3)},
                      "aten_calls": {"ours": sum(ours[0].values()),
                                     "lightly": sum(lightly[0].values())},
                      "differing_calls (ours, lightly)": diff}))


def worker_step(args: argparse.Namespace) -> None:
    """Time ``--steps`` training steps (forward, loss, backward, SGD step) of one method on the
    same pre-made tensors; write the wall time after every step."""
    import torch

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    build = build_ours_step if args.worker == "ours" else build_lightly_step
    model, step = build(args.setup, args)
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05,
                          momentum=0.9, weight_decay=1e-5)
    gen = torch.Generator().manual_seed(args.seed)
    batches = [_views(args, gen) for _ in range(2)]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    prof = None
    with open(args.result, "w") as res:
        for i in range(args.steps):
            if args.profile and i == args.warmup:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof.__enter__()
            with autocast:
                loss = step(batches[i % 2], i)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            res.write(json.dumps({"step": i + 1, "loss": loss.item(), "time": time.time()})
                      + "\n")
    if prof is not None:
        prof.__exit__(None, None, None)
        print(f"{args.worker} {args.setup} {args.precision}: steps {args.warmup + 1}-"
              f"{args.steps}, by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile))


# --------------------------------------------------------------------------------------------
# driver


def add_arguments(p: argparse.ArgumentParser, setup: str) -> None:
    """The flags of the method-step runs (``bench_train.py`` adds its own to the same parser)."""
    p.add_argument("--setup", default=setup, help="moco_cifar, moco_r50 (bench_train.py: whole "
                   "steps with data loading), or a comma list of method steps on pre-made "
                   f"tensors: {','.join(STEP_SETUPS)} (or 'methods' for all of them)")
    p.add_argument("--impls", default="ours,lightly")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--lightly-precisions", default="fp32", help="lightly's example as written "
                   "is fp32; add bf16 for autocast around its step")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=None, help="a multiple of 10 (40; method "
                   "steps: any, 12)")
    p.add_argument("--warmup", type=int, default=None, help="a multiple of 10 (10; method "
                   "steps: any, 4)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default="", help="write all figures here")
    p.add_argument("--threads", type=int, default=0, help="method steps: torch threads "
                   "(0: torch's default)")
    p.add_argument("--profile", type=int, default=0, help="method steps, worker mode: print "
                   "torch.profiler's top N operators of the timed steps (e.g. --worker ours "
                   "--setup simsiam --result /tmp/r.jsonl --profile 20)")
    p.add_argument("--count-ops", action="store_true", help="method steps: FLOPs and aten "
                   "calls of one step, ours vs lightly (load-independent)")
    p.add_argument("--interleave", action="store_true", help="method steps: ours and "
                   "lightly's in one process, alternating step by step (fp32); median ratio")
    p.add_argument("--local-crops", type=int, default=0, help="method steps: extra 16 px views "
                   "(multi-crop; SwAV and DINO)")
    # worker mode
    p.add_argument("--worker", default="", choices=("", "ours", "lightly"))
    p.add_argument("--precision", default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", default="")
    p.add_argument("--run-dir", default="")


def is_method_run(args: argparse.Namespace) -> bool:
    """Whether the command line asks for method steps (not whole training steps)."""
    setups = args.setup.replace("methods", ",".join(STEP_SETUPS)).split(",")
    return args.count_ops or args.interleave or all(s in STEP_SETUPS for s in setups)


def run(args: argparse.Namespace, error: Callable[[str], Any]) -> None:
    """Method steps as the command line asks: operator counts, interleaved steps, one worker
    run, or the alternated fresh-subprocess runs (:func:`main_steps`)."""
    setups = args.setup.replace("methods", ",".join(STEP_SETUPS)).split(",")
    unknown = [s for s in setups if s not in STEP_SETUPS]
    if unknown:
        error(f"--setup: {unknown} are not method steps; choose from {STEP_SETUPS} or 'methods'")
    if args.count_ops:
        args.steps = args.steps or 12  # the schedules' horizon
        for setup in setups:
            args.setup = setup
            count_ops(args)
        return
    args.steps, args.warmup = args.steps or 12, args.warmup or (2 if args.interleave else 4)
    if args.interleave:
        for setup in setups:
            args.setup = setup
            interleaved_steps(args)
        return
    if args.worker:
        worker_step(args)
        return
    if not 0 < args.warmup < args.steps:
        error("--warmup must be > 0 and < --steps")
    main_steps(args, setups)


def run_worker(script: str, argv: list[str], what: str) -> list[dict]:
    """``python script --worker ... *argv --result FILE --run-dir DIR`` in a fresh subprocess
    (the project on ``PYTHONPATH``, FILE and DIR in a temporary folder); the per-step records
    the worker wrote to FILE. A failing worker ends the benchmark with its stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.jsonl"
        cmd = [sys.executable, script, *argv, "--result", str(result), "--run-dir",
               str(Path(tmp) / "run")]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                                 "")}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{what} failed:\n{proc.stderr[-3000:]}")
        return [json.loads(x) for x in result.read_text().splitlines()]


def spawn(impl: str, precision: str, args: argparse.Namespace, *, seed: int) -> list[dict]:
    """One worker run of the method ``args.setup``; its per-step records."""
    return run_worker(__file__, [
        "--worker", impl, "--precision", precision, "--steps", str(args.steps), "--warmup",
        str(args.warmup), "--seed", str(seed), "--batch-size", str(args.batch_size), "--setup",
        args.setup, "--threads", str(args.threads), "--local-crops", str(args.local_crops)],
        f"{impl} {precision}")


def main_steps(args: argparse.Namespace, setups: list[str]) -> None:
    """Method steps, ours vs lightly: per repeat, every setup and configuration once (fresh
    subprocesses, alternating), then the median per configuration. The load average is read
    before every run and reported beside the figures."""
    import torch

    from contrastive.hardware import cpu_kind_line

    configs = [(impl, prec) for impl in args.impls.split(",")
               for prec in (args.precisions if impl == "ours" else args.lightly_precisions
                            ).split(",")]
    times: dict[tuple[str, str, str], list[float]] = {}
    losses: dict[tuple[str, str, str], list[float]] = {}
    loads: list[float] = []
    for rep in range(args.repeats):
        for setup in setups:
            args.setup = setup
            for impl, prec in configs:
                loads.append(os.getloadavg()[0])
                recs = spawn(impl, prec, args, seed=rep)
                t = {r["step"]: r["time"] for r in recs}
                ms = 1000 * (t[args.steps] - t[args.warmup]) / (args.steps - args.warmup)
                times.setdefault((setup, impl, prec), []).append(ms)
                losses.setdefault((setup, impl, prec), []).append(recs[-1]["loss"])
                print(f"rep {rep}: {setup:12s} {impl:7s} {prec} {ms:8.1f} ms/step "
                      f"(load {loads[-1]:.2f})", flush=True)
    print(f"\nmethod steps on pre-made tensors, batch {args.batch_size}, two 32 px views"
          f"{f' + {args.local_crops} x 16 px' if args.local_crops else ''}, CIFAR ResNet-18, "
          f"SGD; {cpu_kind_line()}, {os.cpu_count()} CPUs, threads "
          f"{args.threads or torch.get_num_threads()}, torch {torch.__version__}; 1-min load "
          f"average before the runs: {min(loads):.2f}-{max(loads):.2f} "
          f"(median {statistics.median(loads):.2f})")
    print("| method | impl | precision | ms/step (median) | runs | images/s | "
          "vs lightly fp32 |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    rows = []
    for (setup, impl, prec), ms in times.items():
        med = statistics.median(ms)
        base = times.get((setup, "lightly", "fp32"))
        rel = f"{statistics.median(base) / med:.2f}x" if base else "-"
        runs = ", ".join(f"{x:.0f}" for x in ms)
        print(f"| {setup} | {impl} | {prec} | {med:.0f} | {runs} | "
              f"{1000 * args.batch_size / med:.1f} | {rel} |")
        rows.append({"setup": setup, "impl": impl, "precision": prec, "ms_per_step": med,
                     "runs": ms, "last_loss": losses[(setup, impl, prec)]})
    if args.json:
        Path(args.json).write_text(json.dumps({"batch_size": args.batch_size, "rows": rows,
                                               "loads": loads}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, "methods")
    args = p.parse_args()
    run(args, p.error)


if __name__ == "__main__":
    main()
