"""Case of tests/distill/test_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first runs the Distiller in one process on the whole batch (2B); then both ranks run the
same steps on their half with gloo + DistributedDataParallel(find_unused_parameters=True).
Step 0 is stage 1 (the student head is unused), step 1 stage 2 (KD + CE use it).
Everything runs in float64, so the two runs differ only by float64 rounding of sums taken in
other orders (the all-reduce, the batch means), which the test bounds tightly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods.distill import Distiller

B, STEPS = 4, 2


class Tiny(nn.Module):
    """No BatchNorm: per-sample computations, so 2 x B equals 1 x 2B exactly."""

    def __init__(self, widths):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        c, blocks = 4, []
        for w in widths:
            blocks.append(nn.Sequential(nn.Conv2d(c, w, 3, padding=1), nn.ReLU()))
            c = w
        self.blocks = nn.ModuleList(blocks)
        self.num_features = c

    def forward(self, x):
        h = self.stem(x)
        for i, block in enumerate(self.blocks):
            h = block(F.max_pool2d(h, 2) if i > 0 else h)
        return h.mean(dim=(2, 3))


def build() -> Distiller:
    torch.manual_seed(0)
    teacher_head = nn.Linear(8, 3)
    return Distiller(Tiny((5, 7, 8)), Tiny((5, 6)), teacher_head=teacher_head, switch_step=1,
                     perturb=True).double()


def run(model, method, x, y, rank_rows):
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.5)
    record = []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        out = model(method.make_batch([x[s][rank_rows]], step=s, total_steps=STEPS,
                                      labels=y[s][rank_rows]))
        out["loss"].backward()
        grads = {n: p.grad.clone() for n, p in method.named_parameters() if p.grad is not None}
        record.append({"loss": out["loss"].detach(), "stage": out["stage"], "grads": grads,
                       "pos_acc": out["pos_acc"]})
        opt.step()
    record.append({n: p.detach().clone() for n, p in method.state_dict().items()})
    return record


def data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    x = torch.randn(STEPS, world * B, 3, 8, 8, dtype=torch.float64)
    return x, torch.randint(0, 3, (STEPS, world * B))


def reference(world: int) -> dict:
    ref = build()  # its own seed: the same weights whatever ran before
    return {"ref": run(ref, ref, *data(world), slice(None))}


def distributed(rank: int, world: int) -> dict:
    x, y = data(world)
    method = build()
    ddp = DDP(method, find_unused_parameters=True)
    return {"ddp": run(ddp, method, x, y, slice(rank * B, (rank + 1) * B))}
