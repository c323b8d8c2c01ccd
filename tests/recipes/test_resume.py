"""Resume exactness: a run stopped at step k (max-steps, or SIGTERM) and resumed reaches the same
parameters, momentum encoder, queue (keys and the data-set index of each key) and optimiser
state at step n as the uninterrupted run, on the CPU. Also checks that the resumed run's
metrics.jsonl has each step once."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

N = 40  # 64 images / batch 16 = 4 steps per epoch, 10 epochs: several epoch boundaries + kNN
ARGS = ["--epochs", "10", "--pass-indices", "--save-every-steps", "0"]


def _final_state(run_dir):
    ckpt = run_dir / "checkpoints" / f"step_{N:08d}"
    return load_file(str(ckpt / "model.safetensors")), torch.load(
        ckpt / "optimizer.bin", weights_only=True)


def _assert_same(a_dir, b_dir):
    (ma, oa), (mb, ob) = _final_state(a_dir), _final_state(b_dir)
    assert set(ma) == set(mb)
    for k in ma:
        assert torch.equal(ma[k], mb[k]), f"{k} differs after the resume"
    assert "queue.queue" in ma and "queue.key_labels" in ma and "queue.ptr" in ma
    for pid, state in oa["state"].items():
        for name, value in state.items():
            assert torch.equal(value, ob["state"][pid][name]), f"optimizer {pid}.{name}"


def _losses(run_dir):
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs if "loss" in r]
    assert steps == sorted(set(steps)), "a step was logged twice"
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, rx):
    out = tmp_path_factory.mktemp("ref") / "run"
    rx.run_recipe("moco_cifar", *ARGS, "--output-dir", str(out))
    return out


def test_stop_at_max_steps_then_resume_is_exact(reference, tmp_path, rx):
    out = tmp_path / "run"
    first = rx.run_recipe("moco_cifar", *ARGS, "--max-steps", "5", "--output-dir", str(out),
                          "--resume", "auto")
    assert "no checkpoint" in first.stderr and "starting a new run" in first.stderr
    # resume with other loader workers: views and order must not depend on them
    second = rx.run_recipe("moco_cifar", *ARGS, "--output-dir", str(out), "--resume", "auto",
                           "--num-workers", "2")
    assert "resume verified" in second.stderr and "at step 5 (epoch 1, micro-batch 1)" in \
        second.stderr
    _assert_same(reference, out)
    ref, got = _losses(reference), _losses(out)
    assert all(ref[s] == got[s] for s in range(6, N + 1))


def test_sigterm_saves_exits_cleanly_and_resume_is_exact(reference, tmp_path, rx):
    out = tmp_path / "run"
    proc = subprocess.Popen(rx.recipe_cmd("moco_cifar", *ARGS, "--output-dir", str(out)),
                            env=rx.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and '"loss"' in metrics.read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]  # stopped, resumable
    saved = sorted((out / "checkpoints").glob("step_*"))
    assert saved, err[-2000:]
    k = int(saved[-1].name.split("_")[1])
    assert 0 < k < N, f"the signal arrived after the run ended (step {k}): make the run longer"
    assert "received SIGTERM" in err and f"interrupted at step {k}" in err
    rx.run_recipe("moco_cifar", *ARGS, "--output-dir", str(out), "--resume", "auto")
    _assert_same(reference, out)
