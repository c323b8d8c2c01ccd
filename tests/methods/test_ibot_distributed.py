"""iBOT / DINOv2-style on two real gloo CPU processes (B images each, DDP) against one process
with 2B images, in float64 (see dist_case_ibot.py): per-rank losses average to the one-process
loss, gradients and parameters after three SGD steps agree, with KoLeo per process (DINOv2's
choice) in both. Sinkhorn-Knopp or the centres computed per process must differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case_ibot.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("ibot"))


@pytest.mark.parametrize("name", ["ibot", "dinov2"])
def test_two_processes_equal_one_process(results, ranks_match_one_process, name):
    ranks_match_one_process([r[f"{name}_distributed"] for r in results], results[0][name])


@pytest.mark.parametrize("name", ["ibot", "dinov2"])
def test_per_process_statistics_break_the_equality(results, gap, name):
    assert gap(results[0][f"{name}_mutated"], results[0][name]) > 1e-6


def test_koleo_is_per_process(results, gap):
    """The reference's per-rank KoLeo is what two processes compute: KoLeo over the whole batch
    in one process (a gathered KoLeo) would not match."""
    assert gap(results[0]["dinov2_batch_koleo"], results[0]["dinov2"]) > 1e-6


def test_masked_patch_centre_is_the_mean_of_the_per_process_means(results, close_f64):
    """``patch_center_tokens="masked"`` on 2 processes, one step on uneven masks (rank 0's images
    ~60 % masked, rank 1's ~10 %): the centre is ``m c + (1 - m) (mean_0 + mean_1) / 2`` with
    mean_r the mean of rank r's masked teacher rows (DINOv2's ``reduce_center_update``), on both
    ranks; one process over the same images takes the mean over all the masked rows instead,
    and the two differ."""
    ranks = [r["masked_centre_distributed"] for r in results]
    one = results[0]["masked_centre"]
    m, c0 = one["momentum"], one["before"]
    assert [len(r["rows"]) for r in ranks] != [len(ranks[0]["rows"])] * 2  # uneven
    per_process = torch.stack([r["rows"].mean(0) for r in ranks]).mean(0)
    for r in ranks:
        close_f64(r["before"], c0)
        close_f64(r["after"], m * c0 + (1 - m) * per_process)
    # the one-process run scores the same masked rows (both ranks', in another order)
    assert len(one["rows"]) == sum(len(r["rows"]) for r in ranks)
    close_f64(one["rows"].sum(0), sum(r["rows"].sum(0) for r in ranks))
    close_f64(one["after"], m * c0 + (1 - m) * one["rows"].mean(0))
    assert (ranks[0]["after"] - one["after"]).abs().max() > 1e-6
