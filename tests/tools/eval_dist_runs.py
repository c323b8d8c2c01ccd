"""The runs of tests/tools/test_eval_distributed.py (not a test module; the ``two_process_runs``
fixture launches it, tests/launch_worker.py): ``contrastive-knn-eval`` on an ImageFolder of 13
and 5 images per class (uneven shards and a ragged last batch of 4), a random ``small_cnn``.
The kNN tool only: the linear probe's cached protocol extracts features through the same
encode_split / gather_for_metrics path."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_eval_tools import COMMON, make_imagefolder  # noqa: E402


def _args(folder: Path) -> list[str]:
    return ["--checkpoint", str(folder / "encoder.pt"), "--data", str(folder / "data"), *COMMON,
            "--batch-size", "4", "--k", "5"]


def prepare(folder: Path) -> None:
    import torch

    from contrastive.nn import create_encoder

    make_imagefolder(folder / "data", {"train": 13, "val": 5})
    torch.manual_seed(0)
    torch.save({"encoder": "small_cnn", "state_dict": create_encoder("small_cnn").state_dict()},
               folder / "encoder.pt")


def run(folder: Path, name: str) -> None:
    from contrastive.engine import reset_accelerate_state
    from contrastive.eval.cli import knn_eval_main

    reset_accelerate_state()
    try:
        assert knn_eval_main([*_args(folder), "--output", str(folder / f"{name}.json")]) == 0
    finally:
        reset_accelerate_state()
