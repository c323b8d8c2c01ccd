"""Case of tests/engine/test_grad_cache_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains each method in one process on the whole batch (2B images, no cache); then
both ranks train the same steps on their B images through the gradient cache (chunks of 3: 3 + 1
rows) under DDP, as the engine's cached step does: DDP's hooks off (``no_sync``), passes 1-3, the
gradients averaged by :func:`~contrastive.engine.grad_cache.all_reduce_grads`; then again without
that average (the mutation the test must see). Float64, a GroupNorm backbone, the methods in
eval mode (the heads' batch norm uses running statistics, as in dist_case_family.py: without
SyncBN it would see each process's half).
"""

from __future__ import annotations

import contextlib

import torch
from dist_worker import SGDRecord
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.engine.grad_cache import GradCache, all_reduce_grads
from contrastive.methods import get_method

B, STEPS, CHUNK = 4, 2, 3
NAMES = ("simclr", "moco", "byol", "dino")
KWARGS = {"simclr": dict(dim=4, mlp_hidden=8), "byol": dict(dim=4, mlp_hidden=8, momentum=0.9),
          "moco": dict(dim=4, mlp_hidden=8, queue_size=16, momentum=0.9),
          "dino": dict(out_dim=6, hidden_dim=7, bottleneck_dim=4, momentum=0.9)}
SIZES = {"dino": (8, 8, 4, 4)}


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.GroupNorm(2, 4),
                                  nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU())
        self.num_features = 6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).mean(dim=(2, 3))


def train(name: str, rank: int, world: int, cached: bool, mutate: bool = False) -> dict:
    torch.manual_seed(0)
    method = get_method(name, encoder=Tiny(), **KWARGS[name]).double().eval()
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.2)
    cache = GradCache(method, CHUNK) if cached else None

    def cached_backward(loss: torch.Tensor) -> None:
        """The engine's cached backward (DDP's hooks off), then the gradients' average."""
        assert cache is not None
        with model.no_sync() if world > 1 else contextlib.nullcontext():
            loss.backward()
            cache.backward()
        if world > 1 and not mutate:
            all_reduce_grads([p for p in method.parameters()], world)

    g = torch.Generator().manual_seed(123)
    record = SGDRecord()
    for step in range(STEPS):
        views = [torch.randn(2 * B, 3, s, s, generator=g, dtype=torch.float64)
                 for s in SIZES.get(name, (8, 8))]
        rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
        batch = method.make_batch([v[rows] for v in views], step=step, total_steps=10)
        if cache is None:
            out = model(batch)
            record.step(out["loss"], method, opt)
        else:
            with model.no_sync() if world > 1 else contextlib.nullcontext():
                with cache.recording():
                    out = model(batch)  # pass 1 (no grad, chunked), the loss
            record.step(out["loss"], method, opt, backward=cached_backward)
    result = record.finish(method)
    result["state"] = {k: v.clone() for k, v in method.state_dict().items()}
    return result


def reference(world: int) -> dict:
    return {"reference": {name: train(name, 0, 1, cached=False) for name in NAMES}}


def distributed(rank: int, world: int) -> dict:
    return {"distributed": {name: train(name, rank, world, cached=True) for name in NAMES},
            "mutated": {name: train(name, rank, world, cached=True, mutate=True)
                        for name in NAMES}}
