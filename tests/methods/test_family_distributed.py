"""The two-view family, SwAV and DINO (multi-crop) on two real gloo CPU processes (per-process batch B, DDP) against one
process with batch 2B, in float64 (see dist_case_family.py): losses, gradients and parameters
after three SGD steps. Batch-level losses (Barlow Twins, VICReg) and SupCon compute the loss of
the whole gathered batch on every process, so each rank's loss IS the one-process loss;
per-sample losses (BYOL, SimSiam, NNCLR) average over the ranks. The same run with a planted bug
(a gather without gradient, a process-local NNCLR support set, SwAV's Sinkhorn or DINO's centre
over the local batch) must differ: the test can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_family.py")
GLOBAL_LOSS = {"barlow_twins", "vicreg", "supcon", "deep_infomax"}
TOL = dict(rtol=1e-9, atol=1e-12)  # float64: all-reduce and batch sums in other orders ~1e-15


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("family"))


def _max_param_gap(run, ref):
    return max(float((p - q).abs().max()) for p, q in zip(run["params"], ref["params"]))


@pytest.mark.parametrize("name", ["byol", "simsiam", "barlow_twins", "vicreg", "supcon", "nnclr",
                                  "swav", "dino", "deep_infomax"])
def test_two_processes_equal_one_process(results, name):
    ref = results[0]["reference"][name]
    runs = [r["distributed"][name] for r in results]
    assert ref["loss"][0].dtype == torch.float64
    for step in range(len(ref["loss"])):
        if name in GLOBAL_LOSS:
            for run in runs:
                torch.testing.assert_close(run["loss"][step], ref["loss"][step], **TOL)
        else:
            torch.testing.assert_close((runs[0]["loss"][step] + runs[1]["loss"][step]) / 2,
                                       ref["loss"][step], **TOL)
        for run in runs:
            for g, g_ref in zip(run["grads"][step], ref["grads"][step]):
                torch.testing.assert_close(g, g_ref, **TOL)
    for run in runs:
        assert _max_param_gap(run, ref) < 1e-10


@pytest.mark.parametrize("name", ["barlow_twins", "vicreg", "supcon", "nnclr", "swav", "dino",
                                  "deep_infomax"])
def test_a_planted_gather_bug_breaks_the_equality(results, name):
    ref = results[0]["reference"][name]
    assert _max_param_gap(results[0]["mutated"][name], ref) > 1e-6
