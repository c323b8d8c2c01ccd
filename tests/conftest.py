"""Shared fixtures: paths, the shared data folder, determinism."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder beside the project; skip when a user has only the project."""
    if not (SHARED_DATA / "cifar10-jpeg.tar").exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (only needed for integration tests)")
    return SHARED_DATA


def _close_f64(a, b) -> None:
    """Equal up to float64 rounding. The two-process workers train in float64: the all-reduce and
    the batch sums add in other orders (1.1e-16 relative per operation, ~1e3 operations, a few
    SGD steps), so honest differences stay below ~1e-12; a gather without gradient, a rank
    offset or a missing average changes values by > 1e-3. In float32 the same comparison needed
    1e-4 and depended on the machine. Metrics kept in float32 (a percentage) compare at
    float32's default tolerance."""
    if torch.is_tensor(a) and a.is_floating_point() and a.dtype != torch.float64:
        torch.testing.assert_close(a, b)
        return
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="session")
def close_f64() -> Callable[..., None]:
    """``close_f64(a, b)``: the two-process tests' float64 comparison (see ``_close_f64``)."""
    return _close_f64


WORKER = ROOT / "tests" / "dist_worker.py"


def _run_two_ranks(case: Path, tmp: Path, timeout: float = 240.0) -> list[dict]:
    """Start the one worker (``tests/dist_worker.py``) on ``case`` as two gloo CPU processes;
    return what each rank saved to ``tmp/rank{r}.pt``: rank 0 holds the case's one-process
    ``reference`` too. A failing or hanging rank fails the test with its log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(case), str(rank), "2",
                               str(tmp / "store"), str(tmp)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"distributed case {case.name} timed out after {timeout:.0f} s")
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"
    results = [torch.load(tmp / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    assert [r["group_size"] for r in results] == [2, 2], "the ranks did not form one group of 2"
    return results


@pytest.fixture(scope="session")
def run_two_ranks() -> Callable[..., list[dict]]:
    """The launcher of the two-process (gloo, CPU) equivalence tests."""
    return _run_two_ranks


def param_gap(run: dict, ref: dict) -> float:
    """The largest parameter difference between two recorded runs (``run["params"]``)."""
    return max(float((p - q).abs().max()) for p, q in zip(run["params"], ref["params"]))


def _ranks_match_one_process(runs: list[dict], ref: dict) -> None:
    """Two ranks' records against the one-process ``ref`` in float64: each step's rank losses
    average to the reference loss, every rank's gradients equal it, and so do the parameters
    after the last step (records ``loss``, ``grads``, ``params`` per step)."""
    assert ref["loss"][0].dtype == torch.float64
    for step in range(len(ref["loss"])):
        _close_f64((runs[0]["loss"][step] + runs[1]["loss"][step]) / 2, ref["loss"][step])
        for run in runs:
            for g, g_ref in zip(run["grads"][step], ref["grads"][step]):
                _close_f64(g, g_ref)
    for run in runs:
        assert param_gap(run, ref) < 1e-10


@pytest.fixture(scope="session")
def ranks_match_one_process() -> Callable[[list[dict], dict], None]:
    """``check(runs, ref)``: the two-process equivalence of the float64 method cases."""
    return _ranks_match_one_process


@pytest.fixture(scope="session")
def gap() -> Callable[[dict, dict], float]:
    """``gap(run, ref)``: :func:`param_gap` (what a mutated run must exceed)."""
    return param_gap


@pytest.fixture
def fresh_accelerate():
    """Reset accelerate's process-wide state around an in-process training run."""
    from contrastive.engine import reset_accelerate_state

    reset_accelerate_state()
    yield
    reset_accelerate_state()
