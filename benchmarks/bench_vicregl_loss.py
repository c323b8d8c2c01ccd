"""Speed of our VICRegL criterion against lightly's ``VICRegLLoss``, side by side, forward +
backward, one process (the protocol of ``benchmarks/bench_peer_losses.py``).

Two global views of N images: global embeddings (N, D) and 7 x 7 local embeddings (N, 49, C)
that need gradients, and the views' location grids (random crop boxes of a 224-px image, our
``crop_grid``). Ours: ``vicregl_global_terms`` weighted (25, 25, 1) and the registry's
``vicregl_local`` on location matches (20, 4) and feature matches kept (20, 4), mixed 0.75 /
0.25; lightly's ``VICRegLLoss()`` (alpha 0.75, num_matches (20, 4) for both matchings) on the
same tensors. The two values differ a little by design (lightly orders the kept matches by
distance, the authors' code, which ours follows, by location: the per-slot statistics
differ; lightly's docstring says so), so no equality is checked; both are printed.

Timing: ours and the peer alternate, A B A B, ``--rounds`` rounds of ``--iters`` calls after
warm-up; reported: the median ms per call and the median of the per-round ratios peer / ours
(> 1: ours faster). Needs lightly (``pip install -e .[compare]``).

    PYTHONPATH=$PWD python benchmarks/bench_vicregl_loss.py --threads 2 [--batches 64 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from contrastive.hardware import cpu_kind_line
from contrastive.losses.decorrelation import (
    crop_grid,
    location_matches,
    vicregl_global_terms,
    vicregl_local,
)


def closures(n: int, d: int, c: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    from lightly.loss import VICRegLLoss

    g = torch.Generator().manual_seed(0)
    z = [torch.randn(n, d, generator=g).requires_grad_() for _ in range(2)]
    maps = [torch.randn(n, 49, c, generator=g).requires_grad_() for _ in range(2)]
    boxes = [torch.cat([torch.rand(n, 2, generator=g) * 100, 100 + torch.rand(n, 2, generator=g)
                        * 124], dim=1) for _ in range(2)]
    grids = [crop_grid(b, 7, 7) for b in boxes]
    peer = VICRegLLoss()

    def ours() -> torch.Tensor:
        inv, var, cov = vicregl_global_terms(z)
        local = vicregl_local(maps[0], maps[1], location_matches(grids[0], grids[1], 20),
                              location_matches(grids[1], grids[0], 4), feature_top=(20, 4))
        return 0.75 * (25 * inv + 25 * var + cov) + 0.25 * local

    def theirs() -> torch.Tensor:
        return peer(global_view_features=[(z[v], maps[v].view(n, 7, 7, c)) for v in range(2)],
                    global_view_grids=[grids[v].view(n, 7, 7, 2) for v in range(2)])

    return ours, theirs


def _time(fn: Callable[[], torch.Tensor], iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn().backward()
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--dim", type=int, default=2048, help="global embedding width")
    ap.add_argument("--local-dim", type=int, default=512, help="local embedding width (the "
                    "code's --maps-mlp 512-512-512)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"# {cpu_kind_line()}; torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"rounds {args.rounds} x {args.iters} calls; load before {load}")
    for n in args.batches:
        ours, peer = closures(n, args.dim, args.local_dim)
        for _ in range(2):
            ours().backward(), peer().backward()
        t_ours, t_peer = [], []
        for _ in range(args.rounds):
            t_ours.append(_time(ours, args.iters))
            t_peer.append(_time(peer, args.iters))
        ratios = [p / o for o, p in zip(t_ours, t_peer)]
        print(json.dumps(dict(
            batch=n, dim=args.dim, local_dim=args.local_dim,
            ours_ms=round(statistics.median(t_ours) * 1e3, 1),
            peer_ms=round(statistics.median(t_peer) * 1e3, 1),
            peer_over_ours=round(statistics.median(ratios), 3), ratio_min=round(min(ratios), 3),
            ratio_max=round(max(ratios), 3), loss_ours=round(float(ours().detach()), 4),
            loss_peer=round(float(peer().detach()), 4))), flush=True)
    with open("/proc/loadavg") as f:
        print(f"# load after {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
