"""Case of tests/engine/test_clip_parts_distributed.py for the one worker, tests/dist_worker.py.

A model of two parts and a rest (``Method.clip_parts``), trained 2 SGD steps with its gradients
clipped part by part through the engine's :class:`~contrastive.engine.step.Updater` (its direct
torch calls, as under DDP without fp16): rank 0 first in one process on the whole batch of 2B
rows, then both ranks on their B rows under DDP (the clip after DDP's average); then clipping
each rank's own gradients before averaging them (the mutation the test must see). Float64.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
from dist_worker import SGDRecord
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.engine.step import Updater

B, STEPS, MAX_NORM = 4, 2, 0.5


class Parts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 1)

    def clip_parts(self) -> dict:
        return {"a": list(self.a.parameters()), "b": list(self.b.parameters())}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.c(torch.tanh(self.b(torch.tanh(self.a(x))))) ** 2).mean() * 20


def _updater(model: nn.Module, opt: torch.optim.Optimizer, world: int) -> Updater:
    """The engine's Updater in its direct mode (one process or DDP, no fp16), without an
    accelerate state in these bare gloo processes (a prepared optimiser would build one)."""
    from accelerate.utils import DistributedType

    acc = SimpleNamespace(gradient_accumulation_steps=1, scaler=None, distributed_type=(
        DistributedType.MULTI_CPU if world > 1 else DistributedType.NO))
    up = Updater(model, opt, acc)
    assert up.clip_lists is not None and len(up.clip_lists) == 3
    up.direct, up._inner = True, opt
    return up


def train(rank: int, world: int, mutate: bool = False) -> dict:
    torch.manual_seed(0)
    method = Parts().double()
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD(method.parameters(), lr=0.3)
    up = _updater(model, opt, world)
    g = torch.Generator().manual_seed(7)
    record = SGDRecord()
    for _ in range(STEPS):
        x = torch.randn(2 * B, 3, generator=g, dtype=torch.float64) * 3
        mine = x if world == 1 else x[rank * B:(rank + 1) * B]

        def backward(loss: torch.Tensor) -> None:
            if not mutate:
                loss.backward()  # DDP averages the gradients
                up.clip(MAX_NORM)
                return
            loss.backward()  # the mutation (no DDP): each rank clips its own, then averages
            up.clip(MAX_NORM)
            for p in method.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world

        record.step((method if mutate else model)(mine), method, opt, backward)
    return record.finish(method)


def reference(world: int) -> dict:
    return {"reference": train(0, 1)}


def distributed(rank: int, world: int) -> dict:
    return {"distributed": train(rank, world), "mutated": train(rank, world, mutate=True)}
