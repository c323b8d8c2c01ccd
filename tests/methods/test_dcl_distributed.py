"""DCL and DCLW on two real gloo CPU processes (B images each, DDP) against one process with 2B
images, in float64 (see dist_case_dcl.py): per-rank losses average to the one-process loss,
gradients and parameters after three SGD steps agree (DCLW's weights use the global batch).
The same run with a gather that keeps only the local rows' gradient must differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_dcl.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("dcl"))


def _gap(run, ref):
    return max(float((p - q).abs().max()) for p, q in zip(run["params"], ref["params"]))


@pytest.mark.parametrize("name", ["dcl", "dclw"])
def test_two_processes_equal_one_process(results, close_f64, name):
    ref = results[0][name]
    runs = [r[f"{name}_distributed"] for r in results]
    assert ref["loss"][0].dtype == torch.float64
    for step in range(len(ref["loss"])):
        close_f64((runs[0]["loss"][step] + runs[1]["loss"][step]) / 2, ref["loss"][step])
        for run in runs:
            for g, g_ref in zip(run["grads"][step], ref["grads"][step]):
                close_f64(g, g_ref)
    for run in runs:
        assert _gap(run, ref) < 1e-10


@pytest.mark.parametrize("name", ["dcl", "dclw"])
def test_a_gather_without_gradient_breaks_the_equality(results, name):
    assert _gap(results[0][f"{name}_mutated"], results[0][name]) > 1e-6
