"""VICRegL on two real gloo CPU processes (per-process batch B, DDP) against one process with
batch 2B, in float64 (see dist_case_vicregl.py): losses, gradients and parameters after three
SGD steps. Every term is a statistic of the gathered batch, so each rank's loss IS the
one-process loss. A gather that keeps only this process's gradient must differ: the test can
fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_vicregl.py")
TOL = dict(rtol=1e-9, atol=1e-12)  # float64: all-reduce and batch sums in other orders ~1e-15


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("vicregl"))


def _max_param_gap(run, ref):
    return max(float((p - q).abs().max()) for p, q in zip(run["params"], ref["params"]))


def test_two_processes_equal_one_process(results):
    ref = results[0]["reference"]
    assert ref["loss"][0].dtype == torch.float64
    for run in (r["distributed"] for r in results):
        for step in range(len(ref["loss"])):
            torch.testing.assert_close(run["loss"][step], ref["loss"][step], **TOL)
            for g, g_ref in zip(run["grads"][step], ref["grads"][step], strict=True):
                torch.testing.assert_close(g, g_ref, **TOL)
        assert _max_param_gap(run, ref) < 1e-10


def test_a_gather_without_the_other_processes_gradient_breaks_the_equality(results):
    assert _max_param_gap(results[0]["mutated"], results[0]["reference"]) > 1e-6
