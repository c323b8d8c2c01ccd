"""Case of tests/text/test_simcse_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first computes the one-process references on the whole batch (before the process group
exists); then both ranks run the same SGD steps on their half of the batch with gloo +
DistributedDataParallel. Float64 throughout and dropout 0 (the dropout masks of 2 x B
and 1 x 2B cannot be the same), so the two differ only by float64 rounding.

Variants: supervised triples (S = 3, hard negatives gathered too), pairs (S = 2), unsupervised
(S = 1), and the mutation ``sup_nograd``: the supervised step with the keys gathered WITHOUT
gradient, which the test shows to differ from the reference (the comparison can fail).
"""

from __future__ import annotations

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

import contrastive.methods.simcse as simcse_module
from contrastive.methods.simcse import SimCSE
from contrastive.nn import distributed as D

B, T, VOCAB, STEPS = 4, 7, 40, 2
NAMES = ("sup", "pair", "unsup", "sup_nograd")


def build(name: str) -> SimCSE:
    torch.manual_seed(0)
    kwargs = dict(num_layers=1, hidden_size=8, num_heads=2, intermediate_size=16,
                  vocab_size=VOCAB, max_position_embeddings=16, dropout=0.0,
                  attention_dropout=0.0)
    unsup = name == "unsup"
    return SimCSE("bert", pooling="cls", mlp_only_train=unsup, temperature=0.05,
                  encoder_kwargs=kwargs).double()


def batches(world: int, s: int) -> list[dict]:
    g = torch.Generator().manual_seed(123)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(5, VOCAB, (world * B, s, T), generator=g)
        lengths = torch.randint(3, T + 1, (world * B, s), generator=g)
        mask = (torch.arange(T) < lengths[..., None]).long()
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def train(name: str, rank: int, world: int) -> dict:
    method = build(name)
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.5)
    s = {"sup": 3, "sup_nograd": 3, "pair": 2, "unsup": 1}[name]
    record = SGDRecord()
    original = simcse_module.gather_with_grad
    if name == "sup_nograd":
        simcse_module.gather_with_grad = D.gather  # the mutation: negatives without gradient
    try:
        for full in batches(2, s):
            local = {k: v[rank * B:(rank + 1) * B] for k, v in full.items()} if world > 1 else full
            out = model(local)
            record.step(out["loss"], method, opt, pos_acc=out["pos_acc"])
    finally:
        simcse_module.gather_with_grad = original
    return record.finish(method)


def reference(world: int) -> dict:
    return {"reference": {name: train(name, 0, 1) for name in NAMES if name != "sup_nograd"}}


def distributed(rank: int, world: int) -> dict:
    return {"distributed": {name: train(name, rank, world) for name in NAMES}}
