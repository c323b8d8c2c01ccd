"""Evaluation benchmarks, each side by side with the reference approach in the same run.

knn:     weighted kNN over a bank of N x D features (default 50,000 x 512, 10,000 queries, k 200,
         t 0.1): faiss IndexFlatIP (ours, exact), faiss fp16 store, our chunked torch matmul +
         topk, and the MoCo-demo style reference (one `queries @ bank.T` per query batch of 512,
         then topk and a one-hot (B, k, C) weighted sum). Alternating rounds, median times,
         and whether the predictions agree.
linear:  cached vs standard linear-probe protocol on a CIFAR-10 (JPEG copy) subset with a CIFAR
         ResNet-18: wall time and top-1 of each (the standard protocol with few epochs on the CPU).

Usage:
    python benchmarks/bench_eval.py knn [--n 50000] [--dim 512] [--queries 10000] [--rounds 3]
    python benchmarks/bench_eval.py linear --data imagefolder:~/.cache/contrastive/cifar10-jpeg \
        [--train-per-class 500] [--test-per-class 100] [--standard-epochs 5] [--checkpoint PATH]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from contrastive.eval.knn import WeightedKNN
from contrastive.hardware import cpu_kind_line


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reference_moco_demo(bank, labels, queries, k, t, c, batch=512):
    """The MoCo CIFAR demo's kNN: bank (D, N) pre-transposed, dense one-hot weighting."""
    bank_t = F.normalize(bank, dim=1).T.contiguous()
    preds = []
    for s in range(0, queries.shape[0], batch):
        q = F.normalize(queries[s : s + batch], dim=1)
        sim = q @ bank_t  # B x N
        w, idx = sim.topk(k, dim=1)
        w = (w / t).exp()
        one_hot = torch.zeros(q.shape[0] * k, c).scatter_(1, labels[idx].view(-1, 1), 1.0)
        scores = (one_hot.view(q.shape[0], k, c) * w.unsqueeze(-1)).sum(dim=1)
        preds.append(scores.argmax(dim=1))
    return torch.cat(preds)


def bench_knn(args):
    g = torch.Generator().manual_seed(0)
    # clustered features, so that the accuracy is not trivial and neighbours are meaningful
    centres = torch.randn(args.classes, args.dim, generator=g)
    labels = torch.randint(0, args.classes, (args.n,), generator=g)
    bank = centres[labels] + args.noise * torch.randn(args.n, args.dim, generator=g)
    q_labels = torch.randint(0, args.classes, (args.queries,), generator=g)
    queries = centres[q_labels] + args.noise * torch.randn(args.queries, args.dim, generator=g)
    k, t, c = args.k, 0.1, args.classes

    def run_index(backend, store):
        t0 = time.perf_counter()
        knn = WeightedKNN(bank, labels, num_classes=c, backend=backend, store=store)
        t1 = time.perf_counter()
        pred = knn.predict(queries, k=k, temperature=t, topk=1)[:, 0]
        return t1 - t0, time.perf_counter() - t1, pred

    contenders = {
        "faiss IndexFlatIP (ours, exact)": lambda: run_index("faiss", "float32"),
        "faiss fp16 IndexScalarQuantizer (ours, approx)": lambda: run_index("faiss", "float16"),
        "torch chunked matmul+topk (ours)": lambda: run_index("torch", "float32"),
        "torch matmul+topk, MoCo-demo style": lambda: (0.0, *_timed(reference_moco_demo, bank, labels, queries, k, t, c)),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    preds = {}
    for _ in range(args.rounds):  # A B C D A B C D ...
        for name, fn in contenders.items():
            build, search, pred = fn()
            times[name].append((build, search))
            preds[name] = pred
    ref = preds["torch matmul+topk, MoCo-demo style"]
    rows = []
    for name, ts in times.items():
        build = statistics.median(b for b, _ in ts)
        search = statistics.median(s for _, s in ts)
        rows.append({
            "method": name,
            "build_s": round(build, 3),
            "search_s": round(search, 3),
            "queries_per_s": round(args.queries / search),
            "top1": round(100.0 * (preds[name] == q_labels).float().mean().item(), 2),
            "agree_with_reference_%": round(100.0 * (preds[name] == ref).float().mean().item(), 3),
        })
    return {"bench": "knn", "n": args.n, "dim": args.dim, "queries": args.queries, "k": k,
            "classes": c, "rounds": args.rounds, "threads": torch.get_num_threads(),
            "max_rss_mb": round(rss_mb()), "rows": rows}


def _timed(fn, *a):
    t0 = time.perf_counter()
    out = fn(*a)
    return time.perf_counter() - t0, out


def bench_linear(args):
    from torch.utils.data import Subset

    from contrastive.eval.checkpoint import load_encoder
    from contrastive.eval.features import extract_features
    from contrastive.eval.linear import (
        evaluate_head,
        evaluate_standard,
        fit_linear_cached,
        train_linear_standard,
    )
    from contrastive.eval.runner import (
        dataset_labels,
        eval_transform,
        linear_train_transform,
        load_split,
    )

    torch.manual_seed(0)
    loaded = load_encoder(args.checkpoint or "random", encoder=None if args.checkpoint else args.encoder)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    enc = loaded.encoder.to(device)
    mean, std = loaded.setting("mean"), loaded.setting("std")
    if args.cifar_norm:
        mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)

    def per_class(ds, n):
        labels = dataset_labels(ds)
        idx = torch.cat([(labels == c).nonzero().flatten()[:n] for c in labels.unique()])
        return Subset(ds, idx.sort().values.tolist())

    from contrastive.data import build_loader

    def loader(ds, shuffle):
        return build_loader(ds, args.batch_size, shuffle=shuffle, num_workers=args.workers, seed=0, drop_last=False)

    size = args.image_size
    train_eval = per_class(load_split(args.data, "train", eval_transform(size, mean, std)), args.train_per_class)
    train_aug = per_class(load_split(args.data, "train", linear_train_transform(size, mean, std)),
                          args.train_per_class)
    test = per_class(load_split(args.data, "test", eval_transform(size, mean, std)), args.test_per_class)
    dtype = torch.bfloat16 if args.bf16 else None
    results = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        xtr, ytr = extract_features(enc, loader(train_eval, False), autocast_dtype=dtype, device=device)
        xte, yte = extract_features(enc, loader(test, False), autocast_dtype=dtype, device=device)
        t_feat = time.perf_counter() - t0
        res = fit_linear_cached(xtr.to(device), ytr.to(device), num_classes=10, epochs=args.cached_epochs,
                                batch_size=256)
        cached = evaluate_head(res.head, xte, yte)
        t_cached = time.perf_counter() - t0

        t0 = time.perf_counter()
        head = train_linear_standard(enc, loader(train_aug, True), num_classes=10, epochs=args.standard_epochs,
                                     lr=args.standard_lr, autocast_dtype=dtype, device=device)
        standard = evaluate_standard(enc, head, loader(test, False), autocast_dtype=dtype, device=device)
        t_standard = time.perf_counter() - t0
        results.append({
            "cached": {"top1": cached["top1"], "seconds": round(t_cached, 1), "feature_s": round(t_feat, 1),
                       "epochs": args.cached_epochs, "chosen_lr": res.lr, "chosen_wd": res.weight_decay},
            "standard": {"top1": standard["top1"], "seconds": round(t_standard, 1),
                         "epochs": args.standard_epochs, "lr": args.standard_lr},
            "speedup": round(t_standard / t_cached, 2),
        })
    return {"bench": "linear", "data": args.data, "encoder": loaded.name, "checkpoint": loaded.describe(),
            "train_images": len(train_eval), "test_images": len(test), "image_size": size,
            "bf16": args.bf16, "threads": torch.get_num_threads(), "device": str(device),
            "normalisation": {"mean": mean, "std": std}, "rounds": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="which", required=True)
    k = sub.add_parser("knn")
    k.add_argument("--n", type=int, default=50000)
    k.add_argument("--dim", type=int, default=512)
    k.add_argument("--queries", type=int, default=10000)
    k.add_argument("--classes", type=int, default=10)
    k.add_argument("--k", type=int, default=200)
    k.add_argument("--rounds", type=int, default=3)
    k.add_argument("--noise", type=float, default=12.0, help="cluster noise (top-1 about 60 %% at the defaults)")
    lin = sub.add_parser("linear")
    lin.add_argument("--data", required=True)
    lin.add_argument("--checkpoint", default=None, help="default: random init of --encoder")
    lin.add_argument("--encoder", default="cifar_resnet18")
    lin.add_argument("--image-size", type=int, default=32)
    lin.add_argument("--train-per-class", type=int, default=500)
    lin.add_argument("--test-per-class", type=int, default=100)
    lin.add_argument("--cached-epochs", type=int, default=100)
    lin.add_argument("--standard-epochs", type=int, default=5)
    lin.add_argument("--standard-lr", type=float, default=30.0)
    lin.add_argument("--batch-size", type=int, default=256)
    lin.add_argument("--workers", type=int, default=2)
    lin.add_argument("--rounds", type=int, default=1)
    lin.add_argument("--bf16", action="store_true")
    lin.add_argument("--device", default=None, help="default: cuda when available")
    lin.add_argument("--cifar-norm", action="store_true", help="CIFAR mean/std (the moco_cifar recipe's)")
    args = p.parse_args()
    out = bench_knn(args) if args.which == "knn" else bench_linear(args)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    out["machine"] = (f"{cpu_kind_line()}, {torch.get_num_threads()} threads, "
                      f"{gpu}, torch {torch.__version__}")
    out["date"] = time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
