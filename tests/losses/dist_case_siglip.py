"""Case of tests/losses/test_siglip_dclw.py (the two-process test) for the one worker, tests/dist_worker.py.

Rank 0 first computes SigLIP in one process on the whole batch (8 pairs) with its gradients
(images, texts, log-scale, bias); then each rank computes the ring loss of its 4 pairs over gloo
and its gradients, the same with the former ring that normalised every text chunk on arrival, and
once more with a ring that skips the peer (each process re-reads its own texts instead of
receiving the peer's: the mutation the test must see). Float64.
"""

from __future__ import annotations

import torch

from contrastive.losses import SigLIPLoss
from contrastive.losses import functional as LF

N = 4


def data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(world * N, 5, generator=g, dtype=torch.float64)
    y = x + torch.randn(world * N, 5, generator=g, dtype=torch.float64)
    return x, y


def run(x: torch.Tensor, y: torch.Tensor) -> dict:
    loss_fn = SigLIPLoss(scale_init=3.0, bias_init=-1.5).double()
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    loss = loss_fn(x, y)
    loss.backward()
    return {"loss": loss.detach(), "gx": x.grad, "gy": y.grad,
            "g_log_scale": loss_fn.log_scale.grad, "g_bias": loss_fn.bias.grad}


def run_normalised_per_chunk(x: torch.Tensor, y: torch.Tensor) -> dict:
    """The ring as it was before normalising once: every text chunk L2-normalised on arrival
    (``siglip(..., normalize=True)`` per step), written out here with the same exchange."""
    loss_fn = SigLIPLoss(scale_init=3.0, bias_init=-1.5).double()
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    scale, bias = loss_fn.log_scale.exp(), loss_fn.bias
    loss = LF.siglip(x, y, scale=scale, bias=bias)
    chunk = y
    for _ in range(torch.distributed.get_world_size() - 1):
        chunk = LF._ring_shift(chunk)
        loss = loss + LF.siglip(x, chunk, scale=scale, bias=bias, positives=False)
    loss.backward()
    return {"loss": loss.detach(), "gx": x.grad, "gy": y.grad,
            "g_log_scale": loss_fn.log_scale.grad, "g_bias": loss_fn.bias.grad}


def reference(world: int) -> dict:
    return {"full": run(*data(world))}


def distributed(rank: int, world: int) -> dict:
    x, y = data(world)
    rows = slice(rank * N, (rank + 1) * N)
    out = {"ring": run(x[rows], y[rows]), "per_chunk": run_normalised_per_chunk(x[rows], y[rows])}
    original = LF._ring_shift
    LF._ring_shift = lambda chunk: chunk  # the mutation: the peer's texts never arrive
    try:
        out["skipped"] = run(x[rows], y[rows])
    finally:
        LF._ring_shift = original
    return out
