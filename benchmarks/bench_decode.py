#!/usr/bin/env python
"""Decode + crop per loader worker: today's path against the encoded-image path, in one run.

What one worker does per source image before the batch is collated (the batched path's
``worker_fn``; the per-image path does the same decode and crops before its colour work):

- **today**: PIL decode (``load_rgb``: ``Image.open`` + EXIF check + RGB), one copy to a uint8
  tensor (``as_uint8_chw``), then per view torchvision's box draw and ``resized_crop``
  (bilinear, antialiased, torch's uint8 kernel) -- the code before issue 20, written out here;
- **full**: ``EncodedImage(reduced=False)`` through ``WorkerCrops``: header read, libjpeg-turbo
  through ``torchvision.io.decode_jpeg``, the channels-last crop + resize (same pixels as today);
- **reduced**: the same with reduced-scale (DCT) decoding where every view's box allows it (the
  default for shards). Its pixel error against the exact decode is reported as PSNR over the
  views (same seeds: same boxes);
- **fast** (opt-in, ``decode=fast``): reduced + libjpeg-turbo's fast inverse DCT and chroma
  upsampling, PSNR likewise.

Pipelines: MoCo v2 two views at 224 px, multi-crop 2 x 224 + 6 x 96, and MoCo v2 two views at
128 px (where reduced decoding applies). Data: generated photo-like JPEGs of ImageNet size
(generated shapes drawn at 500 px with clutter, 480-500 x 360-375 px, Gaussian noise for a
photo's entropy, quality 95: about 110 KB). One thread, main process, bytes in memory (no file
I/O); after one warm-up round, every round runs each method over the same images with the same
seeds, methods interleaved and each first in turn; medians over the rounds, ratios per round
then their median.

    python benchmarks/bench_decode.py --rounds 7 --n 64
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms import RandomResizedCrop as RRC  # noqa: E402
from torchvision.transforms.v2 import functional as TF  # noqa: E402

from contrastive.augment import get_pipeline  # noqa: E402
from contrastive.augment.per_image import as_uint8_chw  # noqa: E402
from contrastive.data.decode import EncodedImage  # noqa: E402
from contrastive.data.generated import generate_shapes  # noqa: E402
from contrastive.data.io import to_rgb  # noqa: E402
from contrastive.hardware import cpu_kind_line  # noqa: E402

PIPELINES = {
    "MoCo v2, 2 x 224": ("mocov2", dict(image_size=224)),
    "multi-crop, 2 x 224 + 6 x 96": ("multicrop", dict(image_size=224, local_size=96)),
    "MoCo v2, 2 x 128": ("mocov2", dict(image_size=128)),
}


def make_jpegs(n: int, seed: int = 0, noise: float = 12.0, quality: int = 95) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for s in range(0, n, 16):
        imgs, _ = generate_shapes(min(16, n - s), 500, seed=seed, clutter=6, start=s)
        for img in imgs:
            h, w = int(rng.integers(360, 376)), int(rng.integers(480, 501))
            arr = img.permute(1, 2, 0).numpy()[:h, :w].astype(np.float32)
            arr = np.clip(arr + rng.normal(0, noise, arr.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
            out.append(buf.getvalue())
    return out


# ---- today's worker (before issue 20), written out ------------------------------------------

def today_decode(data: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        if im.getexif().get(0x0112, 1) != 1:
            im = ImageOps.exif_transpose(im)
        return as_uint8_chw(to_rgb(im))


def today_crop(t: torch.Tensor, view) -> torch.Tensor:
    top, left, h, w = RRC.get_params(t, list(view.scale), list(view.ratio))
    out = TF.resized_crop(t, top, left, h, w, [view.size, view.size], InterpolationMode.BILINEAR,
                          antialias=True)
    return out.contiguous()


def run_today(blobs, views, stages):
    outs = []
    for k, data in enumerate(blobs):
        torch.default_generator.manual_seed(k)  # CPU draws only: torch.manual_seed also queues CUDA seeding (~0.2-1 ms)
        t0 = time.perf_counter()
        t = today_decode(data)
        t1 = time.perf_counter()
        outs.append([today_crop(t, v) for v in views])
        t2 = time.perf_counter()
        stages["decode"] += t1 - t0
        stages["box+crop+resize"] += t2 - t1
    return outs


def run_encoded(blobs, worker, method, stages):
    outs = []
    for k, data in enumerate(blobs):
        torch.default_generator.manual_seed(k)  # CPU draws only: torch.manual_seed also queues CUDA seeding (~0.2-1 ms)
        t0 = time.perf_counter()
        enc = EncodedImage(data, f"img{k}", reduced=method != "full", fast=method == "fast")
        t1 = time.perf_counter()
        if method == "full":  # decode first, so that decode and crop are timed apart
            enc.full()
        t2 = time.perf_counter()
        outs.append(worker(enc))
        t3 = time.perf_counter()
        stages["header"] += t1 - t0
        if method == "full":
            stages["decode"] += t2 - t1
            stages["box+crop+resize"] += t3 - t2
        else:
            stages["decode+box+crop+resize"] += t3 - t2
            stages["reduced"] += float(min(enc._cache) > 1)
    return outs


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float((a.double() - b.double()).square().mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def decode_only(blobs, rounds):
    """ms per image of a full-size decode to a uint8 tensor: PIL (today), torchvision, simplejpeg,
    and simplejpeg's fast-DCT + fast-upsampling options (with their PSNR against the exact decode)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        import simplejpeg
    except ImportError:
        simplejpeg = None
    fns = {"PIL (today)": today_decode,
           "torchvision": lambda b: decode_jpeg(torch.frombuffer(bytearray(b), dtype=torch.uint8),
                                                mode=ImageReadMode.RGB)}
    if simplejpeg is not None:
        fns["simplejpeg"] = lambda b: torch.from_numpy(simplejpeg.decode_jpeg(b)).permute(2, 0, 1)
        fns["simplejpeg fastdct+fastupsample (`decode=fast`, opt-in)"] = lambda b: torch.from_numpy(
            simplejpeg.decode_jpeg(b, fastdct=True, fastupsample=True)).permute(2, 0, 1)
    res = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for b in blobs:
                f(b)
            res[k].append((time.perf_counter() - t0) / len(blobs) * 1e3)
    ps = {}
    for k, f in fns.items():
        vals = [psnr(f(b), today_decode(b)) for b in blobs]
        ps[k] = statistics.median(vals)
    return {k: statistics.median(v) for k, v in res.items()}, ps


def cpu_name() -> str:
    """The CPU kind the figures were measured on (contrastive.hardware.cpu_kind_line)."""
    return cpu_kind_line()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64, help="images")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    blobs = make_jpegs(args.n)
    kb = sum(len(b) for b in blobs) / len(blobs) / 1024
    sizes = [Image.open(io.BytesIO(b)).size for b in blobs]
    print(f"# {len(blobs)} JPEGs, mean {kb:.0f} KB, {min(sizes)} .. {max(sizes)} (W, H); "
          f"{cpu_name()}, torch {torch.__version__}, Pillow {Image.__version__}")
    d, ps = decode_only(blobs, args.rounds)
    print()
    print("| full-size decode | ms / image | vs PIL | PSNR vs PIL (dB) |")
    print("|---|---|---|---|")
    for k, v in d.items():
        print(f"| {k} | {v:.2f} | {d['PIL (today)'] / v:.2f}x | "
              + ("exact" if not np.isfinite(ps[k]) else f"{ps[k]:.1f}") + " |")
    print()
    methods = ("today", "full", "reduced", "fast")
    print("| pipeline | today img/s | full img/s | reduced img/s | fast (opt-in) img/s | full / today "
          "| reduced / today | fast / today | reduced decodes | PSNR vs exact, reduced (dB, median / min "
          "over the views that differ) | PSNR vs exact, fast (likewise) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    details = []
    for name, (preset, kw) in PIPELINES.items():
        pipe = get_pipeline(preset, **kw)
        worker, _ = pipe.split()
        views = pipe.views
        rate = {m: [] for m in methods}
        ratio = {m: [] for m in methods[1:]}
        stages = {m: {} for m in methods}
        outs = {}
        for r in range(-1, args.rounds):  # round -1 warms up and is not counted
            times = {}
            for m in methods[r % 4:] + methods[:r % 4]:  # each method first in turn
                st = stages[m]
                for key in ("header", "decode", "box+crop+resize", "decode+box+crop+resize", "reduced"):
                    st.setdefault(key, 0.0)
                if r < 0:
                    st = {k: 0.0 for k in st}
                t0 = time.perf_counter()
                out = run_today(blobs, views, st) if m == "today" else run_encoded(blobs, worker, m, st)
                times[m] = time.perf_counter() - t0
                outs[m] = out
                if r >= 0:
                    rate[m].append(len(blobs) / times[m])
            assert all(torch.equal(x, y) for a, b in zip(outs["today"], outs["full"]) for x, y in zip(a, b)), \
                "full decode differs from today's pixels"
            for m in ratio:
                if r >= 0:
                    ratio[m].append(times["today"] / times[m])

        def quality(m, outs=outs):
            ps = [psnr(x, y) for a, b in zip(outs["today"], outs[m]) for x, y in zip(a, b)]
            finite = [p for p in ps if np.isfinite(p)]
            if not finite:
                return "exact"
            return (f"{statistics.median(finite):.1f} / {min(finite):.1f} "
                    f"({len(ps) - len(finite)} of {len(ps)} views exact)")

        n_red = stages["reduced"]["reduced"] / args.rounds
        med = {m: statistics.median(v) for m, v in rate.items()}
        print(f"| {name} | " + " | ".join(f"{med[m]:.0f}" for m in methods) + " | "
              + " | ".join(f"{statistics.median(ratio[m]):.2f}x" for m in methods[1:])
              + f" | {n_red:.0f} of {len(blobs)} | {quality('reduced')} | {quality('fast')} |")
        per = {m: {k: 1e3 * v / (args.rounds * len(blobs)) for k, v in st.items() if v and k != "reduced"}
               for m, st in stages.items()}
        details.append((name, per))
    print()
    print("Where a worker's time goes (ms per source image, all views; averaged over all rounds):")
    print()
    print("| pipeline | method | stage ms/image |")
    print("|---|---|---|")
    for name, per in details:
        for m, st in per.items():
            print(f"| {name} | {m} | " + ", ".join(f"{k} {v:.2f}" for k, v in st.items()) + " |")


if __name__ == "__main__":
    main()
