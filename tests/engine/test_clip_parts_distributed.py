"""Two gloo CPU processes clipping each part of the model apart (``Method.clip_parts``) against
one process with the whole batch, in float64 (see dist_case_clip_parts.py): the clipped
gradients of every step and the parameters after two SGD steps. The clip runs after DDP's
average, so every rank clips the same gradients; clipping each rank's own gradients before the
average must differ (the test can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_clip_parts.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("clip_parts"))


def test_two_processes_clip_each_part_as_one_process(results, close_f64):
    ref = results[0]["reference"]
    for run in (r["distributed"] for r in results):
        for step in range(len(ref["grads"])):
            for g, g_ref in zip(run["grads"][step], ref["grads"][step]):
                close_f64(g, g_ref)
        for p, p_ref in zip(run["params"], ref["params"]):
            close_f64(p, p_ref)


def test_clipping_before_the_average_differs(results):
    ref, bad = results[0]["reference"], results[0]["mutated"]
    gap = max(float((g - g_ref).abs().max())
              for g, g_ref in zip(bad["grads"][0], ref["grads"][0]))
    assert gap > 1e-3
