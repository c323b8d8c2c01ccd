"""SigLIP on two real gloo CPU processes (B pairs each, DDP, the ring exchange of the loss)
against one process with 2B pairs, in float64 (see dist_case_siglip.py): per-rank losses average
to the one-process loss; gradients (t' and b included) and parameters after three SGD steps
agree. A ring that skips the peer must differ: the test can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_siglip.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("siglip"))


def _gap(run, ref):
    return max(float((p - q).abs().max()) for p, q in zip(run["params"], ref["params"]))


def test_two_processes_equal_one_process(results, close_f64):
    ref = results[0]["reference"]
    runs = [r["distributed"] for r in results]
    assert ref["loss"][0].dtype == torch.float64
    for step in range(len(ref["loss"])):
        close_f64((runs[0]["loss"][step] + runs[1]["loss"][step]) / 2, ref["loss"][step])
        for run in runs:
            for g, g_ref in zip(run["grads"][step], ref["grads"][step]):
                close_f64(g, g_ref)
    for run in runs:
        assert _gap(run, ref) < 1e-10


def test_a_ring_that_skips_the_peer_breaks_the_equality(results):
    assert _gap(results[0]["mutated"], results[0]["reference"]) > 1e-6
