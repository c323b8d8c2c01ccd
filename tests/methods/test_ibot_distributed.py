"""iBOT / DINOv2-style on two real gloo CPU processes (B images each, DDP) against one process
with 2B images, in float64 (see dist_case_ibot.py): per-rank losses average to the one-process
loss, gradients and parameters after three SGD steps agree, with KoLeo per process (DINOv2's
choice) in both. Sinkhorn-Knopp or the centres computed per process must differ."""

from __future__ import annotations

from pathlib import Path

import pytest

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
