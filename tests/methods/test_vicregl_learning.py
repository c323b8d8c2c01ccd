"""Learning check for VICRegL on the built-in ``shapes``: a short run lifts weighted-kNN top-1
of the encoder's pooled features above random initialisation, and a negative control (the
second view taken from ANOTHER image, so neither the global nor any local pair is a true match)
does not.

Setup (``recipes/vicregl_cifar.py``'s method scaled to CPU seconds, as
tests/methods/test_densecl_learning.py): ``small_cnn`` (its 3 x 3 map at 24 px), expanders
64-64-64 and 32-32-32, alpha 0.75, weights 25 / 25 / 1, location matches (4, 2) of the 9
locations, SGD lr LR momentum 0.9 wd 5e-4, batch 32, STEPS steps on 2,000 images of 24 px;
views: a random 24-px crop of the 3-px reflect-padded image (one offset per batch, its box the
crop box) and a flip per image (not in the grid, as the code's default). Greyscale inputs
standardised per image, as the DenseCL check argues (tests/methods/conftest.py's ``grey_shapes``,
with the kNN measure: k 20, t 0.1, 1,000 training images as the bank, 500 held-out images as
queries).

Measured 2026-11-29 (kNN top-1 %, random init -> 300 steps, one thread, AVX2 Zen 3, the
machine shared): lr 0.003: seed 0 46.6 -> 50.4 (+3.8), seed 1 41.8 -> 52.8 (+11.0); the control
(seed 0) 46.6 -> 36.0, it unlearns. lr 0.03 and 0.01 (the loss is 25 x VICReg's terms: SGD
steps 25 times larger than InfoNCE's) lowered kNN (seed 0: 41.4 and 39.8). About 65 s of CPU
per run, two runs: the check is slow (-m slow).

The dense check of issue 55 (DenseCL's protocol, tests/methods/conftest.py's
``segmentation_scores``: per-pixel linear segmentation of ``shapes``, background and the ten
shapes, on the 3 x 3 last-stage map, 1,000 training images with their masks, 50 epochs, the
500 held-out images scored): the same VICRegL against its random init and against VICReg with
the same budget (``alpha=1``: the same encoder init, expander, coefficients and 300 steps; the
local term off). Measured 2026-11-29 under pytest (one thread, nice 5, AVX2 Zen 3, load 5-7 on
the 2 shared cores), mIoU % / pixel accuracy % (kNN top-1 %):
seed 0: random init 21.9 / 88.1 (46.6), VICRegL 25.7 / 89.0 (50.4), VICReg 24.5 / 88.8 (49.0);
seed 1: random init 21.0 / 88.2 (41.8), VICRegL 26.0 / 89.0 (52.8), VICReg 26.1 / 89.1 (52.2).
Both pretrained encoders gain 3-5 mIoU points over random init, but VICRegL does NOT separate
from VICReg at this scale: +1.2 at seed 0, -0.2 at seed 1. The check asserts what the issue
expects (VICRegL above both by a point) on seed 0 as an expected failure (not strict: seed 0
passes by 0.2 over the margin, an XPASS, which rounding alone can flip), so that it reports
when a longer budget or another setting makes the local loss show; about 55 + 40 s of CPU for
the runs plus 3 x 12 s for the probes.
"""

from __future__ import annotations

import pytest
import torch

from contrastive.methods import VICRegL

pytestmark = pytest.mark.slow

STEPS, BATCH, SIZE, PAD, LR = 300, 32, 24, 3, 0.003
GAIN, OVER_CONTROL = 2.0, 8.0  # points: below the measured gains (3.8 the least) and gap (14.4)


def view(x: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random crop of the padded batch and its box (N, 4) in the padded image; flips."""
    pad = torch.nn.functional.pad(x, (PAD,) * 4, mode="reflect")
    i, j = torch.randint(0, 2 * PAD + 1, (2,), generator=g).tolist()
    v = pad[:, :, i:i + SIZE, j:j + SIZE]
    flip = torch.rand(x.shape[0], generator=g) < 0.5
    box = torch.tensor([i, j, SIZE, SIZE], dtype=torch.float32).expand(x.shape[0], 4)
    return torch.where(flip[:, None, None, None], v.flip(3), v), box


def pretrained(seed: int, xtr: torch.Tensor, *, control: bool = False, lr: float = LR,
               alpha: float = 0.75, steps: int = STEPS) -> VICRegL:
    """VICRegL after ``steps`` steps on ``xtr`` (0: random init; alpha 1: VICReg with the same
    encoder, expander, coefficients and budget, the local term off)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        method = VICRegL("small_cnn", dim=64, mlp_hidden=64, maps_dim=32, maps_hidden=32,
                         alpha=alpha, num_matches=(4, 2))
        opt = torch.optim.SGD(method.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = xtr[torch.randint(0, xtr.shape[0], (BATCH,), generator=g)]
            other = x[torch.randperm(BATCH, generator=g)] if control else x
            (v1, b1), (v2, b2) = view(x, g), view(other, g)
            out = method({"views": [v1, v2], "crop_boxes": torch.stack([b1, b2], dim=1)})
            opt.zero_grad()
            out["loss"].backward()
            opt.step()
        return method
    finally:
        torch.set_num_threads(threads)


def test_vicregl_learns_and_the_mismatched_control_does_not(grey_shapes):
    data = grey_shapes.data(SIZE)
    before, after, control = (grey_shapes.knn(pretrained(0, data[0], **kw).encoder, data)
                              for kw in ({"steps": 0}, {}, {"control": True}))
    assert after > before + GAIN and after > control + OVER_CONTROL, (before, after, control)


@pytest.mark.xfail(raises=AssertionError, strict=False,
                   reason="VICRegL does not separate from VICReg at this scale (module docstring)")
def test_vicregl_segments_shapes_better_than_random_init_and_vicreg(grey_shapes,
                                                                   segmentation_scores):
    data = grey_shapes.data(SIZE)
    random, vicregl, vicreg = (segmentation_scores(pretrained(0, data[0], **kw).encoder,
                                                   data)["miou"]
                               for kw in ({"steps": 0}, {}, {"alpha": 1.0}))
    assert vicregl > random + 1 and vicregl > vicreg + 1, (random, vicregl, vicreg)
