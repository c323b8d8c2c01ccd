"""Case of tests/methods/test_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first computes the one-process references on the whole batch (before the process group
exists, so every helper is in its one-process mode); then both ranks run the same steps on their
half of the batch with gloo + DistributedDataParallel.
Everything trains in float64, so that 2 x B and 1 x 2B differ only by float64 rounding (the
all-reduce and the batch sums add in other orders), which the tests bound tightly.
"""

from __future__ import annotations

import torch
from dist_worker import SGDRecord
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods import DenseCL, MoCo, MoCoV3, SimCLR
from contrastive.nn import KeyQueue
from contrastive.nn import distributed as D

B = 4  # per-process batch
STEPS = 2


class Tiny(nn.Module):
    def __init__(self, bn: bool):
        super().__init__()
        norm = nn.BatchNorm2d if bn else (lambda c: nn.Identity())
        self.body = nn.Sequential(
            nn.Conv2d(3, 4, 3, stride=2, padding=1),
            norm(4),
            nn.ReLU(),
            nn.Conv2d(4, 8, 3, stride=2, padding=1),
            norm(8),
            nn.ReLU(),
        )
        self.num_features = 8

    def forward_stages(self, x):  # DenseCL's feature map
        return [self.body(x)]

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


NAMES = ("simclr", "mocov3", "moco", "simclr_multicrop", "mocov3_multicrop", "densecl")
#: planted bug: the dense queue takes this process's keys only (must break the equality)
MUTATED = "densecl_local_queue"


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name.startswith("simclr"):  # BN everywhere, compared in eval mode
        return SimCLR(Tiny(bn=True), dim=6, mlp_hidden=8, temperature=0.5).double().eval()
    if name.startswith("mocov3"):
        return MoCoV3(Tiny(bn=True), dim=6, mlp_hidden=8, temperature=0.3).double().eval()
    if name.startswith("densecl"):  # as MoCo: no BN, train mode, shuffle BN runs
        method = DenseCL(Tiny(bn=False), dim=6, mlp_hidden=8, queue_size=12, momentum=0.8)
        if name == MUTATED:
            enqueue = method.dense_queue.enqueue
            method.dense_queue.enqueue = lambda keys, labels=None, gathered=False: enqueue(
                keys, labels, gathered=True)
        return method.double()
    # MoCo without any BN, in train mode: shuffle BN runs (gather, permute, unshuffle)
    return MoCo(Tiny(bn=False), version=2, dim=6, mlp_hidden=8, queue_size=12,
                momentum=0.8).double()


def batches(world: int, multicrop: bool = False):
    """2 views of 8 px (multi-crop: plus 2 local views of 4 px) per step."""
    g = torch.Generator().manual_seed(123)
    sizes = (8, 8, 4, 4) if multicrop else (8, 8)
    return [[torch.randn(world * B, 3, s, s, generator=g, dtype=torch.float64) for s in sizes]
            for _ in range(STEPS)]


def train(name: str, rank: int, world: int) -> dict:
    method = build(name)
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.5)
    record = SGDRecord()
    for views in batches(2, multicrop=name.endswith("multicrop")):
        local = [v[rank * B : (rank + 1) * B] for v in views] if world > 1 else views
        out = model({"views": local, "momentum": 0.7 if name.startswith("mocov3") else 0.8})
        record.step(out["loss"], method, opt, pos_acc=out["pos_acc"])
    result = record.finish(method)
    if name == "moco":
        result["queue"] = method.queue.ordered_keys()
    if name.startswith("densecl"):
        result["queue"] = method.dense_queue.ordered_keys()
    return result


def helper_checks(rank: int) -> dict:
    res = {}
    res["gather"] = D.gather(torch.full((2, 3), float(rank)))
    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    y = D.gather_with_grad(x)
    w = torch.arange(12.0).view(4, 3) * (rank + 1)
    (y * w).sum().backward()
    res["gather_with_grad_value"] = y.detach()
    res["gather_with_grad_grad"] = x.grad
    local = torch.arange(rank * B, (rank + 1) * B, dtype=torch.float32)[:, None]
    xs, idx = D.batch_shuffle(local)
    res["shuffled_all"] = D.gather(xs)
    res["unshuffled"] = D.batch_unshuffle(xs, idx)
    res["local"] = local
    queue = KeyQueue(3, 5, store_labels=True)
    keys = torch.eye(3)[rank : rank + 1].repeat(2, 1)  # rank 0: e0 twice, rank 1: e1 twice
    queue.enqueue(keys, torch.full((2,), rank))
    res["queue_keys"] = queue.ordered_keys()
    res["queue_labels"] = queue.labels.clone()
    res["queue_ptr"] = queue.ptr.clone()
    return res


def reference(world: int) -> dict:
    return {"reference": {name: train(name, 0, 1) for name in NAMES}}


def distributed(rank: int, world: int) -> dict:
    return {"world_size": D.world_size(), "helpers": helper_checks(rank),
            "distributed": {name: train(name, rank, world) for name in (*NAMES, MUTATED)}}
