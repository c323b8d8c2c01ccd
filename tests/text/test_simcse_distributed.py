"""SimCSE in two real gloo CPU processes (per-process batch B, DDP) against one process with 2B.

The keys (positives and hard negatives) are gathered with gradient, so the loss (mean of the two
processes' losses), every gradient and the parameters after two SGD steps equal the one-process
ones up to float64 rounding (``close_f64``). The mutation ``sup_nograd`` (keys gathered without
gradient) gives other gradients: the comparison detects the classic multi-GPU bug.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("simcse_dist_case.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("simcse_dist"))


@pytest.mark.parametrize("name", ["sup", "pair", "unsup"])
def test_two_processes_equal_one_process(results, name, close_f64):
    ref = results[0]["reference"][name]
    per_rank = [r["distributed"][name] for r in results]
    assert ref["loss"][0].dtype == torch.float64
    for step in range(len(ref["loss"])):
        close_f64((per_rank[0]["loss"][step] + per_rank[1]["loss"][step]) / 2, ref["loss"][step])
        close_f64((per_rank[0]["pos_acc"][step] + per_rank[1]["pos_acc"][step]) / 2,
                  ref["pos_acc"][step])
        for rank in range(2):
            assert len(per_rank[rank]["grads"][step]) == len(ref["grads"][step])
            for g, g_ref in zip(per_rank[rank]["grads"][step], ref["grads"][step]):
                close_f64(g, g_ref)
    for rank in range(2):
        for p, p_ref in zip(per_rank[rank]["params"], ref["params"]):
            close_f64(p, p_ref)


def test_negatives_without_gradient_are_detected(results):
    """Mutation: gathering the keys without gradient changes the gradients by far more than
    float64 rounding, so the equality above would fail on that code."""
    ref = results[0]["reference"]["sup"]["grads"][0]
    bad = results[0]["distributed"]["sup_nograd"]["grads"][0]
    worst = max(float((g - r).abs().max() / r.abs().max().clamp(min=1e-30))
                for g, r in zip(bad, ref))
    assert worst > 1e-3
