"""SigLIP on two real gloo CPU processes (B pairs each, DDP, the ring exchange of the loss)
against one process with 2B pairs, in float64 (see dist_case_siglip.py): per-rank losses average
to the one-process loss; gradients (t' and b included) and parameters after three SGD steps
agree. A ring that skips the peer must differ: the test can fail."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_siglip.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("siglip"))


def test_two_processes_equal_one_process(results, ranks_match_one_process):
    ref = results[0]["reference"]
    runs = [r["distributed"] for r in results]
    ranks_match_one_process(runs, ref)


def test_a_ring_that_skips_the_peer_breaks_the_equality(results, gap):
    assert gap(results[0]["mutated"], results[0]["reference"]) > 1e-6
