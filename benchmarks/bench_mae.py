#!/usr/bin/env python
"""MAE training steps: ours (``contrastive.methods.MAE``) against lightly's MAE written as its
example (``examples/pytorch/mae.py``: ``MaskedVisionTransformerTIMM``, ``MAEDecoderTIMM``,
``random_token_mask``, ``patchify`` / ``get_at_index``, MSE on per-patch normalised targets).

Same model for both: timm's ``vit_tiny_patch16_224`` at 32 px with 4-px patches (64 tokens,
width 192, 12 blocks), decoder 2 blocks of width 128 with 4 heads (our ``cifar`` preset), mask
ratio 0.75. Timed: forward, loss, backward and an AdamW step on the same pre-made N(0, 1)
batch; the two implementations alternate step by step in ONE process (same load for both), the
median ms/step after ``--warmup`` steps; fp32, and bf16 autocast where the CPU computes bf16
natively (the timing main: benchmarks/step_timing.py). Print the load average and CPU beside
the figures.

    hold_nice python benchmarks/bench_mae.py --batch-size 64 --steps 12 --warmup 2 --threads 2

Measured 2026-11-27, AMD EPYC Zen 5 (AVX-512 with native bf16), 2 threads, lightly 1.6.0, timm
1.0.31, load 4.1-4.7 under hold_nice (other sessions' processes): fp32 ours 322.4 / lightly
323.4 ms/step (1.00); bf16 autocast ours 215.4 / lightly 214.9 ms/step (1.00). The same speed:
both run timm's blocks on the same 16 visible + 1 class tokens and the decoder on all 65.
"""

from __future__ import annotations

import torch
from step_timing import race, timing_parser


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
    args = timing_parser(__doc__.splitlines()[0], batch_size=64, steps=12).parse_args()
    x = torch.randn(args.batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    race(args, x, lambda: ours(args.batch_size), lambda: lightly_mae(args.batch_size))


if __name__ == "__main__":
    main()
