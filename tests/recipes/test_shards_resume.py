"""Training from tar shards (``--data wds:DIR``) through a recipe: a mid-epoch resume reaches the
same parameters, queue and optimiser state as the uninterrupted run, bit for bit, with 1 process
(batched augmentation) and with 2 processes (``accelerate launch --multi_gpu``, per-image
augmentation) on UNEVEN shards (7 samples each: the shards do not split evenly between the
processes, the map-style sampler does). The resumed run starts from the uninterrupted run's
mid-epoch checkpoint (step 5: epoch 1, micro-batch 1) in a new folder."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from contrastive.data.make_shards import main as make_shards

N, K = 12, 5  # 64 images / batch 16 = 4 steps per epoch; the checkpoint at 5 is mid-epoch


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("wds")
    assert make_shards(["--data", "shapes:n=64,n_test=32,size=16", "--out", str(out),
                        "--max-count", "7"]) == 0
    return out


def _args(shards):
    return ["--data", f"wds:{shards}", "--epochs", "3", "--pass-indices", "--save-every-steps", str(K),
            "--keep-last", "5", "--knn-every", "0"]


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
def test_two_process_resume_from_uneven_shards_is_exact(shards, tmp_path, rx, launch_two):
    a, b = tmp_path / "a", tmp_path / "b"
    common = [*_args(shards), "--batched-augment", "off", "--split-bn", "0"]
    for out, extra in ((a, []), (b, ["--resume", str(a / "checkpoints" / f"step_{K:08d}")])):
        proc = launch_two(*rx.recipe_cmd("moco_cifar", *common, "--output-dir", str(out),
                                         *extra)[1:])
    assert "resume verified" in proc.stderr
    _assert_same_final(a, b)
