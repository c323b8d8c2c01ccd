"""The runs of tests/recipes/test_distributed.py's batched-augmentation check (not a test module;
the ``two_process_runs`` fixture launches it, tests/launch_worker.py): recipes/moco_cifar.py in
float64 with the crops and the colour augmentation batched from the step's generator
(``--resident --batched-augment on``), plain BN in each process (``two``) against split BN in 2
groups in one process (``one``, in the test's process). The bug the comparison must catch: each
process drawing only its own rows' numbers (the rule before the draw was global), so rank 1's
samples get other views than in one process."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/

from launch_worker import run_recipe_main  # noqa: E402

STEPS = 6
ARGS = ["--data", "shapes:n=96,n_test=32,size=16", "--max-steps", str(STEPS),
        "--queue-size", "32", "--shuffle-bn", "false", "--knn-every", "0",
        "--save-every-steps", str(STEPS), "--resident", "--batched-augment", "on", "--float64"]


def run(folder: Path, name: str) -> None:
    """``two`` / ``mutant``: 2 processes, plain BN; ``one``: 1 process, split BN in 2 groups."""
    tiny = runpy.run_path(str(HERE / "conftest.py"))["recipe_cmd"]("moco_cifar")[2:]
    split = "2" if name == "one" else "0"
    run_recipe_main("moco_cifar", [*tiny, *ARGS, "--split-bn", split], folder / name)


def own_rows_only(n, tail, generator, share=None, *, dtype=None, device=None):
    """The bug: a process draws its own ``n`` rows from the start of the stream."""
    where = generator.device if generator is not None else device
    return torch.rand((n, *tail), generator=generator, dtype=dtype, device=where)


def mutations() -> list[tuple[object, str, object]]:
    import contrastive.augment.batched as batched
    import contrastive.augment.device_crop as device_crop

    return [(batched, "rand_rows", own_rows_only), (device_crop, "rand_rows", own_rows_only)]
