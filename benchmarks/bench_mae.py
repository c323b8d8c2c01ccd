#!/usr/bin/env python
"""MAE training steps: ours (``contrastive.methods.MAE``) against lightly's MAE written as its
example (``examples/pytorch/mae.py``: ``MaskedVisionTransformerTIMM``, ``MAEDecoderTIMM``,
``random_token_mask``, ``patchify`` / ``get_at_index``, MSE on per-patch normalised targets).

Same model for both: timm's ``vit_tiny_patch16_224`` at 32 px with 4-px patches (64 tokens,
width 192, 12 blocks), decoder 2 blocks of width 128 with 4 heads (our ``cifar`` preset), mask
ratio 0.75. Timed: forward, loss, backward and an AdamW step on the same pre-made N(0, 1)
batch; the two implementations alternate step by step in ONE process (same load for both), the
median ms/step after ``--warmup`` steps; fp32, and bf16 autocast where the CPU computes bf16
natively. Print the load average and CPU beside the figures.

    hold_nice python benchmarks/bench_mae.py --batch-size 64 --steps 12 --warmup 2 --threads 2

Measured 2026-11-27, AMD EPYC Zen 5 (AVX-512 with native bf16), 2 threads, lightly 1.6.0, timm
1.0.31, load 4.1-4.7 under hold_nice (other sessions' processes): fp32 ours 322.4 / lightly
323.4 ms/step (1.00); bf16 autocast ours 215.4 / lightly 214.9 ms/step (1.00). The same speed:
both run timm's blocks on the same 16 visible + 1 class tokens and the decoder on all 65.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time

import torch


def ours(batch: int):
    from contrastive.methods import MAE

    torch.manual_seed(0)
    model = MAE.from_preset("cifar")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(model.make_batch([x]))["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def lightly_mae(batch: int):
    import timm
    from lightly.models import utils
    from lightly.models.modules import MAEDecoderTIMM, MaskedVisionTransformerTIMM

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, num_classes=0)
    backbone = MaskedVisionTransformerTIMM(vit=vit)
    decoder = MAEDecoderTIMM(num_patches=vit.patch_embed.num_patches, patch_size=4,
                             embed_dim=vit.embed_dim, decoder_embed_dim=128, decoder_depth=2,
                             decoder_num_heads=4, mlp_ratio=4.0)
    params = [*backbone.parameters(), *decoder.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95))
    seq = backbone.sequence_length

    def step(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        idx_keep, idx_mask = utils.random_token_mask(size=(n, seq), mask_ratio=0.75,
                                                     device=x.device)
        encoded = backbone.encode(images=x, idx_keep=idx_keep)
        dec = decoder.embed(encoded)
        full = utils.repeat_token(decoder.mask_token, (n, seq))
        full = utils.set_at_index(full, idx_keep, dec.type_as(full))
        pred = decoder.predict(utils.get_at_index(decoder.decode(full), idx_mask))
        target = utils.get_at_index(utils.patchify(x, 4), idx_mask - 1)
        loss = torch.nn.functional.mse_loss(pred.float(), utils.normalize_mean_var(target))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--precisions", default="fp32,bf16")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.randn(args.batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    print(f"CPU {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}, batch "
          f"{args.batch_size}")
    for precision in args.precisions.split(","):
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
               else contextlib.nullcontext())
        steps = {"ours": ours(args.batch_size), "lightly": lightly_mae(args.batch_size)}
        times: dict[str, list[float]] = {k: [] for k in steps}
        for i in range(args.steps):
            for name, step in steps.items():
                t = time.perf_counter()
                with ctx:
                    step(x)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        print(f"{precision}: ours {med['ours']:.1f} ms/step, lightly {med['lightly']:.1f} "
              f"ms/step, lightly / ours = {med['lightly'] / med['ours']:.2f} "
              f"(load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
