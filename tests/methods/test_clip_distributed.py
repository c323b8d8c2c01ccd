"""CLIP on two real gloo CPU processes (B pairs each, DDP) against one process with 2B pairs, in
float64 (see dist_case_clip.py): per-rank losses average to the one-process loss, gradients
and parameters after three AdamW steps agree. The same run with a gather that keeps only the
local rows' gradient must differ: the test can fail."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_clip.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("clip"))


def test_two_processes_equal_one_process(results, ranks_match_one_process):
    ref = results[0]["reference"]
    runs = [r["distributed"] for r in results]
    assert float(ref["scale"][0]) == pytest.approx(math.log(100.0))  # clamped at the first step
    ranks_match_one_process(runs, ref)


def test_a_gather_without_gradient_breaks_the_equality(results, gap):
    ref = results[0]["reference"]
    assert gap(results[0]["mutated"], ref) > 1e-6
