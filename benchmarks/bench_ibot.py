#!/usr/bin/env python
"""iBOT / DINOv2-style training steps: ours (``contrastive.methods.IBOT``) against the same step
assembled from lightly's pieces as its DINOv2 example does (``MaskedVisionTransformerTIMM``
with a mask token, ``DINOProjectionHead``, ``DINOLoss``, ``IBOTPatchLoss``, ``KoLeoLoss``,
``random_block_mask``, ``update_momentum``).

Same model for both: timm's ``vit_tiny_patch16_224`` at 32 px with 4-px patches (64 tokens,
width 192, 12 blocks, ``dynamic_img_size`` for the local crops), one head (2048 hidden, 256
bottleneck, 4096 prototypes) shared by the class and patch tokens, student and EMA teacher,
2 global crops of 32 px and ``--local-crops`` of 16 px, masks on half the global crops at
0.1-0.5, running centres, KoLeo 0.1. Timed: teacher EMA and forward, student forward, the
three losses, backward and an AdamW step on the same pre-made N(0, 1) crops; the two
implementations alternate step by step in ONE process (same load for both), the median
ms/step after ``--warmup`` steps; fp32, and bf16 autocast where the CPU computes bf16 natively
(the timing main: benchmarks/step_timing.py).

    hold_nice python benchmarks/bench_ibot.py --batch-size 32 --steps 8 --warmup 2 --threads 2

Measured 2026-11-27, AMD EPYC Zen 5 (AVX-512 with native bf16), 2 threads, lightly 1.6.0, timm
1.0.31, batch 32, 4 local crops, under hold_nice (load 2.6-3.5 from other sessions):
fp32 ours 2227 / lightly 1934 ms/step (lightly / ours 0.87); bf16 autocast ours 1216 / lightly
1123 ms/step (0.92). The gap is iBOT's patch centre: it averages the teacher's head output
over EVERY patch (bytedance/ibot ``update_center``), so our teacher runs its head on all 64
patches of each global crop, where lightly's centre (DINOv2's rule) reads the masked ones only.
With the heads on every patch (before they were limited to the masked ones: the student always,
the teacher except for that centre), ours took 3048 ms/step in fp32 (0.64), 1596 in bf16 (0.71).
"""

from __future__ import annotations

import copy

import torch
from step_timing import race, timing_parser

VIT = dict(img_size=32, patch_size=4, num_classes=0, dynamic_img_size=True)


def ours(args):
    from contrastive.methods import IBOT

    torch.manual_seed(0)
    model = IBOT.from_preset("cifar", koleo_weight=0.1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step(views: list[torch.Tensor]) -> torch.Tensor:
        loss = model(model.make_batch(views, step=1, total_steps=100))["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def lightly_ibot(args):
    import timm
    from lightly.loss import DINOLoss, IBOTPatchLoss, KoLeoLoss
    from lightly.models.modules import DINOProjectionHead, MaskedVisionTransformerTIMM
    from lightly.models.utils import random_block_mask, update_momentum

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", **VIT)
    student = MaskedVisionTransformerTIMM(vit=vit, mask_token=torch.nn.Parameter(
        torch.zeros(1, 1, vit.embed_dim)))
    head = DINOProjectionHead(vit.embed_dim, 2048, 256, 4096)
    t_backbone, t_head = copy.deepcopy(student), DINOProjectionHead(vit.embed_dim, 2048, 256, 4096)
    t_head.load_state_dict(head.state_dict())  # its weight_norm refuses deepcopy
    for p in [*t_backbone.parameters(), *t_head.parameters()]:
        p.requires_grad_(False)
    dino_loss, ibot_loss = DINOLoss(output_dim=4096), IBOTPatchLoss(output_dim=4096)
    koleo = KoLeoLoss()
    params = [p for p in [*student.parameters(), *head.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step(views: list[torch.Tensor]) -> torch.Tensor:
        g = torch.cat(views[:2])
        n = g.shape[0]
        block = random_block_mask(size=(n, 8, 8), device=g.device)  # (2B, 8, 8)
        mask = torch.cat([torch.zeros(n, 1, dtype=torch.bool), block.flatten(1)], dim=1)
        with torch.no_grad():
            update_momentum(student, t_backbone, 0.996)
            update_momentum(head, t_head, 0.996)
            t_tokens = t_backbone.encode(g)
            t_cls, t_patch = t_head(t_tokens[:, 0]), t_head(t_tokens[:, 1:][block.flatten(1)])
        s_tokens = student.encode(g, mask=mask)
        s_cls = head(s_tokens[:, 0])
        s_local = [head(student.encode(v)[:, 0]) for v in views[2:]]
        s_patch = head(s_tokens[:, 1:][block.flatten(1)])
        loss = dino_loss(list(t_cls.chunk(2)), [*s_cls.chunk(2), *s_local], teacher_temp=0.07)
        loss = loss + ibot_loss(t_patch, s_patch, mask=block, teacher_temp=0.07)
        loss = loss + 0.1 * sum(koleo(c) for c in s_tokens[:, 0].chunk(2))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def main() -> None:
    p = timing_parser(__doc__.splitlines()[0], batch_size=32, steps=10)
    p.add_argument("--local-crops", type=int, default=4)
    args = p.parse_args()
    gen = torch.Generator().manual_seed(1)
    views = [torch.randn(args.batch_size, 3, 32, 32, generator=gen) for _ in range(2)]
    views += [torch.randn(args.batch_size, 3, 16, 16, generator=gen)
              for _ in range(args.local_crops)]
    race(args, views, lambda: ours(args), lambda: lightly_ibot(args),
         setting=f", {args.local_crops} local crops")


if __name__ == "__main__":
    main()
