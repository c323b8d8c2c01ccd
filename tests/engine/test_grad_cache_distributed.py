"""Two gloo CPU processes, each with B images through the gradient cache in chunks, against one
process with the whole batch of 2B and no cache, in float64 (see dist_case_grad_cache.py):
gradients of every step and the whole state after two SGD steps (EMA copies, MoCo's queue,
DINO's centre). Per-sample losses average over the ranks (the one-process loss is the ranks'
mean); SimCLR's gather keeps its gradient through the cache. Without the gradients' average
(DDP's hooks are off in a cached step) the run must differ: the test can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_grad_cache.py")
NAMES = ("simclr", "moco", "byol", "dino")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("grad_cache"))


@pytest.mark.parametrize("name", NAMES)
def test_two_processes_with_chunks_equal_one_process_with_the_whole_batch(results, name,
                                                                          close_f64):
    ref = results[0]["reference"][name]
    runs = [r["distributed"][name] for r in results]
    for step in range(len(ref["loss"])):
        close_f64((runs[0]["loss"][step] + runs[1]["loss"][step]) / 2, ref["loss"][step])
        for run in runs:
            for g, g_ref in zip(run["grads"][step], ref["grads"][step]):
                close_f64(g, g_ref)
    for run in runs:
        assert run["state"].keys() == ref["state"].keys()
        for k in ref["state"]:
            close_f64(run["state"][k], ref["state"][k])


@pytest.mark.parametrize("name", NAMES)
def test_without_the_gradient_average_the_ranks_differ(results, name):
    ref = results[0]["reference"][name]
    bad = results[0]["mutated"][name]
    gap = max(float((g - r).abs().max()) for g, r in zip(bad["grads"][0], ref["grads"][0]))
    assert gap > 1e-6
