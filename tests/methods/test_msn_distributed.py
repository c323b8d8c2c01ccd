"""MSN / PMSN on two real gloo CPU processes (B images each, DDP) against one process with 2B
images, in float64 (see dist_case_msn.py): losses, gradients and parameters after three SGD
steps agree; the mean prediction of me-max / the power-law KL (and Sinkhorn-Knopp) taken per
process must differ, as the authors' AllReduce of the mean prediction says."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_msn.py")
NAMES = ["msn", "pmsn", "me_max"]


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("msn"))


@pytest.mark.parametrize("name", NAMES)
def test_two_processes_equal_one_process(results, ranks_match_one_process, name):
    ranks_match_one_process([r[f"{name}_distributed"] for r in results], results[0][name])


@pytest.mark.parametrize("name", NAMES)
def test_per_process_statistics_break_the_equality(results, gap, name):
    assert gap(results[0][f"{name}_mutated"], results[0][name]) > 1e-6
