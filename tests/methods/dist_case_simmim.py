"""Case of tests/methods/test_simmim_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains SimMIM in one process on the whole batch (2B images); then both ranks train
the same 3 SGD steps on their half with gloo + DDP, each image keeping the mask it had in the
one-process run (the global batch's noise, this rank's rows: masks are per sample); then again
with every rank using rank 0's rows of the noise (masks drawn per process instead of per
image), which the test must see. Float64. SimMIM has no cross-process term: the per-rank loss is
the mean over the rank's masked pixels and DDP averages the gradients, which equals the
one-process mean because every image masks the same number of pixels.
"""

from __future__ import annotations

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods import SimMIM

B, STEPS, UNITS = 4, 3, 16


def build() -> SimMIM:
    torch.manual_seed(0)
    return SimMIM("timm:vit_tiny_patch16_224", mask_patch_size=4,
                  encoder_kwargs=dict(img_size=16, patch_size=4, embed_dim=16, depth=1,
                                      num_heads=2)).double()


def batches():
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(2 * B, 3, 16, 16, generator=g, dtype=torch.float64),
             torch.rand(2 * B, UNITS, generator=g, dtype=torch.float64)) for _ in range(STEPS)]


def train(rank: int, world: int, mutate: bool = False) -> dict:
    method = build()
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD(method.parameters(), lr=0.5)
    record = SGDRecord()
    for images, noise in batches():
        rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
        local_noise = noise[:B] if mutate else noise[rows]
        method.draw_masking = lambda n, device, z=local_noise: SimMIM.draw_masking(  # type: ignore
            method, n, device, noise=z)
        out = model({"views": [images[rows]]})
        record.step(out["loss"], method, opt)
    return record.finish(method)


def reference(world: int) -> dict:
    return {"simmim": train(0, 1)}


def distributed(rank: int, world: int) -> dict:
    return {"simmim_distributed": train(rank, world), "simmim_mutated": train(rank, world, True)}
