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

CASE = Path(__file__).with_name("dist_case.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("distill_dist"))




def test_two_processes_equal_one(results, close_f64) -> None:
    ref = results[0]["ref"]
    ddp = [r["ddp"] for r in results]
    assert ref[0]["loss"].dtype == torch.float64  # see close_f64()
    for s in range(2):
        assert ref[s]["stage"].item() == ddp[0][s]["stage"].item() == ddp[1][s]["stage"].item() == s + 1
        close_f64((ddp[0][s]["loss"] + ddp[1][s]["loss"]) / 2, ref[s]["loss"])
        assert set(ddp[0][s]["grads"]) == set(ref[s]["grads"])
        for name, g in ref[s]["grads"].items():
            close_f64(ddp[0][s]["grads"][name], g)  # DDP averaged = the whole-batch gradient
            close_f64(ddp[1][s]["grads"][name], g)
    assert not any(n.startswith("head.") for n in ref[0]["grads"])  # stage 1: head unused
    assert any(n.startswith("head.") for n in ref[1]["grads"])
    final_ref, final0, final1 = ref[-1], ddp[0][-1], ddp[1][-1]
    for name, v in final_ref.items():
        close_f64(final0[name], v)
        close_f64(final1[name], v)
