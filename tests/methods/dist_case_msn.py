"""Case of tests/methods/test_msn_distributed.py for the one worker, tests/dist_worker.py.

MSN and PMSN, float64, 3 SGD steps, a head without BatchNorm (the authors convert theirs to
SyncBatchNorm over several processes: the engine's --sync-bn on GPUs): rank 0 first trains in
one process on the whole batch (2B images), then both ranks on their half with gloo + DDP. The
random views drop the same patches in both (the generator seeded per step: one subset for the
batch, as the code draws). The mutations take the mean prediction (and Sinkhorn-Knopp) per
process; ``me_max`` trains without Sinkhorn, so that only the mean prediction crosses the
processes there.
"""

from __future__ import annotations

import functools

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

import contrastive.methods.msn as msn_module
from contrastive.losses.masked_siamese import msn_targets, msn_terms
from contrastive.methods import MSN

B, STEPS, WORLD = 3, 3, 2
VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, dynamic_img_size=True)
CONFIGS = {"msn": dict(), "pmsn": dict(prior="power_law"), "me_max": dict(sinkhorn_iterations=0)}


def batches():
    g = torch.Generator().manual_seed(123)
    # target, one random view, one focal view of the same size (timm resamples the position
    # embedding of other sizes in float32, which would blur the float64 comparison)
    return [[torch.randn(WORLD * B, 3, 16, 16, generator=g, dtype=torch.float64)
             for _ in range(3)] for _ in range(STEPS)]


def train(cfg, rank: int, world: int) -> dict:
    torch.manual_seed(0)
    method = MSN("timm:vit_tiny_patch16_224", hidden_dim=12, out_dim=8, num_prototypes=6,
                 use_bn=False, patch_drop=0.25, momentum=0.9, encoder_kwargs=VIT, **cfg).double()
    method.draw_keep = lambda n, length: torch.randperm(length)[:12].expand(n, -1)
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.5)
    record = SGDRecord()
    rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
    for step, views in enumerate(batches()):
        torch.manual_seed(100 + step)
        out = model(method.make_batch([v[rows] for v in views], step=step, total_steps=STEPS))
        record.step(out["loss"], method, opt)
    return record.finish(method)


def reference(world: int) -> dict:
    return {name: train(cfg, 0, 1) for name, cfg in CONFIGS.items()}


def distributed(rank: int, world: int) -> dict:
    out = {f"{name}_distributed": train(cfg, rank, world) for name, cfg in CONFIGS.items()}
    msn_module.msn_terms = functools.partial(msn_terms, distributed=False)
    msn_module.msn_targets = functools.partial(msn_targets, distributed=False)
    out.update({f"{name}_mutated": train(cfg, rank, world) for name, cfg in CONFIGS.items()})
    msn_module.msn_terms, msn_module.msn_targets = msn_terms, msn_targets
    return out
