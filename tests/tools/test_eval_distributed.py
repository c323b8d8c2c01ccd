"""The evaluation tools under ``accelerate launch`` with 2 CPU processes (gloo; the session's
one launch of tests/launch_worker.py, the runs in tests/tools/eval_dist_runs.py).

Each process encodes its shard of the data; ``gather_for_metrics`` must return every sample
exactly once (the last uneven batch is padded by the sampler and trimmed again), so the results
equal the one-process ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("contrastive.data")

RUNS = Path(__file__).with_name("eval_dist_runs.py")


@pytest.mark.distributed
def test_two_processes_give_the_one_process_results(two_process_runs):
    folder = two_process_runs(RUNS)
    two_process_runs.module(RUNS).run(folder, "one")  # one process, in this one
    one, two = (json.loads((folder / f"{name}.json").read_text()) for name in ("one", "two"))
    assert (two["num_train"], two["num_test"]) == (39, 15) == (one["num_train"], one["num_test"])
    assert two["top1"] == pytest.approx(one["top1"]) and two["top5"] == pytest.approx(one["top5"])
