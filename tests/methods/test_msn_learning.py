"""Learning check for MSN on the built-in ``shapes`` -- an EXPECTED FAILURE: MSN does not separate
at a CPU budget (figures below). What it would check: a short run lifts weighted-kNN top-1 of
the target (teacher) encoder's class token above random initialisation, and a negative control
(each image's target view taken from ANOTHER image of the batch, so the anchor's prototype
assignment is matched to an unrelated image) does not lift it as far.

Setup (``recipes/msn_cifar.py``'s method scaled to CPU seconds, the ViT of
tests/methods/test_ijepa_learning.py with a class token): a ViT of width 64, 2 blocks, 4 heads
on 16-px images with 2-px patches (8 x 8 grid); head 256-256-64 with BN, 64 prototypes,
temperature 0.1, sharpening 0.25, Sinkhorn, me-max weight 1, patch drop PATCH_DROP; AdamW lr
LR, weight decay 0.04, the method's momentum schedule (0.996 -> 1 over 1.25 x the run); batch
32, STEPS steps; two views per image (the target, one random anchor), each a random crop of the
2-px reflect-padded image (one offset per batch) and a flip per image. Greyscale inputs
standardised per image and the kNN measure of tests/methods/conftest.py's ``grey_shapes``.

Measured 2026-11-29 (kNN top-1 %, seed 0, one thread, AVX2 Zen 3, nice 5 with three runs at
once on 2 cores shared, load ~7; target encoder, random init -> end; the student at the end):
600 steps, lr 1e-3, patch drop 0.3 (the constants): MSN 27.2 -> 25.6, the control 27.2 -> 29.8,
PMSN (power-law prior) 27.2 -> 26.4; about 71 s CPU and 410 s wall per run. 1,000 steps, lr
1e-3, drop 0.3: MSN 27.2 -> 24.4 (student 19.8). 1,000 steps, lr 2e-3, drop 0.5: MSN 27.2 ->
21.6 (student 19.0), the control 27.2 -> 32.6 (student 34.6); 85-95 s CPU per run. MSN lowers
kNN below random init and the mismatched control raises it: the prototype objective (me-max
over 64 prototypes at batch 32, Sinkhorn) seems to cluster on features that do not follow the
shape class at this scale. Not investigated further (one seed, no sweep of prototypes, batch
or temperatures). The test keeps the claim it would make (GAIN, OVER_CONTROL points) and is
marked xfail(raises=AssertionError), as the DenseCL dense check; it is slow (-m slow), two runs
of about 71 s CPU.

On real images MSN does learn: tests/recipes/test_learning_msn.py (the CIFAR recipe, the ViT
and budget of the iBOT check, 300 steps of batch 64) lifts the target encoder's kNN from 28.5
to 31.45 (seed 0). This check stays as the cheap one on the built-in data, and as the record
of where MSN does not separate.
"""

from __future__ import annotations

import pytest
import torch

from contrastive.methods import MSN

pytestmark = pytest.mark.slow

STEPS, BATCH, SIZE, PAD, LR, PATCH_DROP = 600, 32, 16, 2, 1e-3, 0.3
GAIN, OVER_CONTROL = 2.0, 2.0  # points the claim would need; measured -1.6 and -4.2 (docstring)
VIT = dict(img_size=SIZE, patch_size=2, embed_dim=64, depth=2, num_heads=4)


def view(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A random SIZE crop of the reflect-padded batch (one offset for the batch), flips."""
    pad = torch.nn.functional.pad(x, (PAD,) * 4, mode="reflect")
    i, j = torch.randint(0, 2 * PAD + 1, (2,), generator=g).tolist()
    v = pad[:, :, i:i + SIZE, j:j + SIZE]
    return torch.where((torch.rand(len(x), generator=g) < 0.5)[:, None, None, None],
                       v.flip(3), v)


def train(seed: int, control: bool, shapes, prior: str = "uniform", steps: int = STEPS,
          lr: float = LR, patch_drop: float = PATCH_DROP) -> tuple[float, float, float]:
    """kNN top-1 of the target encoder at init and after ``steps``, and of the student then."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        method = MSN("timm:vit_tiny_patch16_224", hidden_dim=256, out_dim=64,
                     num_prototypes=64, patch_drop=patch_drop, prior=prior,
                     encoder_kwargs=VIT)
        momentum = method.schedules()["momentum"]
        target_encoder = method.teacher.module[0]
        data = shapes.data(SIZE)
        xtr = data[0]
        before = shapes.knn(target_encoder, data)
        opt = torch.optim.AdamW(method.parameters(), lr=lr, weight_decay=0.04)
        g = torch.Generator().manual_seed(seed)
        for step in range(steps):
            x = xtr[torch.randint(0, xtr.shape[0], (BATCH,), generator=g)]
            target, anchor = view(x, g), view(x, g)
            if control:  # each image's target view from the next image of the batch
                target = target.roll(1, dims=0)
            loss = method({"views": [target, anchor], "momentum": momentum(step, steps)})["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
        return before, shapes.knn(target_encoder, data), shapes.knn(method.encoder, data)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.xfail(raises=AssertionError, strict=False,
                   reason="MSN does not separate at this scale (module docstring)")
def test_msn_learns_and_the_mismatched_control_does_not(grey_shapes):
    before, after, _ = train(0, control=False, shapes=grey_shapes)
    _, control, _ = train(0, control=True, shapes=grey_shapes)
    assert after > before + GAIN and after > control + OVER_CONTROL, (before, after, control)


if __name__ == "__main__":  # the measurement: PYTHONPATH=$PWD python tests/methods/test_msn_learning.py
    # RUN (msn | control | pmsn) SEED [STEPS LR PATCH_DROP]
    import sys
    import time

    from tests.methods.conftest import grey_shapes

    run_kind, seed = sys.argv[1], int(sys.argv[2])
    steps, lr, drop = (int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])) \
        if len(sys.argv) > 3 else (STEPS, LR, PATCH_DROP)
    t0, w0 = time.process_time(), time.time()
    print(run_kind, seed, train(seed, run_kind == "control", grey_shapes.__wrapped__(),
                                "power_law" if run_kind == "pmsn" else "uniform", steps, lr, drop),
          f"{time.process_time() - t0:.0f} s CPU, {time.time() - w0:.0f} s wall", flush=True)
