"""Case of tests/methods/test_siglip_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains SigLIP in one process on the whole batch (2B image-text pairs); then both
ranks train the same 3 SGD steps on their half with gloo + DDP (the loss's ring exchange, no
gather); then again with a ring that skips the peer (each process re-reads its own texts), which
the test must see. Float64; t' and b learnt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import contrastive.losses.functional as LF
from contrastive.methods import SigLIP

sys.path.insert(0, str(Path(__file__).parent))
from dist_case_clip import B, TinyImage, TinyText, batches  # noqa: E402
from dist_worker import SGDRecord  # noqa: E402


def build() -> SigLIP:
    torch.manual_seed(0)
    return SigLIP(TinyImage(), TinyText(), dim=5).double()


def train(rank: int, world: int, mutate: bool = False) -> dict:
    method = build()
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD(method.parameters(), lr=0.5)
    record = SGDRecord()
    original = LF._ring_shift
    if mutate:
        LF._ring_shift = lambda chunk: chunk  # the peer's texts never arrive
    try:
        for images, ids, mask in batches():
            rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
            out = model({"views": [images[rows]], "input_ids": ids[rows],
                         "attention_mask": mask[rows]})
            record.step(out["loss"], method, opt)
    finally:
        LF._ring_shift = original
    return record.finish(method)


def reference(world: int) -> dict:
    return {"reference": train(0, 1)}


def distributed(rank: int, world: int) -> dict:
    return {"distributed": train(rank, world), "mutated": train(rank, world, mutate=True)}
