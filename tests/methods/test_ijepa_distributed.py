"""I-JEPA on two real gloo CPU processes (B images each, DDP) against one process with 2B
images, in float64 (see dist_case_ijepa.py): per-rank losses average to the one-process loss,
gradients and parameters (the target encoder's too) after three SGD steps agree. The same run
with the masks of rank 0's images on both ranks must differ."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_ijepa.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("ijepa"))


def test_two_processes_equal_one_process(results, ranks_match_one_process):
    ranks_match_one_process([r["ijepa_distributed"] for r in results], results[0]["ijepa"])


def test_masks_of_other_images_break_the_equality(results, gap):
    assert gap(results[0]["ijepa_mutated"], results[0]["ijepa"]) > 1e-6
