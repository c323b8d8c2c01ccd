"""MAE and SimMIM on two real gloo CPU processes (B images each, DDP) against one process with
2B images, in float64 (see dist_case_masked_image.py): per-rank losses average to the
one-process loss, gradients and parameters after three SGD steps agree. The same run with the
masks drawn per process (rank 0's rows of noise on both ranks) must differ."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_masked_image.py")
METHODS = ("mae", "simmim")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("masked_image"))


@pytest.mark.parametrize("name", METHODS)
def test_two_processes_equal_one_process(results, ranks_match_one_process, name):
    ranks_match_one_process([r[f"{name}_distributed"] for r in results], results[0][name])


@pytest.mark.parametrize("name", METHODS)
def test_masks_drawn_per_process_break_the_equality(results, gap, name):
    assert gap(results[0][f"{name}_mutated"], results[0][name]) > 1e-6
