"""Two-view MoCo v2 augmentation throughput: reference vs our per-image vs our batched path.

Side by side in one run, interleaved (a b c a b c ...), each with the same loader workers:
  (a) reference: PIL images + torchvision (v1) transforms per image, the way the official MoCo
      code does it (ImageFolder-style PIL loader, TwoCropsTransform, a PIL GaussianBlur),
      float32 views collated in the workers;
  (b) ours, per-image path: ``get_pipeline("mocov2")`` in the workers (torchvision v2 on tensors);
  (c) ours, batched path: workers decode + crop to uint8, ``device_fn`` on the whole batch on
      ``--device`` with per-sample parameters.
Data: CIFAR-10 JPEG (32 px, from ../shared/data/cifar10-jpeg.tar, a subset extracted to a
temporary folder) and a fixture of larger JPEGs (generated shapes drawn at 320-500 px with
clutter and noise, saved as JPEG quality 90) cropped to 224 px.

Also prints a single-thread per-stage breakdown (ms per source image, both views): decode,
crop, colour (jitter + grayscale), blur, flip + to float + normalise, transfer (collate, and the
host-to-device copy on CUDA).

    .venv/bin/python benchmarks/bench_augment.py            # CPU, about 3 minutes
    .venv/bin/python benchmarks/bench_augment.py --device cuda --out results-gpu.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

if "--no-thp" not in sys.argv:
    # 2 MB pages for torch's large CPU allocations (read once, before torch allocates): fewer
    # page faults when a fresh (B, 3, 224, 224) float batch is written. Inherited by workers.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision.transforms as T  # noqa: E402
from PIL import Image, ImageFilter  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data import default_collate as collate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contrastive.augment import get_pipeline  # noqa: E402
from contrastive.data import build_loader, generate_shapes, get_dataset, load_rgb  # noqa: E402
from contrastive.hardware import cpu_kind_line  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


# ---- (a) the reference, written the way the official MoCo code builds it --------------------

class PILGaussianBlur:
    """Gaussian blur with a random radius drawn from ``sigma`` (PIL's ImageFilter)."""

    def __init__(self, sigma=(0.1, 2.0)):
        self.sigma = sigma

    def __call__(self, img):
        return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(*self.sigma)))


class TwoViews:
    def __init__(self, t):
        self.t = t

    def __call__(self, x):
        return [self.t(x), self.t(x)]


def reference_transform(size: int) -> T.Compose:
    ops = [T.RandomResizedCrop(size, scale=(0.08, 1.0) if size <= 64 else (0.2, 1.0))]
    ops += [T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2)]
    if size > 64:  # the CIFAR demo has no blur
        ops.append(T.RandomApply([PILGaussianBlur((0.1, 2.0))], p=0.5))
    ops += [T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    return T.Compose(ops)


class PILFolder(Dataset):
    """torchvision ImageFolder's loading: ``Image.open(path).convert('RGB')``."""

    def __init__(self, paths, transform):
        self.paths, self.transform = paths, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            img = Image.open(f).convert("RGB")
        return self.transform(img), 0


# ---- fixtures ---------------------------------------------------------------------------------

def extract_cifar(tar_path: Path, dest: Path, n: int) -> list[Path]:
    with tarfile.open(tar_path) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and m.name.startswith("train/")]
        step = max(1, len(members) // n)
        chosen = members[::step][:n]
        tf.extractall(dest, members=chosen, filter="data")
    return sorted(dest.glob("train/*/*.jpg"))


def make_small_jpegs(dest: Path, n: int, seed: int = 1) -> list[Path]:
    """A stand-in for CIFAR-10 JPEG where the tar is absent: 32-px shapes + noise, quality 75."""
    rng = np.random.default_rng(seed)
    imgs, labels = generate_shapes(n, 32, seed=seed, clutter=2)
    paths = []
    for i, (img, y) in enumerate(zip(imgs, labels)):
        arr = np.clip(img.permute(1, 2, 0).numpy() + rng.normal(0, 8, (32, 32, 3)), 0, 255).astype(np.uint8)
        p = dest / "train" / str(int(y)) / f"{i:05d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(p, quality=75)
        paths.append(p)
    return paths


def make_large_jpegs(dest: Path, n: int, seed: int = 0) -> list[Path]:
    """Shapes at 500 px with clutter, plus noise (photo-like JPEG entropy), cropped to random
    320-500 px sides and saved as JPEG quality 90."""
    rng = np.random.default_rng(seed)
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, n, 32):
        imgs, labels = generate_shapes(min(32, n - s), 500, seed=seed, clutter=6, start=s)
        for k, (img, y) in enumerate(zip(imgs, labels)):
            h, w = rng.integers(320, 501, size=2)
            arr = img.permute(1, 2, 0).numpy()[:h, :w].astype(np.int16)
            arr = np.clip(arr + rng.normal(0, 10, arr.shape), 0, 255).astype(np.uint8)
            p = dest / str(int(y)) / f"{s + k:05d}.jpg"
            p.parent.mkdir(exist_ok=True)
            Image.fromarray(arr).save(p, quality=90)
            paths.append(p)
    return paths


# ---- throughput -------------------------------------------------------------------------------

def loader_a(paths, size, batch, workers):
    return DataLoader(PILFolder(paths, TwoViews(reference_transform(size))), batch_size=batch,
                      shuffle=True, num_workers=workers, drop_last=True,
                      persistent_workers=workers > 0, pin_memory=False)


def run_epoch(loader, device, device_fn=None, gen=None) -> tuple[int, float]:
    it = iter(loader)
    views, _ = next(it)  # warm-up batch: workers started, pipelines primed
    if device_fn is not None:
        device_fn([v.to(device) for v in views], gen)
    sync(device)
    n, t0 = 0, time.perf_counter()
    for views, _ in it:
        views = [v.to(device, non_blocking=True) for v in views]
        if device_fn is not None:
            views = device_fn(views, gen)
        n += views[0].shape[0]
    sync(device)
    return n, time.perf_counter() - t0


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def throughput(paths, size, args, device) -> dict[str, list[float]]:
    folder = str(paths[0].parents[1])
    pipe = get_pipeline("mocov2", image_size=size)
    worker_fn, device_fn = pipe.split()
    pin = device.type == "cuda"
    loaders = {
        "a": loader_a(paths, size, args.batch_size, args.workers),
        "b": build_loader(get_dataset(f"imagefolder:{folder}", transform=pipe), args.batch_size,
                          num_workers=args.workers, seed=0, pin_memory=pin),
        "c": build_loader(get_dataset(f"imagefolder:{folder}", transform=worker_fn), args.batch_size,
                          num_workers=args.workers, seed=0, pin_memory=pin),
    }
    gen = torch.Generator(device=device).manual_seed(0)
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(args.rounds):
        for key, loader in loaders.items():
            n, dt = run_epoch(loader, device, device_fn if key == "c" else None, gen)
            rates[key].append(n / dt)
            print(f"  {size:>3} px round {r} ({key}): {n / dt:8.1f} images/s", flush=True)
    del loaders
    return rates


def device_only(size: int, device: torch.device, batch: int, iters: int = 10) -> float:
    """Images/s of the device half alone on uint8 batches already on the device."""
    _, device_fn = get_pipeline("mocov2", image_size=size).split()
    g = torch.Generator().manual_seed(0)
    views = [torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=g).to(device)
             for _ in range(2)]
    gen = torch.Generator(device=device).manual_seed(0)
    for _ in range(2):
        device_fn(views, gen)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        device_fn(views, gen)
    sync(device)
    return batch * iters / (time.perf_counter() - t0)


# ---- per-stage breakdown (one thread, main process) -----------------------------------------

class Stages:
    def __init__(self, device):
        self.t: dict[str, float] = {}
        self.device = device

    def add(self, stage, dt):
        self.t[stage] = self.t.get(stage, 0.0) + dt


def timed(stages, name, fn, *a):
    t0 = time.perf_counter()
    out = fn(*a)
    stages.add(name, time.perf_counter() - t0)
    return out


def breakdown(paths, size, device, n_images: int) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    random.seed(0)
    paths = paths[:n_images]
    res = {}
    # (a)
    st = Stages(device)
    ref = reference_transform(size).transforms
    views = []
    for p in paths:
        img = timed(st, "decode", lambda q: Image.open(q).convert("RGB"), p)
        for _ in range(2):
            x = timed(st, "crop", ref[0], img)
            for op in ref[1:]:
                name = {"RandomApply": "colour", "RandomGrayscale": "colour", "RandomHorizontalFlip": "flip+norm",
                        "ToTensor": "flip+norm", "Normalize": "flip+norm"}[type(op).__name__]
                if isinstance(op, T.RandomApply) and isinstance(op.transforms[0], PILGaussianBlur):
                    name = "blur"
                x = timed(st, name, op, x)
            views.append(x)
    timed(st, "transfer", lambda: [collate(views[0::2]).to(device), collate(views[1::2]).to(device)])
    sync(device)
    res["a"] = st.t
    # (b)
    st = Stages(device)
    pipe = get_pipeline("mocov2", image_size=size)
    views = []
    for p in paths:
        img = timed(st, "decode", load_rgb, p)
        for view in pipe._per_image:
            x = timed(st, "crop", view.crop, img)
            x = timed(st, "flip+norm", lambda t: t.to(torch.float32).mul_(1 / 255), x)
            for op in view.colour.transforms:
                kind = type(op.transforms[0] if hasattr(op, "transforms") else op).__name__
                name = {"SeparableGaussianBlur": "blur", "RandomHorizontalFlip": "flip+norm"}.get(kind, "colour")
                x = timed(st, name, op, x)
            x = timed(st, "flip+norm", lambda t: T.functional.normalize(t, MEAN, STD), x)
            views.append(x)
    timed(st, "transfer", lambda: [collate(views[0::2]).to(device), collate(views[1::2]).to(device)])
    sync(device)
    res["b"] = st.t
    # (c)
    st = Stages(device)
    worker_fn, device_fn = pipe.split()
    crops = []
    for p in paths:
        img = timed(st, "decode", load_rgb, p)
        crops.append(timed(st, "crop", worker_fn, img))
    t0 = time.perf_counter()
    batch = [collate([c[v] for c in crops]).to(device, non_blocking=True) for v in range(2)]
    sync(device)
    st.add("transfer", time.perf_counter() - t0)
    stage_times: dict[str, float] = {}
    device_fn(batch, torch.Generator(device=device).manual_seed(0), stage_times=stage_times)
    mapping = {"colour": "colour", "grayscale": "colour", "blur": "blur"}
    for k, v in stage_times.items():
        st.add(mapping.get(k, "flip+norm"), v)
    res["c"] = st.t
    return {k: {s: 1000 * v / len(paths) for s, v in d.items()} for k, d in res.items()}


def cpu_name() -> str:
    """The CPU kind the figures were measured on (contrastive.hardware.cpu_kind_line)."""
    return cpu_kind_line()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cifar-tar", type=Path, default=ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar")
    ap.add_argument("--n32", type=int, default=3200, help="CIFAR-10 JPEG images (32 px)")
    ap.add_argument("--n224", type=int, default=448, help="large generated JPEGs (224 px crops)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stage-images", type=int, default=64, help="images for the per-stage breakdown")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the main process")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown report here")
    ap.add_argument("--skip32", action="store_true")
    ap.add_argument("--no-thp", action="store_true",
                    help="do not set THP_MEM_ALLOC_ENABLE=1 (transparent huge pages for large tensors)")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_augment_"))
    sets = {}
    data32 = ""
    t0 = time.perf_counter()
    if not args.skip32:
        if args.cifar_tar.exists():
            sets[32] = extract_cifar(args.cifar_tar, work / "cifar", args.n32)
            data32 = "CIFAR-10 JPEG (32 x 32)"
        else:
            print(f"{args.cifar_tar} not found: 32 px uses generated 32-px JPEGs instead")
            sets[32] = make_small_jpegs(work / "small", args.n32)
            data32 = "generated 32-px JPEGs (CIFAR-10 JPEG tar not found)"
    sets[224] = make_large_jpegs(work / "large", args.n224)
    mean_kb = np.mean([os.path.getsize(p) for p in sets[224]]) / 1024
    print(f"fixtures ready in {time.perf_counter() - t0:.1f} s ({work}); large JPEGs average {mean_kb:.0f} KB")

    results = {}
    for size, paths in sets.items():
        print(f"throughput at {size} px, {len(paths)} images, batch {args.batch_size}, "
              f"{args.workers} workers, device {device}")
        rates = throughput(paths, size, args, device)
        stages = breakdown(paths, size, device, args.stage_images)
        alone = {b: device_only(size, device, b) for b in sorted({args.batch_size, 256})}
        results[size] = (rates, stages, len(paths), alone)

    names = {"a": "(a) reference PIL + torchvision", "b": "(b) ours, per-image (v2)",
             "c": f"(c) ours, batched on {device.type}"}
    stage_cols = ["decode", "crop", "colour", "blur", "flip+norm", "transfer"]
    lines = [
        "# Augmentation throughput (two-view MoCo v2)",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {cpu_name()}, {len(os.sched_getaffinity(0))} cores available"
        + (f"; GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""),
        f"- torch {torch.__version__}, Pillow {Image.__version__}, Python {platform.python_version()}, "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}",
        f"- command: `{' '.join(['python', *sys.argv])}`",
        f"- batch {args.batch_size}, {args.workers} loader workers, main process {args.threads} torch "
        f"thread(s), {args.rounds} interleaved rounds (median shown), throughput = source images/s "
        f"(each gives 2 views)",
        f"- 224 px data: {len(sets[224])} generated JPEGs, 320-500 px sides, average {mean_kb:.0f} KB",
        "",
    ]
    for size, (rates, stages, n, alone) in results.items():
        med = {k: statistics.median(v) for k, v in rates.items()}
        data = data32 if size == 32 else "generated JPEGs, 320-500 px"
        lines += [f"## {size} px: {data}, {n} images", "",
                  "| pipeline | images/s (median) | rounds | vs (a) |", "| --- | --- | --- | --- |"]
        for k in "abc":
            lines.append(f"| {names[k]} | {med[k]:.0f} | {', '.join(f'{r:.0f}' for r in rates[k])} | "
                         f"{med[k] / med['a']:.2f}x |")
        lines += ["", f"Per-stage cost, ms per source image (both views), one thread, "
                      f"{min(n, args.stage_images)} images:", "",
                  "| pipeline | " + " | ".join(stage_cols) + " | total |",
                  "| --- |" + " --- |" * (len(stage_cols) + 1)]
        for k in "abc":
            row = [stages[k].get(s, 0.0) for s in stage_cols]
            lines.append(f"| {names[k]} | " + " | ".join(f"{v:.2f}" for v in row) + f" | {sum(row):.2f} |")
        lines += ["", "Device half of (c) alone (uint8 views already on the device, "
                  f"{args.threads} thread(s)): " + ", ".join(f"batch {b}: {r:.0f} images/s" for b, r in alone.items()),
                  ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
