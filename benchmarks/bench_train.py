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

- Method steps (``--setup byol,...`` or ``methods``): forwarded to ``bench_train_methods.py``
  (each method's training step on pre-made tensors, ours against lightly's; see there).

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
        --repeats 3 --threads 1       # method steps (bench_train_methods.py), ours vs lightly
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train_methods import STEP_SETUPS, add_arguments, is_method_run, run_worker  # noqa: E402
from bench_train_methods import run as run_method_steps  # noqa: E402

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

# --------------------------------------------------------------------------------------------
# driver


def run_one(impl: str, precision: str, args: argparse.Namespace, *, steps: int, seed: int,
            batched: str, split_bn: str = "recipe") -> list[dict]:
    argv = ["--worker", impl, "--precision", precision, "--steps", str(steps), "--seed",
            str(seed), "--data", args.data, "--batch-size", str(args.batch_size), "--workers",
            str(args.workers), "--device", args.device, "--setup", args.setup,
            "--batched-augment", batched, "--split-bn", split_bn]
    if args.channels_last:
        argv.append("--channels-last")
    return run_worker(__file__, argv, f"{impl} {precision}")


def rate(records: list[dict], warmup: int, batch: int) -> float:
    """images/s between step ``warmup`` and the last record (both multiples of LOG)."""
    times = {r["step"]: r["time"] for r in records}
    last = max(times)
    return (last - warmup) * batch / (times[last] - times[warmup])


def main() -> None:
    from contrastive.hardware import cpu_kind_line

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, "moco_cifar")  # the flags shared with the method steps
    p.add_argument("--batched-augment", default="auto", help="ours: comma list of auto/on/off")
    p.add_argument("--split-bn", default="recipe", help="ours: comma list of split-BN groups "
                   "('recipe': the recipe's 8; 0: plain BN, the model of lightly's example)")
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
    # worker mode
    p.add_argument("--data", default="")
    args = p.parse_args()
    if is_method_run(args):
        run_method_steps(args, p.error)
        return
    if args.worker:
        (worker_ours if args.worker == "ours" else worker_lightly)(args)
        return
    args.steps, args.warmup = args.steps or 40, args.warmup or 10
    if args.setup not in GMAC:
        p.error(f"--setup: moco_cifar, moco_r50, or a comma list of {STEP_SETUPS} "
                "(bench_train_methods.py)")
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
