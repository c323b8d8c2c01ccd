"""Speed of our DCL, DCLW and SigLIP losses against the peers' (lightly's ``DCLLoss`` /
``DCLWLoss``, open_clip's ``SigLipLoss``), side by side, forward + backward, one process.

Each timed call builds the loss from (N, D) embeddings that need gradients and runs backward,
as a training step does: DCL / DCLW on two views (our ``dcl`` / ``dclw`` against lightly's,
tau 0.1, sigma 0.5, the weight detached in both, as lightly does), SigLIP on image / text
embeddings with a learnable log-scale and bias (ours normalises inside; open_clip is given
``F.normalize`` of both inside the timed call, as its model does before the loss). Before
timing, each pair is checked to give the same loss (fp32, relative 1e-5).

Precisions: fp32, and bf16 where the CPU has native bf16 (``contrastive.hardware``): bf16
embeddings under ``torch.autocast("cpu", torch.bfloat16)``, what a bf16 mixed-precision step
hands the loss. Ours then computes in float32 (autocast off inside, the losses' convention),
the peers in bf16 (their matrix products under autocast).

Timing (benchmarks/BENCHMARKS.md): ours and the peer alternate, A B A B, for ``--rounds``
rounds of ``--iters`` calls each after warm-up; reported: the median ms per call and the
median of the per-round ratios peer / ours (> 1: ours faster). Needs the ``compare`` extra
(``pip install -e .[compare]``: lightly, open-clip-torch).

    hold_nice python benchmarks/bench_peer_losses.py --threads 2 [--batches 256 1024 --json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from contrastive.hardware import cpu_kind, cpu_kind_line
from contrastive.losses import functional as LF


def _leaf(n: int, d: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g).to(dtype).requires_grad_()


def _precision(name: str) -> contextlib.AbstractContextManager:
    if name == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def pairs(n: int, d: int, dsig: int, precision: str) -> Iterator[tuple[str, Callable, Callable]]:
    """(name, ours, peer): two closures that compute one loss and run its backward."""
    from lightly.loss import DCLLoss, DCLWLoss
    from open_clip.loss import SigLipLoss

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    z1, z2 = _leaf(n, d, 1, dtype), _leaf(n, d, 2, dtype)
    dcl_peer, dclw_peer = DCLLoss(temperature=0.1), DCLWLoss(temperature=0.1, sigma=0.5)
    yield ("DCL",
           lambda: LF.dcl(z1, z2, temperature=0.1),
           lambda: dcl_peer(z1, z2))
    yield ("DCLW",
           lambda: LF.dclw(z1, z2, temperature=0.1, sigma=0.5, detach_weight=True),
           lambda: dclw_peer(z1, z2))
    x, y = _leaf(n, dsig, 3, dtype), _leaf(n, dsig, 4, dtype)
    t = torch.tensor(math.log(10.0), requires_grad=True)
    b = torch.tensor(-10.0, requires_grad=True)
    sig_peer = SigLipLoss()
    yield ("SigLIP",
           lambda: LF.siglip(x, y, scale=t.exp(), bias=b),
           lambda: sig_peer(F.normalize(x, dim=1), F.normalize(y, dim=1), t.exp(), b))


def _step(loss_fn: Callable[[], torch.Tensor], precision: str) -> torch.Tensor:
    with _precision(precision):
        loss = loss_fn()
    loss.backward()
    return loss.detach()


def _time(fn: Callable[[], torch.Tensor], precision: str, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        _step(fn, precision)
    return (time.perf_counter() - t0) / iters


def measure(args: argparse.Namespace) -> list[dict]:
    precisions = ["fp32"] + (["bf16"] if cpu_kind()["native_bf16"] else [])
    rows = []
    for precision in precisions:
        for n in args.batches:
            for name, ours, peer in pairs(n, args.dim, args.siglip_dim, precision):
                a, c = _step(ours, precision).float(), _step(peer, precision).float()
                if precision == "fp32" and not torch.allclose(a, c, rtol=1e-5, atol=1e-6):
                    raise SystemExit(f"{name} N={n}: ours {a.item()} != peer {c.item()}")
                for _ in range(2):  # warm-up
                    _step(ours, precision), _step(peer, precision)
                t_ours, t_peer = [], []
                for _ in range(args.rounds):
                    t_ours.append(_time(ours, precision, args.iters))
                    t_peer.append(_time(peer, precision, args.iters))
                ratios = [p / o for o, p in zip(t_ours, t_peer)]
                row = dict(loss=name, batch=n, precision=precision,
                           dim=args.siglip_dim if name == "SigLIP" else args.dim,
                           ours_ms=round(statistics.median(t_ours) * 1e3, 3),
                           peer_ms=round(statistics.median(t_peer) * 1e3, 3),
                           peer_over_ours=round(statistics.median(ratios), 3),
                           ratio_min=round(min(ratios), 3), ratio_max=round(max(ratios), 3),
                           loss_ours=round(a.item(), 5), loss_peer=round(c.item(), 5))
                rows.append(row)
                print(json.dumps(row) if args.json else
                      f"{name:6s} N={n:5d} {precision}: ours {row['ours_ms']:9.3f} ms, peer "
                      f"{row['peer_ms']:9.3f} ms, peer/ours {row['peer_over_ours']:.2f}x "
                      f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f})", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--dim", type=int, default=128, help="DCL / DCLW width (SimCLR's head)")
    ap.add_argument("--siglip-dim", type=int, default=512, help="SigLIP embedding width")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=5, help="calls per timed block")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--json", action="store_true", help="one JSON row per measurement")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # lightly's DCLWLoss wraps its weights in torch.tensor(tensor) (a copy, warned every call)
    warnings.filterwarnings("ignore", message="To copy construct from a tensor")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# {cpu_kind_line()}; torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"rounds {args.rounds} x {args.iters} calls; load before {' '.join(load)}")
    measure(args)
    with open("/proc/loadavg") as f:
        print(f"# load after {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
