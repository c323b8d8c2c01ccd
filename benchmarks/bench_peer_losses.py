"""Speed of our DCL, DCLW, SigLIP, MSN and PMSN losses against the peers' (lightly's ``DCLLoss``
/ ``DCLWLoss`` / ``MSNLoss`` / ``PMSNLoss``, open_clip's ``SigLipLoss``), side by side, forward +
backward, one process (MSN's shapes: :func:`msn_pairs`).

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


def pairs(n: int, d: int, dsig: int, precision: str, losses: tuple[str, ...]
          ) -> Iterator[tuple[str, Callable, Callable, bool]]:
    """(name, ours, peer, same_value): two closures that compute one loss and run its
    backward; ``same_value``: the two compute the same number (checked before timing)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    if "dcl" in losses:
        from lightly.loss import DCLLoss, DCLWLoss

        z1, z2 = _leaf(n, d, 1, dtype), _leaf(n, d, 2, dtype)
        dcl_peer, dclw_peer = DCLLoss(temperature=0.1), DCLWLoss(temperature=0.1, sigma=0.5)
        yield ("DCL",
               lambda: LF.dcl(z1, z2, temperature=0.1),
               lambda: dcl_peer(z1, z2), True)
        yield ("DCLW",
               lambda: LF.dclw(z1, z2, temperature=0.1, sigma=0.5, detach_weight=True),
               lambda: dclw_peer(z1, z2), True)
    if "siglip" in losses:
        from open_clip.loss import SigLipLoss

        x, y = _leaf(n, dsig, 3, dtype), _leaf(n, dsig, 4, dtype)
        t = torch.tensor(math.log(10.0), requires_grad=True)
        b = torch.tensor(-10.0, requires_grad=True)
        sig_peer = SigLipLoss()
        yield ("SigLIP",
               lambda: LF.siglip(x, y, scale=t.exp(), bias=b),
               lambda: sig_peer(F.normalize(x, dim=1), F.normalize(y, dim=1), t.exp(), b), True)
    if "msn" in losses:
        yield from msn_pairs(n, dtype)


def msn_pairs(n: int, dtype: torch.dtype, views: int = 11, k: int = 1024, d: int = 256
              ) -> Iterator[tuple[str, Callable, Callable, bool]]:
    """MSN / PMSN at the ViT-S/16 config's shapes (n images, 1 + 10 anchor views, 1024
    prototypes of 256): ours (normalise, cosines, ``msn_targets``, ``msn``) against lightly's
    ``MSNLoss`` / ``PMSNLoss`` (which normalise inside), Sinkhorn 3 iterations, sharpening
    0.25. PMSN's values differ by design: lightly takes KL(prior || mean prediction), ours
    KL(mean prediction || prior), which the uniform prior makes MSN's me-max."""
    from lightly.loss import MSNLoss, PMSNLoss

    from contrastive.losses.masked_siamese import msn, msn_targets, power_law_prior

    anchors, target = _leaf(views * n, d, 5, dtype), _leaf(n, d, 6, dtype).detach()
    prototypes = _leaf(k, d, 7, dtype)

    def ours(prior: torch.Tensor | None) -> torch.Tensor:
        p = F.normalize(prototypes, dim=1)
        a = F.normalize(anchors, dim=1).reshape(views, n, d).transpose(0, 1) @ p.T
        t = msn_targets(F.normalize(target, dim=1) @ p.T)
        return msn(a, t, prior=prior)

    prior = power_law_prior(k, 0.25)
    msn_peer, pmsn_peer = MSNLoss(), PMSNLoss(power_law_exponent=0.25)
    yield "MSN", lambda: ours(None), lambda: msn_peer(anchors, target, prototypes), True
    yield "PMSN", lambda: ours(prior), lambda: pmsn_peer(anchors, target, prototypes), False


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
            for name, ours, peer, same in pairs(n, args.dim, args.siglip_dim, precision,
                                                tuple(args.losses)):
                a, c = _step(ours, precision).float(), _step(peer, precision).float()
                if same and precision == "fp32" and not torch.allclose(a, c, rtol=1e-5,
                                                                        atol=1e-6):
                    raise SystemExit(f"{name} N={n}: ours {a.item()} != peer {c.item()}")
                for _ in range(2):  # warm-up
                    _step(ours, precision), _step(peer, precision)
                t_ours, t_peer = [], []
                for _ in range(args.rounds):
                    t_ours.append(_time(ours, precision, args.iters))
                    t_peer.append(_time(peer, precision, args.iters))
                ratios = [p / o for o, p in zip(t_ours, t_peer)]
                row = dict(loss=name, batch=n, precision=precision,
                           dim={"SigLIP": args.siglip_dim, "MSN": 256, "PMSN": 256}.get(
                               name, args.dim),
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
    ap.add_argument("--losses", nargs="+", default=["dcl", "siglip", "msn"],
                    choices=["dcl", "siglip", "msn"], help="which pairs to time")
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
