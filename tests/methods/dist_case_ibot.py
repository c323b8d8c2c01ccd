"""Case of tests/methods/test_ibot_distributed.py for the one worker, tests/dist_worker.py.

iBOT (running centres, all-reduced) and DINOv2-style (Sinkhorn-Knopp over the global batch,
KoLeo 0.1), float64, 3 SGD steps: rank 0 first trains in one process on the whole batch (2B
images per crop), then both ranks train on their half with gloo + DDP, every image keeping
its mask. KoLeo runs per process, as DINOv2 computes it: the one-process reference therefore
takes it on each rank's rows (the mean over the two halves of each crop: DDP averages the
ranks' gradients), which is what two processes must equal. The mutations compute the
cross-process statistics per process (Sinkhorn-Knopp, the centres): the test must see them.

DINOv2's masked-patch centre (``patch_center_tokens="masked"``) is by design the mean over the
processes of each process's masked-patch mean, not the one-process mean over all the masked
patches: one step on uneven masks, in one process and on two, records the centres and the
teacher's masked rows for the formula written out in the test.
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


# DINOv2's running patch centre over the masked patches (patch_center_tokens="masked"): a
# separate patch head, so that a hook on the teacher's sees exactly the masked rows it scores
MASKED_CENTRE = dict(centering="mean", patch_center_tokens="masked", shared_head=False,
                     patch_out_dim=10, koleo_weight=0.0)


def uneven_masks() -> torch.Tensor:
    """(crop, image, patch) masks of 2 B images: rank 0's B images about 60 % masked, rank 1's
    about 10 % (at least one patch each), so that the mean of the two processes' means is not
    the mean over all the masked patches."""
    g = torch.Generator().manual_seed(7)
    p = torch.tensor([0.6] * B + [0.1] * B).view(1, WORLD * B, 1)
    masks = torch.rand(2, WORLD * B, L, generator=g) < p
    masks[:, :, 0] = True
    return masks


def masked_centre_step(rank: int, world: int) -> dict:
    """One step with the masked-patch centre; records the centre before and after, the momentum,
    and the teacher patch head's rows (the masked patches of this process's images)."""
    method = build(IBOT, MASKED_CENTRE)
    model = DDP(method) if world > 1 else method
    rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
    views = batches()[0][0]
    local = uneven_masks()[:, rows].reshape(-1, L)  # crop-major, as the method stacks the crops
    method.draw_masks = lambda n, h, w: local  # type: ignore[method-assign]
    seen: list[torch.Tensor] = []
    patch_head = method.teacher.module["patch_head"]
    handle = patch_head.register_forward_hook(lambda mod, args, out: seen.append(out.detach()))
    before = method.center_patch.clone()
    model(method.make_batch([v[rows] for v in views], step=0, total_steps=STEPS))
    handle.remove()
    assert len(seen) == 1 and len(seen[0]) == int(local.sum())
    return {"before": before, "after": method.center_patch.clone(), "rows": seen[0],
            "momentum": torch.tensor(method.center_momentum, dtype=torch.float64)}


def reference(world: int) -> dict:
    out = {name: train(cfg, 0, 1, PerRankKoLeo) for name, cfg in CONFIGS.items()}
    out["dinov2_batch_koleo"] = train(CONFIGS["dinov2"], 0, 1)  # KoLeo over all 2B rows
    out["masked_centre"] = masked_centre_step(0, 1)  # one process, all 2B images
    return out


def distributed(rank: int, world: int) -> dict:
    out = {f"{name}_distributed": train(cfg, rank, world) for name, cfg in CONFIGS.items()}
    out["masked_centre_distributed"] = masked_centre_step(rank, world)
    # mutations: the cross-process statistics taken per process
    ibot_module.sinkhorn_knopp = functools.partial(sinkhorn_knopp, distributed=False)
    out["dinov2_mutated"] = train(CONFIGS["dinov2"], rank, world)
    ibot_module.dino_center = functools.partial(dino_center, distributed=False)
    out["ibot_mutated"] = train(CONFIGS["ibot"], rank, world)
    ibot_module.sinkhorn_knopp, ibot_module.dino_center = sinkhorn_knopp, dino_center
    return out
