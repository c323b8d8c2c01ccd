"""Learning check for DenseCL on the built-in ``shapes``: a short run lifts weighted-kNN top-1
of the encoder's pooled features above random initialisation, and a negative control (the key
view taken from ANOTHER image, so neither the global nor the dense positive is a true match)
does not.

Setup (``recipes/densecl_cifar.py``'s method scaled to CPU seconds): ``small_cnn`` (its 3 x 3 map
at 24 px), heads 64-32, queues of 1,024, key momentum 0.99, split BN 4, SGD lr 0.06 momentum 0.9
wd 5e-4 (the CIFAR recipe's values), batch 32, 300 steps on 2,000 images of 24 px; views: a
random 24-px crop of the 3-px reflect-padded image (one offset per batch) and a flip per image.
As in tests/methods/test_dim_learning.py the inputs are greyscale, standardised per image
(tests/methods/conftest.py's ``grey_shapes``, with the kNN measure):
``shapes`` colours are random and, with RGB inputs, 150 steps moved kNN by only +3.6 / +1.6 / 0.0
points (seeds 0-2) against -2.2 / +1.0 for the control (measured 2026-11-29). kNN: k 20, t 0.1,
1,000 training images as the bank, 500 held-out images as queries.

Measured 2026-11-29 (kNN top-1 %, random init -> 300 steps, one thread, AVX2 Zen 3): seed 0
46.6 -> 55.0 (+8.4), seed 1 41.8 -> 50.0 (+8.2), seed 2 43.8 -> 53.8 (+10.0); the control (seed
0) 46.6 -> 33.6, it unlearns. Under pytest the same seed ended at 50.2 (+3.6): 300 SGD steps
amplify rounding differences (other kernels or thread set-up) into a few points, so the
margins are a 2-point gain and 10 points over the control. About 67 s of CPU per run, two
runs: the check is slow (-m slow).

The dense check of issue 55 (per-pixel linear segmentation of ``shapes``: background and the ten
shapes, :mod:`contrastive.eval.segmentation` on the 3 x 3 last-stage map, 1,000 training
images with their masks, 50 epochs, the 500 held-out images scored): the same DenseCL against
its random init and against MoCo v2 with the same budget (``dense_weight=0``: the same encoder
init, global head, queue, tau and 300 steps; the dense head idle). Measured 2026-11-29 (seed 0,
one thread, load 9 on the 2 shared cores), mIoU % / pixel accuracy %: random init 21.9 / 88.1,
DenseCL 22.8 / 88.8, MoCo v2 23.4 / 88.9 (kNN 46.6, 50.2, 51.0). DenseCL does NOT separate at
this scale: both pretrained encoders gain 1-1.5 mIoU points over random init and DenseCL
trails MoCo v2 by 0.6. The check asserts what the issue expects (DenseCL above both by a
point) as an expected failure, so that it reports when a longer budget or another setting
makes the dense loss show; about 3 x 67 s of CPU for the runs plus 3 x 20-40 s for the probes.
"""

from __future__ import annotations

import pytest
import torch

from contrastive.methods import DenseCL

pytestmark = pytest.mark.slow

STEPS, BATCH, SIZE, LR = 300, 32, 24, 0.06
GAIN, OVER_CONTROL = 2.0, 10.0  # points: below every measured gain (3.6 the least) and gap


def view(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    pad = torch.nn.functional.pad(x, (3, 3, 3, 3), mode="reflect")
    i, j = torch.randint(0, 7, (2,), generator=g).tolist()
    v = pad[:, :, i:i + SIZE, j:j + SIZE]
    flip = torch.rand(x.shape[0], generator=g) < 0.5
    return torch.where(flip[:, None, None, None], v.flip(3), v)


def pretrained(seed: int, xtr: torch.Tensor, *, control: bool = False, dense_weight: float = 0.5,
               steps: int = STEPS) -> DenseCL:
    """DenseCL after ``steps`` steps on ``xtr`` (0: random init; dense_weight 0: MoCo v2 with the
    same encoder, head, queue, tau and budget, its dense head idle)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        method = DenseCL("small_cnn", dim=32, mlp_hidden=64, queue_size=1024, momentum=0.99,
                         split_bn=4, dense_weight=dense_weight)
        opt = torch.optim.SGD(method.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = xtr[torch.randint(0, xtr.shape[0], (BATCH,), generator=g)]
            other = x[torch.randperm(BATCH, generator=g)] if control else x
            loss = method({"views": [view(x, g), view(other, g)], "momentum": 0.99})["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
        return method
    finally:
        torch.set_num_threads(threads)


def test_densecl_learns_and_the_mismatched_control_does_not(grey_shapes):
    data = grey_shapes.data(SIZE)
    before, after, control = (grey_shapes.knn(pretrained(0, data[0], **kw).encoder, data)
                              for kw in ({"steps": 0}, {}, {"control": True}))
    assert after > before + GAIN and after > control + OVER_CONTROL, (before, after, control)


@pytest.mark.xfail(raises=AssertionError, strict=False,
                   reason="DenseCL does not separate at this scale (module docstring)")
def test_densecl_segments_shapes_better_than_random_init_and_mocov2(grey_shapes,
                                                                   segmentation_scores):
    data = grey_shapes.data(SIZE)
    random, densecl, mocov2 = (segmentation_scores(pretrained(0, data[0], **kw).encoder,
                                                   data)["miou"]
                               for kw in ({"steps": 0}, {}, {"dense_weight": 0.0}))
    assert densecl > random + 1 and densecl > mocov2 + 1, (random, densecl, mocov2)
