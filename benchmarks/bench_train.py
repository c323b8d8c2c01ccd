#!/usr/bin/env python
"""End-to-end training throughput: our engine vs the same setup written with lightly.

What is timed: whole MoCo training steps INCLUDING data loading (JPEG decode, augmentation,
collation, host-to-device copy), in steady state: each run trains ``--steps`` steps and the rate
is taken between step ``--warmup`` and the last step from per-step wall-clock timestamps, so
start-up (imports, worker spawn, first batches) is excluded. Runs alternate A B A B ... in fresh
subprocesses (``--repeats``) and the median per configuration is reported, as BENCHMARKS.md asks
on this shared machine. MFU = images/s x FLOPs per image / the FLOP/s of a large matrix product
(the faster of ``torch.mm`` and the same product in oneDNN, see ``matmul_flops``) measured in the same run
at the same precision (fp32 or bf16) on the same device.

Setups (``--setup``):
- ``moco_cifar``: ``recipes/moco_cifar.py`` (CIFAR ResNet-18, linear 512->128 head, K 4096,
  m 0.99, tau 0.1, split BN 8, no blur, 32 px) at ``--batch-size`` 64, against lightly's MoCo
  example written for the same model: our CIFAR ResNet-18 backbone, ``nn.Linear(512, 128)``,
  ``lightly.loss.NTXentLoss(memory_bank_size=4096)``, ``lightly.models.utils.update_momentum``,
  ``lightly.transforms.MoCoV2Transform(input_size=32, gaussian_blur=0.0)`` on torchvision's
  ImageFolder, SGD lr 0.06. FLOPs per image: 4 forward passes (query forward + backward = 3,
  key forward 1) x 2 x 0.556 GMAC (the convolutions of the CIFAR ResNet-18 at 32 px, counted).
- ``moco_r50`` (GPU): ``recipes/moco_r50.py`` (ResNet-50, 224 px, 2-layer head, K 65536) on the
  same JPEGs (upsampled by the crop); 4 x 2 x 4.09 GMAC per image (torchvision's model table:
  its "GFLOPS" are multiply-adds). Compares the per-image and
  the batched augmentation paths (``--batched-augment off|on``): the input pipeline decides.

- Method steps (``--setup byol,simsiam,nnclr,barlow_twins,vicreg,swav,dino`` or ``methods``):
  one training step of each method, ours (the method module, its CIFAR preset) against
  lightly's implementation of the same method (``lightly.loss``, the heads of
  ``lightly.models.modules``, ``update_momentum`` / ``cosine_schedule``, written as lightly's
  examples), on the SAME model: our CIFAR ResNet-18 backbone for both, the same head widths
  (BYOL 4096->256 + predictor; SimSiam 3-layer 2048 projector, 512 predictor; NNCLR 2048->256,
  4096 predictor, 65,536-entry support set, tau 0.2; Barlow Twins and VICReg 2048-2048-2048;
  SwAV 2048->128, 3000 prototypes, no queue; DINO 2048-2048-256 -> 4096, no BN). What is timed:
  forward of both views (+ the momentum encoder and its update where the method has one), the
  loss, backward and a torch SGD step (momentum 0.9), on the same PRE-MADE tensors (two batches
  of N(0, 1) 32 px views, alternating): no data loading, no augmentation, so the figure is the
  method's own cost. ms/step between step ``--warmup`` and the last; fresh subprocess per run,
  configurations alternated, median over ``--repeats``; the 1-min load average before each
  run is printed beside the figures (``--threads`` fixes torch's thread count).

Data: the shared CIFAR-10 JPEG copy (``../shared/data/cifar10-jpeg.tar``), unpacked once to
``--cache``; the first ``--images`` files (equal per class) are linked into a folder that both
implementations read.

Examples::

    python benchmarks/bench_train.py                          # CPU: ours fp32/bf16 vs lightly fp32
    python benchmarks/bench_train.py --curve 200              # + loss curves, fp32 vs bf16
    python benchmarks/bench_train.py --device cuda --workers 12 --batch-size 256 \\
        --impls ours --precisions fp32,bf16 --batched-augment on
    python benchmarks/bench_train.py --device cuda --setup moco_r50 --batch-size 256 \\
        --impls ours --precisions bf16 --batched-augment off,on --workers 14
    python benchmarks/bench_train.py --setup methods --batch-size 32 --steps 7 --warmup 2 \\
        --repeats 3 --threads 1                          # method steps, ours vs lightly
    python benchmarks/bench_train.py --interleave --setup methods --batch-size 16 --steps 22 \\
        --warmup 2 --threads 1              # the same, alternating step by step in one process
    python benchmarks/bench_train.py --count-ops --setup methods --batch-size 16   # FLOPs, ops
    python benchmarks/bench_train.py --worker ours --setup barlow_twins --result /tmp/r.jsonl \\
        --batch-size 16 --steps 4 --warmup 2 --profile 20   # torch.profiler's top operators
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED_TAR = ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar"
GMAC = {"moco_cifar": 0.556, "moco_r50": 4.09}  # forward multiply-adds per image (see above)
PASSES = 4  # query forward + backward (3) + key forward (1)
LOG = 10  # both implementations sync and record (mean loss, wall time) every LOG steps


# --------------------------------------------------------------------------------------------
# data


def prepare_data(cache: Path, images: int) -> Path:
    """Unpack the CIFAR-10 JPEG tar once; link ``images`` training files (equal per class) into
    ``cache/bench_<images>/train/<class>/``. Returns the folder holding ``train/``."""
    from contrastive.data import unpack_image_folder

    full = cache / "cifar10-jpeg"
    if not (full / "train").is_dir():
        if not SHARED_TAR.is_file():
            sys.exit(f"no data: {SHARED_TAR} not found (pass --data-dir with train/<class>/*.jpg)")
        unpack_image_folder(SHARED_TAR, full)
    train = full / "train"
    classes = sorted(p.name for p in train.iterdir() if p.is_dir())
    per = images // len(classes)
    out = cache / f"bench_{per * len(classes)}"
    if not (out / "train").is_dir():
        for c in classes:
            d = out / "train" / c
            d.mkdir(parents=True, exist_ok=True)
            for f in sorted((train / c).iterdir())[:per]:
                (d / f.name).symlink_to(f.resolve())
    return out


def _upscale(job: tuple[str, str, int]) -> None:
    from PIL import Image

    src, dst, size = job
    with Image.open(src) as im:
        im.convert("RGB").resize((size, size), Image.BICUBIC).save(dst, quality=90)


def make_jpegs(source: Path, size: int) -> Path:
    """The JPEGs of ``source/train`` upscaled to ``size`` px (bicubic, quality 90) in a sibling
    folder: a stand-in for ImageNet-sized photos when timing a 224 px input pipeline, where
    decoding, cropping and resizing decide the speed."""
    from multiprocessing import Pool

    out = source.parent / f"{source.name}_{size}px"
    if (out / "train").is_dir():
        return out
    jobs = []
    for f in sorted((source / "train").rglob("*.jpg")):
        dst = out / "train" / f.parent.name / f.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        jobs.append((str(f), str(dst), size))
    with Pool(os.cpu_count()) as pool:
        pool.map(_upscale, jobs, chunksize=64)
    return out


# --------------------------------------------------------------------------------------------
# peak


def matmul_flops(device: str, dtype_name: str, n: int, reps: int = 5) -> dict[str, float]:
    """FLOP/s of an n x n x n matrix product (median of ``reps`` after a warm-up): ``torch.mm``
    (MKL on the CPU, cuBLAS on the GPU) and, on the CPU, the same product through oneDNN
    (``mkldnn_linear``, the library that also runs the convolutions).

    On this AMD CPU MKL's fp32 GEMM reaches less than half of what oneDNN reaches on the same
    product (about 190 vs 450 GFLOP/s: MKL does not use its AVX-512 kernels on AMD), so an MFU
    against ``torch.mm`` alone exceeds 100 %; the larger of the two is the MFU peak.
    """
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    candidates = {"mm": lambda: a @ b}
    if device == "cpu" and torch.backends.mkldnn.is_available():
        am, bm = a.to_mkldnn(), b.to_mkldnn()
        candidates["onednn"] = lambda: torch._C._nn.mkldnn_linear(am, bm, None)
    rates = {}
    for name, fn in candidates.items():
        times = []
        for i in range(reps + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - t)
        rates[name] = 2 * n ** 3 / statistics.median(times)
    return rates


# --------------------------------------------------------------------------------------------
# workers (run in subprocesses)


def worker_ours(args: argparse.Namespace) -> None:
    """Train through the engine; per-step metrics (log_every=1) carry loss and wall time."""
    import importlib.util
    import logging

    logging.basicConfig(level=logging.WARNING)
    recipe = ROOT / "recipes" / f"{args.setup}.py"
    spec = importlib.util.spec_from_file_location(f"recipe_{args.setup}", recipe)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    cls = {"moco_cifar": "MoCoCifar", "moco_r50": "MoCoV2R50"}[args.setup]
    from contrastive.engine import parse_config, train

    out = Path(args.run_dir)
    argv = ["--data", args.data, "--output-dir", str(out), "--batch-size", str(args.batch_size),
            "--max-steps", str(args.steps), "--epochs", "100", "--num-workers",
            str(args.workers), "--seed", str(args.seed), "--log-every", str(LOG), "--progress",
            "false", "--knn-every", "0", "--save-every-steps", "0", "--save-every-epochs", "0",
            "--mixed-precision", {"fp32": "no", "bf16": "bf16"}[args.precision],
            "--batched-augment", args.batched_augment, "--cpu", str(args.device == "cpu")]
    if args.channels_last:
        argv += ["--channels-last"]
    if args.split_bn != "recipe":
        argv += ["--split-bn", args.split_bn]
    cfg = parse_config(getattr(mod, cls), argv)
    train(cfg, mod.build_method, mod.build_pipeline, recipe=args.setup)
    with open(out / "metrics.jsonl") as fh, open(args.result, "w") as res:
        for line in fh:
            rec = json.loads(line)
            if "loss" in rec:
                res.write(json.dumps({"step": rec["step"], "loss": rec["loss"],
                                      "time": rec["time"]}) + "\n")


def worker_lightly(args: argparse.Namespace) -> None:
    """lightly's MoCo example, written for the same model (see the module docstring)."""
    import copy

    import torch
    import torchvision
    from lightly.loss import NTXentLoss
    from lightly.models.utils import deactivate_requires_grad, update_momentum
    from lightly.transforms import MoCoV2Transform
    from torch import nn

    from contrastive.nn import create_encoder

    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    class MoCoModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = create_encoder("cifar_resnet18")
            self.projection_head = nn.Linear(512, 128)
            self.backbone_momentum = copy.deepcopy(self.backbone)
            self.projection_head_momentum = copy.deepcopy(self.projection_head)
            deactivate_requires_grad(self.backbone_momentum)
            deactivate_requires_grad(self.projection_head_momentum)

        def forward(self, x):
            return self.projection_head(self.backbone(x).flatten(start_dim=1))

        def forward_momentum(self, x):
            return self.projection_head_momentum(self.backbone_momentum(x).flatten(start_dim=1))

    model = MoCoModel().to(device)
    transform = MoCoV2Transform(input_size=32, gaussian_blur=0.0)
    dataset = torchvision.datasets.ImageFolder(str(Path(args.data) / "train"), transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         drop_last=True, num_workers=args.workers,
                                         persistent_workers=args.workers > 0,
                                         pin_memory=args.device == "cuda")
    criterion = NTXentLoss(temperature=0.1, memory_bank_size=(4096, 128))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.06)
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16,
                              enabled=args.precision == "bf16")
    step, loss_sum = 0, torch.zeros((), device=device)
    with open(args.result, "w") as res:
        while step < args.steps:
            for batch in loader:
                x_query, x_key = batch[0]
                update_momentum(model.backbone, model.backbone_momentum, m=0.99)
                update_momentum(model.projection_head, model.projection_head_momentum, m=0.99)
                x_query, x_key = x_query.to(device), x_key.to(device)
                with autocast:
                    query = model(x_query)
                    key = model.forward_momentum(x_key).detach()
                    loss = criterion(query, key)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                loss_sum += loss.detach()
                step += 1
                if step % LOG == 0:  # the host waits for the device here, as ours does
                    mean = loss_sum.item() / LOG
                    loss_sum.zero_()
                    res.write(json.dumps({"step": step, "loss": mean,
                                          "time": time.time()}) + "\n")
                if step >= args.steps:
                    break


# --------------------------------------------------------------------------------------------
# method steps on pre-made tensors (ours vs lightly's implementation of the same method)

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


def run_one(impl: str, precision: str, args: argparse.Namespace, *, steps: int, seed: int,
            batched: str, split_bn: str = "recipe") -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.jsonl"
        cmd = [sys.executable, __file__, "--worker", impl, "--precision", precision,
               "--steps", str(steps), "--seed", str(seed), "--result", str(result),
               "--run-dir", str(Path(tmp) / "run"), "--data", args.data,
               "--batch-size", str(args.batch_size), "--workers", str(args.workers),
               "--device", args.device, "--setup", args.setup, "--batched-augment", batched,
               "--split-bn", split_bn, "--threads", str(args.threads),
               "--local-crops", str(args.local_crops)]
        if args.channels_last:
            cmd.append("--channels-last")
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                                 "")}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{impl} {precision} failed:\n{proc.stderr[-3000:]}")
        return [json.loads(x) for x in result.read_text().splitlines()]


def rate(records: list[dict], warmup: int, batch: int) -> float:
    """images/s between step ``warmup`` and the last record (both multiples of LOG)."""
    times = {r["step"]: r["time"] for r in records}
    last = max(times)
    return (last - warmup) * batch / (times[last] - times[warmup])


def main() -> None:
    from contrastive.hardware import cpu_kind_line

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", default="moco_cifar", help="moco_cifar, moco_r50 (whole steps "
                   "with data loading), or a comma list of method steps on pre-made tensors: "
                   f"{','.join(STEP_SETUPS)} (or 'methods' for all of them)")
    p.add_argument("--impls", default="ours,lightly")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--lightly-precisions", default="fp32", help="lightly's example as written "
                   "is fp32; add bf16 for autocast around its step")
    p.add_argument("--batched-augment", default="auto", help="ours: comma list of auto/on/off")
    p.add_argument("--split-bn", default="recipe", help="ours: comma list of split-BN groups "
                   "('recipe': the recipe's 8; 0: plain BN, the model of lightly's example)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=None, help="a multiple of 10 (40; method "
                   "steps: any, 12)")
    p.add_argument("--warmup", type=int, default=None, help="a multiple of 10 (10; method "
                   "steps: any, 4)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--matmul-n", type=int, default=0, help="0: 2048 on CPU, 8192 on GPU")
    p.add_argument("--curve", type=int, default=0, help="also record the first N steps' loss "
                   "for ours fp32 (seeds 0 and 1) and bf16 (seed 0)")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "contrastive"))
    p.add_argument("--data-dir", default="", help="a folder with train/<class>/*.jpg instead")
    p.add_argument("--jpeg-size", type=int, default=0, help="time on the JPEGs upscaled to this "
                   "size (e.g. 400 for a 224 px pipeline)")
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
    p.add_argument("--data", default="")
    args = p.parse_args()
    if args.count_ops:
        args.steps = args.steps or 12  # the schedules' horizon
        for setup in args.setup.replace("methods", ",".join(STEP_SETUPS)).split(","):
            args.setup = setup
            count_ops(args)
        return
    if args.interleave:
        args.steps, args.warmup = args.steps or 12, args.warmup or 2
        for setup in args.setup.replace("methods", ",".join(STEP_SETUPS)).split(","):
            args.setup = setup
            interleaved_steps(args)
        return
    if args.worker:
        if args.setup in STEP_SETUPS:
            args.steps, args.warmup = args.steps or 12, args.warmup or 4
            worker_step(args)
        else:
            (worker_ours if args.worker == "ours" else worker_lightly)(args)
        return
    if args.setup == "methods":
        args.setup = ",".join(STEP_SETUPS)
    setups = args.setup.split(",")
    if all(s in STEP_SETUPS for s in setups):
        args.steps, args.warmup = args.steps or 12, args.warmup or 4
        if not 0 < args.warmup < args.steps:
            p.error("--warmup must be > 0 and < --steps")
        main_steps(args, setups)
        return
    args.steps, args.warmup = args.steps or 40, args.warmup or 10
    if args.setup not in GMAC:
        p.error(f"--setup: moco_cifar, moco_r50, or a comma list of {STEP_SETUPS}")
    if args.steps % LOG or args.warmup % LOG or args.warmup >= args.steps:
        p.error(f"--steps and --warmup must be multiples of {LOG} with warmup < steps")

    import torch

    args.data = args.data_dir or str(prepare_data(Path(args.cache), args.images))
    if args.jpeg_size:
        args.data = str(make_jpegs(Path(args.data), args.jpeg_size))
    n = args.matmul_n or (8192 if args.device == "cuda" else 2048)
    peaks: dict[str, list[float]] = {"fp32": [], "bf16": []}
    gemm: dict[str, list[dict[str, float]]] = {"fp32": [], "bf16": []}
    configs = []
    for impl in args.impls.split(","):
        precs = args.precisions if impl == "ours" else args.lightly_precisions
        for prec in precs.split(","):
            for batched in (args.batched_augment.split(",") if impl == "ours" else ["-"]):
                for split in (args.split_bn.split(",") if impl == "ours" else ["-"]):
                    configs.append((impl, prec, batched, split))
    rates: dict[tuple, list[float]] = {c: [] for c in configs}
    for rep in range(args.repeats):
        for prec in peaks:
            both = matmul_flops(args.device, prec, n)
            gemm[prec].append(both)
            peaks[prec].append(max(both.values()))
        for impl, prec, batched, split in configs:
            recs = run_one(impl, prec, args, steps=args.steps, seed=rep,
                           batched=batched if batched != "-" else "auto",
                           split_bn=split if split != "-" else "recipe")
            r = rate(recs, args.warmup, args.batch_size)
            rates[(impl, prec, batched, split)].append(r)
            print(f"rep {rep}: {impl:7s} {prec} batched={batched:4s} split_bn={split:6s} "
                  f"{r:8.1f} images/s", flush=True)
    peak = {k: statistics.median(v) for k, v in peaks.items()}
    flops_per_image = PASSES * 2 * GMAC[args.setup] * 1e9
    rows = []
    for (impl, prec, batched, split), rs in rates.items():
        med = statistics.median(rs)
        rows.append({"impl": impl, "precision": prec, "batched_augment": batched, "split_bn": split,
                     "images_per_s": med, "runs": rs,
                     "mfu": med * flops_per_image / peak[prec]})
    base = next((r["images_per_s"] for r in rows if r["impl"] == "lightly"
                 and r["precision"] == "fp32"), None)
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else cpu_kind_line())
    print(f"\n{args.setup}, batch {args.batch_size}, {args.workers} loader workers, "
          f"{args.device} ({device_name}, {os.cpu_count()} CPUs), torch {torch.__version__}")
    for prec in ("fp32", "bf16"):
        med = {k: statistics.median(g[k] for g in gemm[prec]) / 1e9 for k in gemm[prec][0]}
        both = ", ".join(f"{k} {v:.0f}" for k, v in med.items())
        print(f"{n}^3 product, {prec} (GFLOP/s): {both}; MFU peak {peak[prec] / 1e9:.0f}")
    print(f"{flops_per_image / 1e9:.2f} GFLOP per image")
    print("| impl | precision | batched aug | split BN | images/s (median) | runs | MFU | "
          "vs lightly fp32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        rel = f"{r['images_per_s'] / base:.2f}x" if base else "-"
        runs = ", ".join(f"{x:.1f}" for x in r["runs"])
        print(f"| {r['impl']} | {r['precision']} | {r['batched_augment']} | {r['split_bn']} | "
              f"{r['images_per_s']:.1f} | {runs} | {100 * r['mfu']:.1f} % | {rel} |")
    result = {"setup": args.setup, "batch_size": args.batch_size, "device": device_name,
              "peak_flops": peak, "gemm": gemm, "rows": rows}

    if args.curve:
        curves = {}
        for name, prec, seed in (("fp32_seed0", "fp32", 0), ("fp32_seed1", "fp32", 1),
                                 ("bf16_seed0", "bf16", 0)):
            recs = run_one("ours", prec, args, steps=args.curve, seed=seed,
                           batched=args.batched_augment.split(",")[0],
                           split_bn=args.split_bn.split(",")[0])
            curves[name] = [r["loss"] for r in recs]
        result["curves"] = curves
        print_curves(curves)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


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
                recs = run_one(impl, prec, args, steps=args.steps, seed=rep, batched="auto")
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


def print_curves(curves: dict[str, list[float]], every: int = LOG) -> None:
    """Loss curves (means over windows of ``every`` steps, as logged), and their mean absolute
    differences: bf16 vs fp32 (same seed) against fp32 seed 0 vs seed 1 (the noise floor)."""
    sm = curves
    names = list(sm)
    print("\n| steps | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for i in range(len(sm[names[0]])):
        print(f"| {i * every + 1}-{(i + 1) * every} | "
              + " | ".join(f"{sm[k][i]:.3f}" for k in names) + " |")

    def mad(a, b):
        return statistics.mean(abs(x - y) for x, y in zip(sm[a], sm[b]))

    print(f"\nmean |bf16 - fp32| (seed 0): {mad('bf16_seed0', 'fp32_seed0'):.3f}; "
          f"noise floor |fp32 seed 0 - seed 1|: {mad('fp32_seed0', 'fp32_seed1'):.3f}")


if __name__ == "__main__":
    main()
