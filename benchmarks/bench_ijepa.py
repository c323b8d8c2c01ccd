#!/usr/bin/env python
"""I-JEPA training steps: ours (``contrastive.methods.IJEPA``, its ``cifar`` preset) against the
same step assembled from lightly's pieces (``MaskedVisionTransformerTIMM`` as context and target
encoder, ``IJEPAPredictorTIMM``, ``IJEPAMaskCollator``, ``apply_masks`` /
``repeat_interleave_batch``, ``update_momentum``, ``nn.SmoothL1Loss``: the step of lightly's
``examples/pytorch/ijepa.py``, whose torchvision ViT-B/32 pieces ``IJEPABackbone`` /
``IJEPAPredictor`` are swapped for lightly's timm ones so that both run the same ViT).

Same model for both, read from our preset: timm's ``vit_tiny_patch16_224`` at 32 px with 4-px
patches (8 x 8 = 64 tokens, width 192, 12 blocks, no class token), a predictor of 6 blocks of
width 96 with 3 heads; the same masks: 4 targets of scale 0.15-0.2 and aspect 0.75-1.5, one
context of 0.85-1.0 without them, min_keep 4. Timed: the masks, the target encoder's EMA and
forward on every patch (layer norm, the target blocks gathered), the context encoder on the
context patches, the predictor on each target block, smooth L1, backward and an AdamW step on the
same pre-made N(0, 1) batch; the two alternate step by step in ONE process (same load for both),
the median ms/step after ``--warmup`` steps; fp32 and bf16 autocast (the timing main:
benchmarks/step_timing.py).

The masks are part of both steps: ours draws them in its forward, lightly's collator (a Python
loop over images and blocks) runs where a loader would run it, here in the step on placeholder
items (the images are not collated). The collator's own median is printed with lightly's step
without it (lightly with its masks drawn in loader workers that cost the step nothing), and our
draw's. Other differences, none of which changes the work much: lightly's encoder learns its
position embedding (ours is fixed sin-cos), and each of lightly's contexts is cut to the batch's
smallest as ours (the authors' collator).

    PYTHONPATH=$PWD:<lightly dir> python benchmarks/bench_ijepa.py --batch-size 16 \\
        --steps 8 --warmup 2 --threads 2

Measured 2026-11-29, AMD EPYC (AVX2 Zen 3, no native bf16), 2 threads, lightly 1.6.0, timm
1.0.31, batch 16, load 4.5-8.5 (other sessions): fp32 lightly / ours 0.91 and 1.25 in two runs
(at par within the noise); bf16 (emulated) 0.67 over 4 steps, unexplained; lightly's collator
40-60 ms of a 4.5-33 s step.

Needs lightly (``pip install -e .[compare]``) and timm. Results: benchmarks/results/methods.md,
section "I-JEPA and DenseCL against lightly".
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from step_timing import backward_step, race, setting_line, timing_parser
from torch import nn

from contrastive.methods import IJEPA

PRESET: dict[str, Any] = IJEPA.presets["cifar"]


def ours(mask_ms: list[float]):
    torch.manual_seed(0)
    model = IJEPA.from_preset("cifar")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    draw = model.draw_masks

    def timed_draw(n: int) -> Any:
        t = time.perf_counter()
        masks = draw(n)
        mask_ms.append(1e3 * (time.perf_counter() - t))
        return masks

    model.draw_masks = timed_draw  # the method lets a caller replace it

    def step(x: torch.Tensor) -> torch.Tensor:
        return backward_step(opt, model(model.make_batch([x], step=1, total_steps=100))["loss"])

    return step


def lightly_ijepa(batch: int, mask_ms: list[float]):
    import timm
    from lightly.data.ijepa_collate import IJEPAMaskCollator
    from lightly.models import utils
    from lightly.models.modules import IJEPAPredictorTIMM, MaskedVisionTransformerTIMM

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=0, **PRESET["encoder_kwargs"])
    grid = vit.patch_embed.grid_size[0]
    encoder = MaskedVisionTransformerTIMM(vit=vit)
    target = copy.deepcopy(encoder)
    utils.deactivate_requires_grad(target)
    predictor = IJEPAPredictorTIMM(num_patches=grid * grid, depth=PRESET["predictor_depth"],
                                   mlp_dim=vit.embed_dim,
                                   predictor_embed_dim=PRESET["predictor_dim"],
                                   num_heads=vit.blocks[0].attn.num_heads)
    collator = IJEPAMaskCollator(
        input_size=PRESET["encoder_kwargs"]["img_size"],
        patch_size=PRESET["encoder_kwargs"]["patch_size"], enc_mask_scale=PRESET["context_scale"],
        pred_mask_scale=PRESET["target_scale"], aspect_ratio=PRESET["target_aspect"], nenc=1,
        npred=PRESET["num_targets"], min_keep=PRESET["min_keep"])
    items = [(torch.zeros(1), 0)] * batch
    criterion = nn.SmoothL1Loss()
    params = [p for p in [*encoder.parameters(), *predictor.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step(x: torch.Tensor) -> torch.Tensor:
        t = time.perf_counter()
        _, masks_enc, masks_pred = collator(items)
        mask_ms.append(1e3 * (time.perf_counter() - t))
        with torch.no_grad():
            utils.update_momentum(encoder, target, PRESET["momentum"])
            h = target.encode(x)
            h = F.layer_norm(h, (h.shape[-1],))
            h = utils.repeat_interleave_batch(utils.apply_masks(h, masks_pred), x.shape[0],
                                              repeat=len(masks_enc))
        z = predictor(encoder.encode(x, idx_keep=masks_enc[0]), masks_enc, masks_pred)
        return backward_step(opt, criterion(z, h))

    return step


def main() -> None:
    args = timing_parser(__doc__.splitlines()[0], batch_size=64, steps=8).parse_args()
    size = PRESET["encoder_kwargs"]["img_size"]
    x = torch.randn(args.batch_size, 3, size, size, generator=torch.Generator().manual_seed(1))
    print(setting_line("lightly", "timm"), flush=True)
    ours_ms: list[list[float]] = []
    lightly_ms: list[list[float]] = []

    def build_ours():
        ours_ms.append([])
        return ours(ours_ms[-1])

    def build_lightly():
        lightly_ms.append([])
        return lightly_ijepa(args.batch_size, lightly_ms[-1])

    medians = race(args, x, build_ours, build_lightly)
    for (precision, med), mine, theirs in zip(medians.items(), ours_ms, lightly_ms, strict=True):
        skip = args.warmup  # the masks of the timed steps only
        ours_masks, collator = (statistics.median(m[skip:]) for m in (mine, theirs))
        print(f"{precision}: masks: ours {ours_masks:.2f} ms, lightly's collator {collator:.2f} "
              f"ms; lightly's step without its collator {med['lightly'] - collator:.1f} ms, "
              f"lightly / ours = {(med['lightly'] - collator) / med['ours']:.2f}")
    print(setting_line("lightly", "timm"))


if __name__ == "__main__":
    main()
