"""Two CPU processes (gloo) through ``accelerate launch --multi_gpu --num_processes 2``.

On a machine without a GPU this starts 2 CPU processes (``--cpu --num_processes 2`` would
silently start ONE). The run trains, checkpoints, and its queue holds the keys of both
processes; with the same global batch it matches a 1-process run step for step: 2 processes
each normalising their half of the batch (plain BN) equal 1 process with split BN in 2 groups
(sample n -> group n % 2, the same interleaving as the engine's sharding), without shuffle BN.
The gathered keys then enter the queue in another order than in 1 process, so the queue is
compared key by key through the data-set index stored beside each key (--pass-indices).
BN running statistics differ by design (DDP keeps rank 0's; split BN averages its groups).
Both runs train in float64 (``--float64``): then they differ only by float64 rounding of sums
taken in other orders (see ``STEP_TOL``), and the comparison holds on any machine and thread
count. In float32 the same 8 steps needed rtol 1e-3, and the margin depended on the machine.
Both runs start from ``--init`` weights (issue 49: a run from ``--init`` under two processes
equals one process) with their own normalisation (``--init-mean/--init-std``), which the
per-image views of both processes take.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

BATCHED = Path(__file__).with_name("batched_dist_runs.py")  # its 2-process runs

STEPS = 8  # one epoch of 128 images at batch 16: every key in the queue has a distinct index
ARGS = ["--data", "shapes:n=128,n_test=32,size=16", "--max-steps", str(STEPS), "--epochs", "2",
        "--queue-size", "64", "--shuffle-bn", "false", "--pass-indices", "--knn-every", "1",
        "--knn-max-train", "64", "--save-every-steps", "4",
        # per-image augmentation: its random parameters depend on (seed, epoch, image) only
        # (the batched path: test_batched_views_do_not_depend_on_the_number_of_processes)
        "--batched-augment", "off", "--float64"]
# float64 rounding is 1.1e-16 per operation; a step chains ~1e4 operations per value (convs
# over 16 px, BN over 8 samples, the all-reduce), and 8 SGD steps at this lr amplify
# differences at most ~1e2: honest differences stay below ~1e-10 relative. rtol 1e-8 keeps a
# 100x margin above that and sits 1e5 below a real defect (a missing average, a wrong rank
# offset or BN group moves weights by > 1e-3 within a step or two).
STEP_TOL = dict(rtol=1e-8, atol=1e-10)


def _init_args(tmp_path, rx) -> list[str]:
    """``--init``: the recipe's backbone from another seed, with a normalisation of its own."""
    from safetensors.torch import save_file

    from contrastive.nn import create_encoder

    torch.manual_seed(11)
    net = create_encoder(rx.TINY[rx.TINY.index("--encoder") + 1])
    path = tmp_path / "init.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return ["--init", str(path), "--init-mean", "0.5", "0.5", "0.5", "--init-std", "0.25",
            "0.25", "0.25"]


def _losses(out):
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r]


@pytest.mark.distributed
def test_two_processes_train_checkpoint_and_match_one_process(tmp_path, rx, launch_two):
    two, one = tmp_path / "two", tmp_path / "one"
    init = _init_args(tmp_path, rx)
    proc = launch_two(*rx.recipe_cmd("moco_cifar", *ARGS, *init, "--split-bn", "0",
                                     "--output-dir", str(two))[1:])
    assert proc.stderr.count("training moco_cifar") == 1  # nothing logged by rank 1
    knn = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()
           if "knn_top1" in x]
    assert [r["knn_when"] for r in knn] == ["start", "epoch 1"]  # both processes encoded
    rx.run_recipe_here("moco_cifar", *ARGS, *init, "--split-bn", "2", "--output-dir", str(one))
    sha = hashlib.sha256(open(init[1], "rb").read()).hexdigest()
    for out in (two, one):
        resolved = json.loads((out / "config.json").read_text())["resolved"]["init"]
        assert resolved["sha256"] == sha and resolved["mean"] == [0.5] * 3

    assert_two_processes_match_one(two, one)


def assert_two_processes_match_one(two: Path, one: Path) -> None:
    """The 2-process MoCo run ``two`` (plain BN) against the 1-process ``one`` (split BN in 2
    groups), both of ``ARGS``: checkpoints of 2 processes loadable in any number, the queue
    holding the keys of both, then the same losses, weights and (matched) keys."""
    ckpts = sorted(p.name for p in (two / "checkpoints").iterdir())
    assert ckpts == ["step_00000004", "step_00000008"]
    meta = json.loads((two / "checkpoints" / "step_00000008" / "meta.json").read_text())
    assert meta["world_size"] == 2 and len(meta["fingerprints"]["rng"]) == 2
    a, b = assert_same_training(two, one)
    assert not any(k.startswith("module.") for k in a)  # loadable in any number of processes

    # the queue holds the keys of both processes: the indices of the last 4 global batches
    labels = a["queue.key_labels"]
    assert int(a["queue.ptr"]) == (STEPS * 16) % 64
    assert sorted(labels.tolist()) == sorted(b["queue.key_labels"].tolist())
    assert labels.unique().numel() == 64 and (labels >= 0).all()
    assert a["queue.queue"].dtype == torch.float64  # --float64 reached the model
    qa = a["queue.queue"][labels.argsort()]
    qb = b["queue.queue"][b["queue.key_labels"].argsort()]
    torch.testing.assert_close(qa, qb, **STEP_TOL)


def assert_same_training(two: Path, one: Path, steps: int = STEPS) -> tuple[dict, dict]:
    """Same logged losses and final weights (BN running statistics and the queue aside) in the
    float64 runs ``two`` and ``one`` of ``steps`` steps; their final models."""
    a = load_file(str(two / "checkpoints" / f"step_{steps:08d}" / "model.safetensors"))
    b = load_file(str(one / "checkpoints" / f"step_{steps:08d}" / "model.safetensors"))
    assert a.keys() == b.keys()
    # metrics.jsonl keeps 6 decimals: losses within 1e-10 may round 1e-6 apart (4.151594 /
    # 4.151595 once); the weights below carry the strict comparison
    assert _losses(two) == pytest.approx(_losses(one), rel=STEP_TOL["rtol"], abs=1.01e-6)
    assert len(_losses(two)) == steps
    for k in a:
        if "running_" in k or "num_batches_tracked" in k or k.startswith("queue."):
            continue
        torch.testing.assert_close(a[k], b[k], **STEP_TOL, msg=k)
    return a, b


@pytest.mark.distributed
def test_batched_views_do_not_depend_on_the_number_of_processes(two_process_runs):
    """Crops and colour drawn on the device (``--resident``, batched augmentation) for the whole
    global micro-batch, each process keeping its rows: 2 processes train as 1 does; a process
    that draws only its own rows (the old per-process rule) does not."""
    import runpy

    runs = runpy.run_path(str(BATCHED))
    folder = two_process_runs(BATCHED)  # in the session's one launch
    runs["run"](folder, "one")
    steps = runs["STEPS"]
    assert_same_training(folder / "two", folder / "one", steps)
    weights = [load_file(str(folder / name / "checkpoints" / f"step_{steps:08d}" /
                             "model.safetensors")) for name in ("one", "mutant")]
    gap = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0]
              if weights[0][k].is_floating_point() and not k.startswith("queue."))
    assert gap > 1e-6, f"the per-process draw trained like one process: {gap:.2e}"
