"""The runs of tests/recipes/test_shards_resume.py's two-process check (not a test module; the
``two_process_runs`` fixture launches it, tests/launch_worker.py): recipes/moco_cifar.py on
UNEVEN tar shards (7 samples each: the shards do not split evenly between the processes, the
map-style sampler does), per-image augmentation, plain BN: run ``a`` uninterrupted for N steps
with checkpoints every K, then run ``b`` resumed from ``a``'s mid-epoch checkpoint at step K
(epoch 1, micro-batch 1) in a new folder."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/

from launch_worker import run_recipe_main  # noqa: E402

N, K = 12, 5  # 64 images / batch 16 = 4 steps per epoch; the checkpoint at 5 is mid-epoch


def shard_args(shards: Path) -> list[str]:
    """The flags of every run on ``shards``, after tests/recipes/conftest.py's tiny ones."""
    return ["--data", f"wds:{shards}", "--epochs", "3", "--pass-indices", "--save-every-steps",
            str(K), "--keep-last", "5", "--knn-every", "0"]


def prepare(folder: Path) -> None:
    from contrastive.data.make_shards import main as make_shards

    assert make_shards(["--data", "shapes:n=64,n_test=32,size=16", "--out",
                        str(folder / "wds"), "--max-count", "7"]) == 0


def run(folder: Path, name: str) -> None:
    tiny = runpy.run_path(str(HERE / "conftest.py"))["recipe_cmd"]("moco_cifar")[2:]
    args = [*tiny, *shard_args(folder / "wds"), "--batched-augment", "off", "--split-bn", "0"]
    run_recipe_main("moco_cifar", args, folder / name / "a")
    run_recipe_main("moco_cifar", [*args, "--resume", str(
        folder / name / "a" / "checkpoints" / f"step_{K:08d}")], folder / name / "b")
