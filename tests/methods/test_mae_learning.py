"""MAE learns its task at CPU scale, and the copy-task control does not.

Check (in process, fp32, 1 thread): a 2-block ViT (width 32, 16-px ``shapes`` images, 4-px
patches: 16 tokens, 4 visible) with a 1-block decoder, AdamW lr 1e-3, betas (0.9, 0.95), wd
0.05, batch 32, 80 steps. Figure: MAE's loss on the masked 75 % of 256 HELD-OUT images with
fixed masks (normalised pixels; predicting zeros scores about 0.98), before -> after.
Negative control: the same run with the loss on the visible patches only (``loss_on="visible"``,
a copy task) never learns to inpaint: its masked-patch loss stays near the zero predictor's.

Measured 2026-11-27 (AMD EPYC Zen 5, 1 thread, load 7, ~3 s per run), seeds 0 / 1 / 2:
MAE 1.737 -> 0.349, 1.728 -> 0.341, 1.850 -> 0.349 (spread 0.008); visible-only -> 1.172,
0.961, 1.062. (At 150 steps of 64: MAE 0.302 / 0.305 / 0.311, control 1.175 / 1.024 / 1.013.)
Thresholds: MAE below 0.45 (0.10 above the worst seed, 12x the spread), the control above 0.8
and at least 0.5 above MAE of the same seed.

The representation check (kNN top-1 of the class token) does NOT pass at CPU scale, an honest
xfail in tests/recipes/test_learning_mae.py with the figures: MAE is known to need long schedules
(the paper: 800-1600 epochs) and its class-token kNN / linear figures are low even then.
"""

from __future__ import annotations

import pytest
import torch

from contrastive.losses.reconstruction import masked_reconstruction
from contrastive.methods import MAE
from contrastive.nn.masked_vit import masked_tokens
from contrastive.nn.masking import patchify, random_masking

MEASURED = {0: (0.349, 1.172), 1: (0.341, 0.961), 2: (0.349, 1.062)}  # MAE, visible-only


def _inpaint_loss(m: MAE, x: torch.Tensor) -> float:
    k = random_masking(x.shape[0], m.num_patches, 0.75, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        pred = m.decoder(masked_tokens(m.encoder, x, keep=k.keep), k.restore)
        return float(masked_reconstruction(pred, patchify(x, m.patch_size), k.mask))


def train(pretext_run, seed: int, loss_on: str) -> tuple[float, float]:
    """(held-out masked-patch loss before, after) of one run."""
    return pretext_run(lambda: MAE("timm:vit_tiny_patch16_224", decoder_dim=32, decoder_depth=1,
                                   decoder_heads=2, loss_on=loss_on,
                                   encoder_kwargs=dict(img_size=16, patch_size=4, embed_dim=32,
                                                       depth=2, num_heads=2)),
                       _inpaint_loss, seed, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.05)


def _check(pretext_run, seed: int) -> None:
    before, mae = train(pretext_run, seed, "masked")
    _, copy = train(pretext_run, seed, "visible")
    assert before > 1.2 and mae < 0.45, (before, mae)
    assert copy > 0.8 and copy > mae + 0.5, (mae, copy)


def test_mae_learns_to_inpaint_and_the_copy_task_does_not(pretext_run):
    _check(pretext_run, 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_mae_learns_to_inpaint_other_seeds(pretext_run, seed):
    _check(pretext_run, seed)
