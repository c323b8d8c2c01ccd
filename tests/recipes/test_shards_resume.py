"""Training from tar shards (``--data wds:DIR``) through a recipe: a mid-epoch resume reaches the
same parameters, queue and optimiser state as the uninterrupted run, bit for bit, with 1 process
(batched augmentation) and with 2 processes (``accelerate launch --multi_gpu``, per-image
augmentation) on UNEVEN shards (7 samples each: the shards do not split evenly between the
processes, the map-style sampler does; tests/recipes/shards_dist_runs.py, in the session's one
launch of tests/launch_worker.py). The resumed run starts from the uninterrupted run's
mid-epoch checkpoint (step 5: epoch 1, micro-batch 1) in a new folder."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

RUNS = Path(__file__).with_name("shards_dist_runs.py")  # the 2-process runs (and N, K, flags)
SHARDS = runpy.run_path(str(RUNS))
N, K, _args = SHARDS["N"], SHARDS["K"], SHARDS["shard_args"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    SHARDS["prepare"](out)
    return out / "wds"


def _assert_same_final(a_dir, b_dir):
    ca, cb = a_dir / "checkpoints" / f"step_{N:08d}", b_dir / "checkpoints" / f"step_{N:08d}"
    ma, mb = load_file(str(ca / "model.safetensors")), load_file(str(cb / "model.safetensors"))
    assert set(ma) == set(mb) and "queue.queue" in ma
    for k in ma:
        assert torch.equal(ma[k], mb[k]), f"{k} differs after the resume"
    oa = torch.load(ca / "optimizer.bin", weights_only=True)
    ob = torch.load(cb / "optimizer.bin", weights_only=True)
    for pid, state in oa["state"].items():
        for name, value in state.items():
            assert torch.equal(value, ob["state"][pid][name]), f"optimizer {pid}.{name}"


def test_one_process_resume_from_shards_is_exact(shards, tmp_path, rx):
    a, b = tmp_path / "a", tmp_path / "b"
    rx.run_recipe("moco_cifar", *_args(shards), "--output-dir", str(a))
    resumed = rx.run_recipe("moco_cifar", *_args(shards), "--output-dir", str(b), "--resume",
                            str(a / "checkpoints" / f"step_{K:08d}"), "--num-workers", "2")
    assert "resume verified" in resumed.stderr and "epoch 1, micro-batch 1" in resumed.stderr
    _assert_same_final(a, b)


@pytest.mark.distributed
def test_two_process_resume_from_uneven_shards_is_exact(two_process_runs):
    folder = two_process_runs(RUNS) / "two"  # in the session's one launch
    _assert_same_final(folder / "a", folder / "b")
    steps = [r["step"] for r in map(json.loads, (folder / "b" / "metrics.jsonl").read_text()
                                    .splitlines()) if "loss" in r]
    assert steps == list(range(K + 1, N + 1))  # b resumed at K (a run from scratch logs 1..N)
