#!/usr/bin/env python
"""DenseCL training steps: ours (``contrastive.methods.DenseCL``, its ``cifar`` preset) against
lightly's DenseCL as its example writes it (``examples/pytorch/densecl.py``: a ResNet trunk,
``DenseCLProjectionHead`` global and local, momentum copies by ``update_momentum``,
``select_most_similar`` on the backbone features, two ``NTXentLoss`` with memory banks of 4096 x
128, ``0.5 * (global + local)``).

Same model for both: ResNet-18 with the CIFAR stem (3x3 conv, no max-pool; lightly's trunk is
``nn.Sequential`` of its children less pool and fc, as the example cuts torchvision's) on 32-px
views, a 4 x 4 map of 512 channels; heads 512-512-128 (ours: MoCo v2's MLP and the 1x1-conv dense
head, the same products); 4096 keys in each queue / bank; tau 0.2 for both (the example leaves
NTXentLoss's 0.5); plain BatchNorm (our preset's split BN off, ``split_bn=0``). Timed: the key
networks' EMA, the query and key forwards, the correspondence, both losses, backward and an SGD
step on the same pre-made N(0, 1) views; the two alternate step by step in ONE process (same
load for both), the median ms/step after ``--warmup`` steps; fp32 and bf16 autocast (the timing
main: benchmarks/step_timing.py).

What differs from the example: its ``forward_momentum`` runs the QUERY networks (``self.backbone``,
not ``self.backbone_momentum``), so its keys would carry gradients and its momentum copies would
sit unused; here the key pass runs the momentum copies without gradient, as DenseCL does and as
ours. What differs in the method (not the cost, much): lightly's local bank stores every location's
key (16 per image here) where the authors' dense queue, as ours, stores one pooled key per image.

    PYTHONPATH=$PWD:<lightly dir> python benchmarks/bench_densecl.py --batch-size 32 \\
        --steps 8 --warmup 2 --threads 2

Measured 2026-11-29, AMD EPYC (AVX2 Zen 3, no native bf16), 2 threads, lightly 1.6.0,
torchvision 0.29.1, batch 32, load 5.6-8.5 (other sessions): fp32 lightly / ours 0.68 over 3
steps, 0.92 over 6 (0.58-1.04); bf16 (emulated) 1.08 over 2 steps.

Needs lightly (``pip install -e .[compare]``). Results: benchmarks/results/methods.md, section
"I-JEPA and DenseCL against lightly".
"""

from __future__ import annotations

import copy

import torch
from step_timing import backward_step, race, setting_line, timing_parser
from torch import nn

from contrastive.methods import DenseCL

OPTIMIZER = dict(lr=0.06, momentum=0.9, weight_decay=5e-4)


def ours():
    torch.manual_seed(0)
    model = DenseCL.from_preset("cifar", split_bn=0)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], **OPTIMIZER)

    def step(views: list[torch.Tensor]) -> torch.Tensor:
        return backward_step(opt, model(model.make_batch(views, step=1, total_steps=100))["loss"])

    return step


def lightly_densecl():
    from lightly.loss import NTXentLoss
    from lightly.models import utils
    from lightly.models.modules import DenseCLProjectionHead

    from contrastive.nn.encoders import cifar_resnet18

    preset = DenseCL.presets["cifar"]
    torch.manual_seed(0)
    backbone = nn.Sequential(*list(cifar_resnet18().children())[:-2])
    heads = [DenseCLProjectionHead(512, preset["mlp_hidden"], preset["dim"]) for _ in range(2)]
    query = nn.ModuleList([backbone, *heads])  # backbone, global head, local head
    key = copy.deepcopy(query)
    utils.deactivate_requires_grad(key)
    bank = (preset["queue_size"], preset["dim"])
    criterion_global, criterion_local = (
        NTXentLoss(temperature=preset["temperature"], memory_bank_size=bank) for _ in range(2))
    opt = torch.optim.SGD(query.parameters(), **OPTIMIZER)

    def forward(nets: nn.ModuleList, x: torch.Tensor):
        features = nets[0](x)  # (N, C, H, W)
        global_ = nets[1](features.mean(dim=(2, 3)))
        features = features.flatten(start_dim=2).permute(0, 2, 1)  # (N, H W, C)
        return features, global_, nets[2](features)

    def step(views: list[torch.Tensor]) -> torch.Tensor:
        x_query, x_key = views
        utils.update_momentum(query, key, m=preset["momentum"])
        query_features, query_global, query_local = forward(query, x_query)
        with torch.no_grad():
            key_features, key_global, key_local = forward(key, x_key)
        key_local = utils.select_most_similar(query_features, key_features, key_local)
        loss_global = criterion_global(query_global, key_global)
        loss_local = criterion_local(query_local.flatten(end_dim=1), key_local.flatten(end_dim=1))
        return backward_step(opt, 0.5 * (loss_global + loss_local))

    return step


def main() -> None:
    p = timing_parser(__doc__.splitlines()[0], batch_size=32, steps=6)
    p.add_argument("--size", type=int, default=32, help="view side in pixels")
    args = p.parse_args()
    gen = torch.Generator().manual_seed(1)
    views = [torch.randn(args.batch_size, 3, args.size, args.size, generator=gen)
             for _ in range(2)]
    print(setting_line("lightly", "torchvision"), flush=True)
    race(args, views, ours, lightly_densecl, setting=f", {args.size} px")
    print(setting_line("lightly", "torchvision"))


if __name__ == "__main__":
    main()
