"""LRC-BERT under DDP on two gloo CPU processes equals one process on the whole batch.

What it checks: the negatives are the global batch minus the sample itself (K = 2B - 1,
gathered from both processes, each padded to its own longest sentence: the "tokens"
representation pads to the longest of all processes); the two-pass step (gradient
perturbation) inside a DDP forward; stage 1 leaving the student head unused, then stage 2; the
same parameters on both ranks, equal to the one-process run (float64).

Mutation: negatives from the process's own batch only (no gather) must differ. A gather
WITHOUT gradient is not a mutation here: the negatives are the frozen teacher's features, so no
gradient flows through them either way (contrastive.methods.lrc_bert docstring).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("lrc_dist_case.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("lrc_dist"))


def test_two_processes_equal_one(results, close_f64) -> None:
    ref = results[0]["ref"]
    ddp = [r["ddp"] for r in results]
    assert ref[0]["loss"].dtype == torch.float64  # see close_f64()
    for s in range(2):
        assert ref[s]["stage"].item() == ddp[0][s]["stage"].item() == ddp[1][s]["stage"].item() == s + 1
        close_f64((ddp[0][s]["loss"] + ddp[1][s]["loss"]) / 2, ref[s]["loss"])
        assert set(ddp[0][s]["grads"]) == set(ref[s]["grads"])
        for name, g in ref[s]["grads"].items():
            close_f64(ddp[0][s]["grads"][name], g)  # DDP averaged = the whole-batch gradient
            close_f64(ddp[1][s]["grads"][name], g)
    assert not any(n.startswith("head.") for n in ref[0]["grads"])  # stage 1: head unused
    assert any(n.startswith("head.") for n in ref[1]["grads"])
    for name, v in ref[-1].items():
        close_f64(ddp[0][-1][name], v)
        close_f64(ddp[1][-1][name], v)


def test_local_negatives_differ(results) -> None:
    ref, local = results[0]["ref"], results[0]["local"]
    diff = max((local[0]["grads"][n] - g).abs().max().item()
               for n, g in ref[0]["grads"].items())
    assert diff > 1e-6
