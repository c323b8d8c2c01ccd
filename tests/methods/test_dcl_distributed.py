"""DCL and DCLW on two real gloo CPU processes (B images each, DDP) against one process with 2B
images, in float64 (see dist_case_dcl.py): per-rank losses average to the one-process loss,
gradients and parameters after three SGD steps agree (DCLW's weights use the global batch).
The same run with a gather that keeps only the local rows' gradient must differ."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_dcl.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("dcl"))


@pytest.mark.parametrize("name", ["dcl", "dclw"])
def test_two_processes_equal_one_process(results, ranks_match_one_process, name):
    ref = results[0][name]
    runs = [r[f"{name}_distributed"] for r in results]
    ranks_match_one_process(runs, ref)


@pytest.mark.parametrize("name", ["dcl", "dclw"])
def test_a_gather_without_gradient_breaks_the_equality(results, gap, name):
    assert gap(results[0][f"{name}_mutated"], results[0][name]) > 1e-6
