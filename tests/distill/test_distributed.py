"""The Distiller under DDP on two gloo CPU processes equals one process on the whole batch.

What it checks: the two-pass step (gradient perturbation) inside a DDP forward; in-batch
negatives gathered from both processes (K = 2B - 1, as in one process); the stage-1 step that
leaves the student head out of the graph (``find_unused_parameters=True``), then stage 2 with
KD + CE; the same parameters on both ranks afterwards, and equal to the one-process run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(WORKER, tmp_path_factory.mktemp("distill_dist"))


def close(a, b):
    """Equal up to float64 rounding. The workers train in float64: the all-reduce and the batch
    sums add in other orders (1.1e-16 relative per operation, ~1e3 operations, two SGD steps),
    so honest differences stay below ~1e-12; a gather without gradient, a rank offset or a
    missing average changes values by > 1e-3. In float32 the same comparison needed 1e-4 and
    depended on the machine."""
    if torch.is_tensor(a) and a.is_floating_point() and a.dtype != torch.float64:
        torch.testing.assert_close(a, b)  # metrics kept in float32 (e.g. pos_acc, a percentage)
        return
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_two_processes_equal_one(results) -> None:
    ref = results[0]["ref"]
    ddp = [r["ddp"] for r in results]
    assert ref[0]["loss"].dtype == torch.float64  # see close()
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
