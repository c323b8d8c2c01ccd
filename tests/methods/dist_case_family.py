"""Case of tests/methods/test_family_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains each
method of the two-view family in one process on the whole batch (2B images); then both ranks
train the same steps on their half with gloo + DDP; then again with a known bug planted (a
gather without gradient, or NNCLR's support set filled with this process's embeddings only, as
solo-learn #229 shipped), which the test must see. Everything in float64, BN in eval mode (its
running statistics make every sample independent; the losses' own batch statistics are what is
compared).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from dist_worker import SGDRecord
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods import (
    BYOL,
    DINO,
    NNCLR,
    BarlowTwins,
    DeepInfoMax,
    SimSiam,
    SupCon,
    SwAV,
    VICReg,
)
from contrastive.nn import distributed as D

B, STEPS = 4, 3
NAMES = ("byol", "simsiam", "barlow_twins", "vicreg", "supcon", "nnclr", "swav", "dino",
         "deep_infomax")
MUTATIONS = ("barlow_twins", "vicreg", "supcon", "nnclr", "swav", "dino", "deep_infomax")
MULTICROP = {"swav", "dino"}  # 2 global views of 8 px + 2 local views of 4 px


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4),
                                  nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU())
        self.num_features = 6

    def forward_stages(self, x):
        h = self.body[:3](x)
        return [h, self.body[3:](h)]

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    kw = {"byol": dict(dim=5, mlp_hidden=7, momentum=0.9), "simsiam": dict(dim=5, pred_hidden=3),
          "barlow_twins": dict(dim=5, mlp_hidden=7), "vicreg": dict(dim=5, mlp_hidden=7),
          "supcon": dict(dim=5, temperature=0.5),
          "nnclr": dict(dim=5, proj_hidden=7, pred_hidden=7, support_size=16),
          "swav": dict(dim=5, mlp_hidden=7, num_prototypes=6, epsilon=0.5),
          "dino": dict(out_dim=6, hidden_dim=7, bottleneck_dim=4, momentum=0.9),
          "deep_infomax": dict(mi_units=8, estimator="infonce")}[name]
    cls = {"byol": BYOL, "simsiam": SimSiam, "barlow_twins": BarlowTwins, "vicreg": VICReg,
           "supcon": SupCon, "nnclr": NNCLR, "swav": SwAV, "dino": DINO,
           "deep_infomax": DeepInfoMax}[name]
    return cls(Tiny(), **kw).double().eval()


def batches(world: int, multicrop: bool = False):
    g = torch.Generator().manual_seed(123)
    sizes = (8, 8, 4, 4) if multicrop else (8, 8)
    return [([torch.randn(world * B, 3, s, s, generator=g, dtype=torch.float64) for s in sizes],
             torch.randint(0, 3, (world * B,), generator=g)) for _ in range(STEPS)]


def _gather_local_grad(z):
    """The common bug: every row gathered, but only this process's rows keep their gradient."""
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])


@contextmanager
def planted_bug(name: str, method: nn.Module):
    """The bug peers shipped: the gather loses its gradient / the support set stays local."""
    import importlib

    if name in MULTICROP:  # Sinkhorn / the centre over the local batch only
        import functools

        module = importlib.import_module(f"contrastive.methods.{name}")
        attr = "swav_codes" if name == "swav" else "dino_center"
        original = getattr(module, attr)
        setattr(module, attr, functools.partial(original, distributed=False))
        try:
            yield
        finally:
            setattr(module, attr, original)
        return
    if name == "nnclr":
        enqueue = method.support.enqueue
        method.support.enqueue = lambda keys, labels=None, gathered=False: enqueue(
            keys, labels, gathered=True)
        try:
            yield
        finally:
            method.support.enqueue = enqueue
        return
    module = importlib.import_module(f"contrastive.methods.{name}")
    original = module.gather_with_grad
    module.gather_with_grad = _gather_local_grad
    try:
        yield
    finally:
        module.gather_with_grad = original


def train(name: str, rank: int, world: int, mutate: bool = False) -> dict:
    method = build(name)
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.2)
    record = SGDRecord()
    for step, (views, labels) in enumerate(batches(2, multicrop=name in MULTICROP)):
        rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
        batch = method.make_batch([v[rows] for v in views], step=step, total_steps=STEPS,
                                  labels=labels[rows])
        if mutate:
            with planted_bug(name, method):
                out = model(batch)
        else:
            out = model(batch)
        record.step(out["loss"], method, opt)
    return record.finish(method)


def reference(world: int) -> dict:
    return {"reference": {name: train(name, 0, 1) for name in NAMES}}


def distributed(rank: int, world: int) -> dict:
    return {"distributed": {name: train(name, rank, world) for name in NAMES},
            "mutated": {name: train(name, rank, world, mutate=True) for name in MUTATIONS}}
