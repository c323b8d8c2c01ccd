"""Momentum update and queue bookkeeping: ours vs. the reference approaches, side by side.

1. EMA update of a torchvision ResNet-50 key encoder (25.6M parameters, 161 tensors):
   - ours: ``contrastive.nn.momentum_update`` (one ``torch._foreach_lerp_``);
   - reference: the per-parameter loop of the official MoCo code,
     ``pk.data = pk.data * m + pq.data * (1 - m)``;
   - also shown: a per-parameter loop with in-place ops (``pk.mul_(m).add_(pq, alpha=1-m)``),
     and the floor: one lerp over a flat tensor of the same size (reads 2, writes 1 float per
     parameter: the least memory traffic an exact fp32 EMA can do).
2. Queue bookkeeping of one MoCo step (K keys of dim D, batch N):
   - ours: ``KeyQueue.enqueue`` + the write on the next read (one ``index_copy_``);
   - reference: clone the bank for the loss (``queue.clone().detach()``, as the official MoCo
     and lightly's memory bank do) + slice-assign the new keys.

Timing (BENCHMARKS.md): variants interleaved A B A B ... for ``--rounds`` rounds of ``--iters``
calls each; we report the median time per call and the median of the per-round ratios.

    python benchmarks/bench_momentum_queue.py [--rounds 15 --iters 5 --threads 2 --device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import torchvision

from contrastive.hardware import cpu_kind_line
from contrastive.nn import KeyQueue, momentum_update


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_block(fn: Callable[[], None], iters: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / iters


def compare(variants: dict[str, Callable[[], None]], rounds: int, iters: int, device) -> dict:
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(time_block(fn, iters, device))
    return times


def report(title: str, times: dict[str, list[float]]) -> None:
    """Median time per variant, and the median per-round ratio of every "ours*" variant over
    every other one."""
    print(f"\n## {title}")
    for name, ts in times.items():
        print(f"  {name:<34s} median {statistics.median(ts) * 1e3:9.3f} ms/call")
    for mine in [n for n in times if n.startswith("ours")]:
        for name in [n for n in times if not n.startswith("ours")]:
            ratios = [b / a for a, b in zip(times[mine], times[name])]
            print(
                f"  speed-up of '{mine}' over '{name}': median {statistics.median(ratios):.2f}x "
                f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(ratios)} rounds)"
            )


def bench_momentum(args, device) -> None:
    query = torchvision.models.resnet50().to(device)
    key = torchvision.models.resnet50().to(device)
    for p in key.parameters():
        p.requires_grad_(False)
    m = 0.999
    n_params = sum(p.numel() for p in query.parameters())
    n_tensors = len(list(query.parameters()))

    def ours():
        momentum_update(key, query, m)

    key_params, query_params = list(key.parameters()), list(query.parameters())

    def ours_lists():  # what MomentumEncoder does with its cached list, source listed too
        momentum_update(key_params, query_params, m)

    @torch.no_grad()
    def reference_loop():
        for pq, pk in zip(query.parameters(), key.parameters()):
            pk.data = pk.data * m + pq.data * (1.0 - m)

    flat_k = torch.randn(n_params, device=device)
    flat_q = torch.randn(n_params, device=device)

    def floor():  # same bytes in one contiguous lerp: the memory-bandwidth floor
        flat_k.lerp_(flat_q, 1.0 - m)

    @torch.no_grad()
    def inplace_loop():
        for pq, pk in zip(query.parameters(), key.parameters()):
            pk.mul_(m).add_(pq, alpha=1.0 - m)

    # correctness of what we time: all three give the same update
    k0 = [p.clone() for p in key.parameters()]
    ours()
    a = [p.clone() for p in key.parameters()]
    for p, v in zip(key.parameters(), k0):
        p.data.copy_(v)
    reference_loop()
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, key.parameters()))

    times = compare(
        {
            "ours (foreach lerp)": ours,
            "ours, parameter lists prepared": ours_lists,
            "reference loop (MoCo code)": reference_loop,
            "in-place loop": inplace_loop,
            "floor: one flat lerp, same bytes": floor,
        },
        args.rounds,
        args.iters,
        device,
    )
    report(
        f"Momentum update, torchvision ResNet-50 ({n_params / 1e6:.1f}M params, "
        f"{n_tensors} tensors), m={m}",
        times,
    )


def bench_queue(args, device) -> None:
    K, D, N = args.queue_size, args.dim, args.batch
    queue = KeyQueue(D, K, normalize=False).to(device)  # as MoCo builds it (keys are unit)
    bank = F.normalize(torch.randn(K, D, device=device), dim=1)
    ptr = [0]
    keys = F.normalize(torch.randn(N, D, device=device), dim=1)

    def ours():
        _ = queue.keys  # what the loss reads (no copy); writes the previous step's keys
        queue.enqueue(keys)

    def clone_bank():
        _ = bank.clone().detach()  # what the loss reads
        p = ptr[0]
        bank[p : p + N] = keys  # official code; assumes K % N == 0
        ptr[0] = (p + N) % K

    if K % N:
        raise SystemExit(f"--queue-size {K} must be a multiple of --batch {N} for the reference")
    times = compare(
        {"ours (index_copy, no clone)": ours, "clone the bank": clone_bank},
        args.rounds,
        args.iters * 10,
        device,
    )
    report(f"Queue bookkeeping per step, K={K}, D={D}, N={N}", times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=5, help="calls per timed block")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--queue-size", type=int, default=65536)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--skip-momentum", action="store_true")
    ap.add_argument("--skip-queue", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"{cpu_kind_line()}; torch {torch.__version__}, device {device}, "
        f"threads {torch.get_num_threads()}, "
        f"rounds {args.rounds}, iters {args.iters}"
    )
    if not args.skip_momentum:
        bench_momentum(args, device)
    if not args.skip_queue:
        bench_queue(args, device)


if __name__ == "__main__":
    main()
