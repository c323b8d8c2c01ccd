"""Case of tests/methods/test_clip_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains CLIP in one process on the whole batch (2B image-text pairs); then both ranks train the same steps on their
half with gloo + DDP; then again with a gather that keeps only the local rows' gradient (the
classic bug), which the test must see. Float64, AdamW with weight decay (the scale's group has
none), a logit scale that starts above the clamp so that the clamp acts.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.engine.optim import build_optimizer
from contrastive.methods import CLIP
from contrastive.nn import distributed as D

B, STEPS, T, VOCAB = 4, 3, 5, 11


class TinyImage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU())
        self.num_features = 6

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


class TinyText(nn.Module):
    """Token embeddings, a LayerNorm, masked mean: (N, T) ids -> (N, 7)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 7)
        self.norm = nn.LayerNorm(7)
        self.num_features = 7

    def forward(self, ids, mask):
        m = mask.unsqueeze(-1).to(self.emb.weight.dtype)
        return self.norm((self.emb(ids) * m).sum(1) / m.sum(1))


def build() -> CLIP:
    torch.manual_seed(0)
    model = CLIP(TinyImage(), TinyText(), dim=5, temperature=0.07).double()
    with torch.no_grad():
        model.logit_scale.fill_(5.0)  # above log(100): the first forward clamps it
    return model


def batches():
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        images = torch.randn(2 * B, 3, 8, 8, generator=g, dtype=torch.float64)
        ids = torch.randint(1, VOCAB, (2 * B, T), generator=g)
        mask = (torch.rand(2 * B, T, generator=g) < 0.7).long()
        mask[:, 0] = 1
        out.append((images, ids, mask))
    return out


def _gather_local_grad(z):
    """The bug: every row gathered, only this process's rows keep their gradient."""
    rows, n, r = D.gather(z.detach()), z.shape[0], D.rank()
    return torch.cat([rows[: r * n], z, rows[(r + 1) * n:]])


def train(rank: int, world: int, mutate: bool = False) -> dict:
    from dist_worker import SGDRecord  # here: tests/methods/test_clip.py imports the towers

    import contrastive.methods.clip as clip_module

    method = build()
    model = DDP(method) if world > 1 else method
    opt = build_optimizer(method, "adamw", lr=0.05, weight_decay=0.5)
    record = SGDRecord()
    original = clip_module.gather_with_grad
    if mutate:
        clip_module.gather_with_grad = _gather_local_grad
    try:
        for images, ids, mask in batches():
            rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
            out = model({"views": [images[rows]], "input_ids": ids[rows],
                         "attention_mask": mask[rows]})
            record.step(out["loss"], method, opt, scale=method.logit_scale.detach().clone())
    finally:
        clip_module.gather_with_grad = original
    return record.finish(method)


def reference(world: int) -> dict:
    return {"reference": train(0, 1)}


def distributed(rank: int, world: int) -> dict:
    return {"distributed": train(rank, world), "mutated": train(rank, world, mutate=True)}
