"""Case of tests/methods/test_ijepa_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first trains I-JEPA in one process on the whole batch (2B images, one batch's masks);
then both ranks train the same 3 SGD steps on their half with gloo + DDP, each image keeping the
masks it had in the one-process run (the batch's rows: the block sizes and the context length
are the batch's, as every process draws the same masks in a run); then again with every rank
using rank 0's rows of the masks, which the test must see. Float64, momentum 0.5 so that the
target's EMA takes part. No cross-process term: each rank's loss is the mean over its rows'
predicted elements, all of one count, and DDP averages the gradients, which equals the
one-process mean; the target follows the encoder, equal on every rank.
"""

from __future__ import annotations

import torch
from dist_worker import SGDRecord
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods import IJEPA
from contrastive.nn.masking import MultiBlock, multiblock_masks

B, STEPS = 4, 3
VIT = dict(img_size=16, patch_size=2, embed_dim=16, depth=1, num_heads=2, class_token=False,
           global_pool="avg", fc_norm=False)


def batches():
    g = torch.Generator().manual_seed(123)
    out = []
    for step in range(STEPS):
        images = torch.randn(2 * B, 3, 16, 16, generator=g, dtype=torch.float64)
        masks = multiblock_masks(2 * B, 8, 8, sizes=torch.Generator().manual_seed(step),
                                 positions=g, min_keep=4)
        out.append((images, masks))
    return out


def train(rank: int, world: int, mutate: bool = False) -> dict:
    torch.manual_seed(0)
    method = IJEPA("timm:vit_tiny_patch16_224", predictor_dim=8, predictor_depth=1, min_keep=4,
                   momentum=0.5, encoder_kwargs=VIT).double()
    model = DDP(method) if world > 1 else method
    opt = torch.optim.SGD(method.parameters(), lr=0.5)
    record = SGDRecord()
    for step, (images, masks) in enumerate(batches()):
        rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
        mine = slice(0, B) if mutate else rows
        local = MultiBlock(masks.context[mine], masks.targets[:, mine])
        method.draw_masks = lambda n, z=local: z  # type: ignore[method-assign]
        out = model(method.make_batch([images[rows]], step=step, total_steps=STEPS))
        record.step(out["loss"], method, opt)
    return record.finish(method)


def reference(world: int) -> dict:
    return {"ijepa": train(0, 1)}


def distributed(rank: int, world: int) -> dict:
    return {"ijepa_distributed": train(rank, world), "ijepa_mutated": train(rank, world, True)}
