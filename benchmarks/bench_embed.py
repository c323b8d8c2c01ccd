"""contrastive-embed's images per second beside a plain torch loop over the same images.

Both encode the same image folder with the same encoder (a CIFAR ResNet-18, random weights: the
speed does not depend on them) at the same batch size and loader workers, alternating, and report
the median of ``--rounds``. Ours: the whole command (the eval pipeline, shards written as .npy with
their ids, the manifest). The reference: torchvision's ImageFolder + ToTensor/Normalize, a
DataLoader and ``model(x)`` under ``torch.no_grad``, features kept in memory. The largest
difference between the two sets of L2-normalised vectors is printed as a check that both did the
same work.

Usage:
    tar xf cifar10-jpeg.tar --wildcards 'train/cat/0[0-4]*.jpg' ...   # a folder of images
    python benchmarks/bench_embed.py --data /tmp/c10/train [--batch-size 256] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from contrastive.eval.embed import main as embed_main
from contrastive.hardware import cpu_kind_line
from contrastive.nn import create_encoder

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def plain_loop(model: torch.nn.Module, data: str, batch_size: int, workers: int) -> torch.Tensor:
    from torchvision import datasets, transforms

    ds = datasets.ImageFolder(data, transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers)
    feats = []
    with torch.no_grad():
        for x, _ in loader:
            feats.append(model(x))
    return torch.cat(feats)


def ours(checkpoint: Path, data: str, out: Path, batch_size: int, workers: int) -> np.ndarray:
    with contextlib.redirect_stdout(io.StringIO()):
        embed_main(["--checkpoint", str(checkpoint), "--data", data, "--out", str(out), "--batch-size",
                    str(batch_size), "--num-workers", str(workers), "--no-progress", "--cpu"])
    manifest = json.loads((out / "manifest.json").read_text())
    return np.concatenate([np.load(out / s["vectors"]) for s in manifest["shards"]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a folder of images (class subfolders or flat)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    model = create_encoder("cifar_resnet18").eval()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "encoder.pt"
        torch.save({"encoder": "cifar_resnet18", "state_dict": model.state_dict(), "image_size": 32,
                    "mean": list(MEAN), "std": list(STD)}, checkpoint)
        times: dict[str, list[float]] = {"contrastive-embed": [], "plain torch loop": []}
        for r in range(args.rounds):
            t = time.perf_counter()
            vectors = ours(checkpoint, args.data, Path(tmp) / f"out{r}", args.batch_size, args.workers)
            times["contrastive-embed"].append(time.perf_counter() - t)
            t = time.perf_counter()
            reference = plain_loop(model, args.data, args.batch_size, args.workers)
            times["plain torch loop"].append(time.perf_counter() - t)
    n = len(vectors)
    diff = float((torch.from_numpy(vectors) - F.normalize(reference, dim=1)).abs().max())
    print(f"{cpu_kind_line()}; {torch.get_num_threads()} threads; {n} images, batch {args.batch_size}, "
          f"{args.workers} workers, median of {args.rounds}")
    for name, ts in times.items():
        print(f"  {name:18s} {n / statistics.median(ts):8.1f} images/s  ({statistics.median(ts):.2f} s)")
    print(f"  largest difference of the normalised vectors: {diff:.2e}")


if __name__ == "__main__":
    main()
