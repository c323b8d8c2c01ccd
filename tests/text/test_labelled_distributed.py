"""Teacher fine-tuning, LRC-BERT and its pre-training distillation in 2 processes (``accelerate launch --multi_gpu
--num_processes 2``, gloo on the CPU) equal 1 process with the same global batch, through the
recipes (tests/text/labelled_dist_runs.py runs the three, in the session's one launch of
tests/launch_worker.py), in float64 with dropout off.

Each comparison can fail: the mutant runs plant fine-tuning's loss summed per process
instead of averaged over the global batch, and LRC-BERT's negatives from the process's own batch
only; both move the weights by far more than float64 rounding. (A gather of LRC-BERT's
negatives WITHOUT gradient is no mutation: they are the frozen teacher's features,
contrastive.methods.lrc_bert.) The method-level worker (tests/text/lrc_dist_case.py) checks
the gradients of LRC-BERT step by step; this test checks the whole path (adapter, sampler,
DDP, optimiser, schedules).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

pytestmark = pytest.mark.distributed

RUNS = Path(__file__).with_name("labelled_dist_runs.py")  # the runs, their settings, the bugs


def _weights(out: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / name / "checkpoints" / "step_00000003" / "model.safetensors"))


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(two_process_runs) -> Path:
    folder = two_process_runs(RUNS)  # 2 processes, and 2 with the bugs: the session's launch
    two_process_runs.module(RUNS).run(folder, "one")  # 1 process, in this one
    return folder


@pytest.mark.parametrize("name", ["finetune", "lrc", "pretrain"])
def test_two_processes_equal_one_and_the_mutant_differs(runs: Path, name: str) -> None:
    one, two, mutant = (_weights(runs / d, name) for d in ("one", "two", "mutant"))
    assert next(iter(one.values())).dtype == torch.float64
    # float64: only rounding of sums taken in another order (~1e-15 here); a wrong gather,
    # rank offset or gradient average moves the weights by > 1e-4 in 3 steps
    assert _gap(one, two) < 1e-9
    assert _gap(one, mutant) > 1e-5
    print(f"{name}: 2 vs 1 process max |weight difference| {_gap(one, two):.2e}; "
          f"mutant {_gap(one, mutant):.2e}")
