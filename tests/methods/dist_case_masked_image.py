"""Case of tests/methods/test_masked_image_distributed.py (MAE, SimMIM) for the one worker,
tests/dist_worker.py.

Rank 0 first trains each method in one process on the whole batch (2B images); then both ranks
train the same 3 SGD steps on their half with gloo + DDP, each image keeping the mask it had in
the one-process run (the global batch's noise, this rank's rows: masks are per sample); then
again with every rank using rank 0's rows of the noise (masks drawn per process instead of per
image), which the test must see. Float64. Neither method has a cross-process term: the per-rank
loss is the mean over the rank's masked patches and DDP averages the gradients, which equals the
one-process mean because every image has the same number of masked patches (pixels).
"""

from __future__ import annotations

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods import MAE, Method, SimMIM

B, STEPS = 4, 3
VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2)
#: method -> (build, noise columns: MAE's 16 patches, SimMIM's 16 mask units of one patch)
METHODS = {
    "mae": (lambda: MAE("timm:vit_tiny_patch16_224", decoder_dim=8, decoder_depth=1,
                        decoder_heads=2, encoder_kwargs=VIT), 16),
    "simmim": (lambda: SimMIM("timm:vit_tiny_patch16_224", mask_patch_size=4,
                              encoder_kwargs=VIT), 16),
}


def batches(units: int):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(2 * B, 3, 16, 16, generator=g, dtype=torch.float64),
             torch.rand(2 * B, units, generator=g, dtype=torch.float64)) for _ in range(STEPS)]


def train(name: str, rank: int, world: int, mutate: bool = False) -> dict:
    build, units = METHODS[name]
    torch.manual_seed(0)
    method: Method = build().double()
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD(method.parameters(), lr=0.5)
    record = SGDRecord()
    draw = type(method).draw_masking  # type: ignore[attr-defined]
    for images, noise in batches(units):
        rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
        local_noise = noise[:B] if mutate else noise[rows]
        method.draw_masking = lambda n, device, z=local_noise: draw(  # type: ignore
            method, n, device, noise=z)
        out = model({"views": [images[rows]]})
        record.step(out["loss"], method, opt)
    return record.finish(method)


def reference(world: int) -> dict:
    return {name: train(name, 0, 1) for name in METHODS}


def distributed(rank: int, world: int) -> dict:
    return {f"{name}_{run}": train(name, rank, world, run == "mutated")
            for name in METHODS for run in ("distributed", "mutated")}
