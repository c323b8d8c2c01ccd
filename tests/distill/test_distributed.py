"""The Distiller under DDP on two gloo CPU processes equals one process on the whole batch.

What it checks: the two-pass step (gradient perturbation) inside a DDP forward; in-batch
negatives gathered from both processes (K = 2B - 1, as in one process); the stage-1 step that
leaves the student head out of the graph (``find_unused_parameters=True``), then stage 2 with
KD + CE; the same parameters on both ranks afterwards, and equal to the one-process run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distill_dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), "2", str(tmp / "store"),
                               str(tmp)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("distributed worker timed out")
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r][-4000:]}"
    return [torch.load(tmp / f"rank{r}.pt") for r in range(2)]


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_two_processes_equal_one(results) -> None:
    ref = results[0]["ref"]
    ddp = [r["ddp"] for r in results]
    for s in range(2):
        assert ref[s]["stage"].item() == ddp[0][s]["stage"].item() == ddp[1][s]["stage"].item() == s + 1
        close((ddp[0][s]["loss"] + ddp[1][s]["loss"]) / 2, ref[s]["loss"])
        assert set(ddp[0][s]["grads"]) == set(ref[s]["grads"])
        for name, g in ref[s]["grads"].items():
            close(ddp[0][s]["grads"][name], g)  # DDP averaged = the whole-batch gradient
            close(ddp[1][s]["grads"][name], g)
    assert not any(n.startswith("head.") for n in ref[0]["grads"])  # stage 1: head unused
    assert any(n.startswith("head.") for n in ref[1]["grads"])
    final_ref, final0, final1 = ref[-1], ddp[0][-1], ddp[1][-1]
    for name, v in final_ref.items():
        close(final0[name], v)
        close(final1[name], v)
