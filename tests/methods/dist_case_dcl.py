"""Case of tests/methods/test_dcl_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains DCL and DCLW in one process on the whole batch (2B images); then both ranks
train the same 3 SGD steps on their half with gloo + DDP; then again with a gather that keeps
only the local rows' gradient (the classic bug), which the test must see. Float64; BN compared
in eval mode (as tests/methods/dist_case.py's SimCLR), so the batch statistics play no part.
"""

from __future__ import annotations

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods import DCL, DCLW
from contrastive.nn import distributed as D

B, STEPS = 4, 3
NAMES = ("dcl", "dclw")


def _tiny():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from dist_case import Tiny

    return Tiny(bn=True)


def build(name: str):
    torch.manual_seed(0)
    cls = DCL if name == "dcl" else DCLW
    return cls(_tiny(), dim=6, mlp_hidden=8, temperature=0.3).double().eval()


def batches():
    g = torch.Generator().manual_seed(123)
    return [[torch.randn(2 * B, 3, 8, 8, generator=g, dtype=torch.float64) for _ in range(2)]
            for _ in range(STEPS)]


def _gather_local_grad(z):
    """The bug: every row gathered, only this process's rows keep their gradient."""
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])


def train(name: str, rank: int, world: int, mutate: bool = False) -> dict:
    import contrastive.methods.simclr as simclr_module

    method = build(name)
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD(method.parameters(), lr=0.5)
    record = SGDRecord()
    original = simclr_module.gather_with_grad
    if mutate:
        simclr_module.gather_with_grad = _gather_local_grad
    try:
        for views in batches():
            local = [v[rank * B:(rank + 1) * B] for v in views] if world > 1 else views
            out = model({"views": local})
            record.step(out["loss"], method, opt)
    finally:
        simclr_module.gather_with_grad = original
    return record.finish(method)


def reference(world: int) -> dict:
    return {name: train(name, 0, 1) for name in NAMES}


def distributed(rank: int, world: int) -> dict:
    return {**{f"{n}_distributed": train(n, rank, world) for n in NAMES},
            **{f"{n}_mutated": train(n, rank, world, mutate=True) for n in NAMES}}
