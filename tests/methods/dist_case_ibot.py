"""Case of tests/methods/test_ibot_distributed.py for the one worker, tests/dist_worker.py.

iBOT (running centres, all-reduced) and DINOv2-style (Sinkhorn-Knopp over the global batch,
KoLeo 0.1), float64, 3 SGD steps: rank 0 first trains in one process on the whole batch (2B
images per crop), then both ranks train on their half with gloo + DDP, every image keeping
its mask. KoLeo runs per process, as DINOv2 computes it: the one-process reference therefore
takes it on each rank's rows (the mean over the two halves of each crop: DDP averages the
ranks' gradients), which is what two processes must equal. The mutations compute the
cross-process statistics per process (Sinkhorn-Knopp, the centres): the test must see them.
"""

from __future__ import annotations

import functools

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

import contrastive.methods.ibot as ibot_module
from contrastive.losses.clustering import dino_center, sinkhorn_knopp
from contrastive.losses.dinov2 import koleo
from contrastive.methods import IBOT

B, STEPS, L, WORLD = 3, 3, 16, 2
VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, dynamic_img_size=True)
CONFIGS = {
    "ibot": dict(centering="mean", shared_head=True, koleo_weight=0.0),
    "dinov2": dict(centering="sinkhorn", shared_head=False, patch_out_dim=10, koleo_weight=0.1),
}


class PerRankKoLeo(IBOT):
    """The one-process reference: KoLeo on each rank's rows of each crop, averaged."""

    def koleo_term(self, cls_tokens):
        crops = cls_tokens.chunk(self.num_global)
        return torch.stack([torch.stack([koleo(h) for h in c.chunk(WORLD)]).mean()
                            for c in crops]).sum()


def build(cls, cfg):
    torch.manual_seed(0)
    method = cls("timm:vit_tiny_patch16_224", out_dim=12, hidden_dim=16, bottleneck_dim=8,
                 momentum=0.9, encoder_kwargs=VIT, **cfg).double()
    with torch.no_grad():
        method.mask_token.normal_(0, 0.5)
    return method


def batches():
    g = torch.Generator().manual_seed(123)
    out = []
    for _ in range(STEPS):
        views = [torch.randn(WORLD * B, 3, 16, 16, generator=g, dtype=torch.float64)
                 for _ in range(2)]
        # a local crop of the global size: timm resamples the position embedding of other
        # sizes in float32, which would blur the float64 comparison
        views.append(torch.randn(WORLD * B, 3, 16, 16, generator=g, dtype=torch.float64))
        masks = torch.rand(2, WORLD * B, L, generator=g) < 0.4  # (crop, image, patch)
        out.append((views, masks))
    return out


def train(cfg, rank: int, world: int, cls=IBOT) -> dict:
    method = build(cls, cfg)
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.05)
    record = SGDRecord()
    for step, (views, masks) in enumerate(batches()):
        rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
        local = masks[:, rows].reshape(-1, L)  # crop-major, as the method stacks the crops
        method.draw_masks = lambda n, h, w, m=local: m  # type: ignore[method-assign]
        out = model(method.make_batch([v[rows] for v in views], step=step, total_steps=STEPS))
        record.step(out["loss"], method, opt)
    return record.finish(method)


def reference(world: int) -> dict:
    out = {name: train(cfg, 0, 1, PerRankKoLeo) for name, cfg in CONFIGS.items()}
    out["dinov2_batch_koleo"] = train(CONFIGS["dinov2"], 0, 1)  # KoLeo over all 2B rows
    return out


def distributed(rank: int, world: int) -> dict:
    out = {f"{name}_distributed": train(cfg, rank, world) for name, cfg in CONFIGS.items()}
    # mutations: the cross-process statistics taken per process
    ibot_module.sinkhorn_knopp = functools.partial(sinkhorn_knopp, distributed=False)
    out["dinov2_mutated"] = train(CONFIGS["dinov2"], rank, world)
    ibot_module.dino_center = functools.partial(dino_center, distributed=False)
    out["ibot_mutated"] = train(CONFIGS["ibot"], rank, world)
    ibot_module.sinkhorn_knopp, ibot_module.dino_center = sinkhorn_knopp, dino_center
    return out
