"""The step's per-run pieces against the plain computations they replace: the direct torch
calls of :class:`Updater` against accelerate's wrappers (bit for bit, with and without
accumulation), the non-finite guard's first bad step, the metrics window's vector sums."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from contrastive.engine.run_log import ScalarWindow
from contrastive.engine.step import (
    NonFiniteGuard,
    NonFiniteLossError,
    Updater,
    direct_calls_equivalent,
    optimisation_step,
)


class _Toy(nn.Module):
    """A regression with dropout (the step's random stream matters) and a frozen parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, batch: dict) -> dict:
        err = self.net(batch["x"]).squeeze(1) - batch["y"]
        loss = (err ** 2).mean() * 4  # gradient norms about 1: the clip acts on some steps
        return {"loss": loss, "abs_err": err.abs().mean().detach(), "embeddings": err[:, None]}


def _run(accum: int, direct: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], dict, int]:
    """Six micro-batches through the step; (weights before, after, window means, acc.step)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=accum)
    torch.manual_seed(0)
    model = acc.prepare(_Toy())
    before = [p.detach().clone() for p in model.parameters()]
    opt = acc.prepare(torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                      lr=0.05, momentum=0.9))  # SGD: the loss scale matters
    up = Updater(model, opt, acc)
    assert up.direct  # one process, fp32, a prepared torch optimiser
    up.direct = direct
    up._inner = opt.optimizer if direct else opt
    cfg = SimpleNamespace(on_nonfinite="stop", clip_grad_norm=1.0)
    guard, window = NonFiniteGuard(acc.device), ScalarWindow()
    g = torch.Generator().manual_seed(1)
    for micro in range(6):
        batch = {"x": torch.randn(8, 6, generator=g), "y": torch.randn(8, generator=g)}
        optimisation_step(model, batch, opt, acc, cfg, micro // accum, guard, window,
                          updater=up)
    return before, [p.detach().clone() for p in model.parameters()], window.means(acc), acc.step


@pytest.mark.parametrize("accum", [1, 2])
def test_direct_calls_equal_accelerates_wrappers_bit_for_bit(accum):
    before, direct, means_d, step_d = _run(accum, direct=True)
    _, wrapped, means_w, step_w = _run(accum, direct=False)
    assert all(torch.equal(a, b) for a, b in zip(direct, wrapped))
    assert means_d == means_w and step_d == step_w == 6  # accumulate still counts micro-batches
    assert torch.equal(before[0], direct[0])  # the frozen parameter (its own come first)
    assert not any(torch.equal(a, b) for a, b in zip(before[1:], direct[1:]))  # it trained


def test_direct_calls_only_where_the_wrappers_add_nothing():
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils import DistributedType

    params = list(nn.Linear(2, 2).parameters())
    inner = torch.optim.SGD(params, lr=0.1)
    prepared = AcceleratedOptimizer(inner, device_placement=False)

    def acc(kind=DistributedType.NO, scaler=None):
        return SimpleNamespace(distributed_type=kind, scaler=scaler)

    assert direct_calls_equivalent(acc(), prepared, params)
    assert direct_calls_equivalent(acc(DistributedType.MULTI_CPU), prepared, params)
    assert not direct_calls_equivalent(acc(scaler=object()), prepared, params)  # fp16 scaling
    for kind in (DistributedType.DEEPSPEED, DistributedType.FSDP, DistributedType.XLA):
        assert not direct_calls_equivalent(acc(kind), prepared, params)
    assert not direct_calls_equivalent(acc(), inner, params)  # not prepared


def test_guard_names_the_first_bad_step_across_chunks_and_forgets_after_a_check(tmp_path):
    acc = SimpleNamespace(num_processes=1)
    guard = NonFiniteGuard(torch.device("cpu"))
    n = NonFiniteGuard.CHUNK + 7
    for step in range(n):  # bad at CHUNK + 3 and after: the first one is named
        guard.note(torch.isfinite(torch.tensor(math.nan if step >= n - 4 else 1.0)), step)
    with pytest.raises(NonFiniteLossError, match=f"at step {n - 4}\\. The last good checkpoint "
                       "is step 5"):
        guard.check(acc, 5, tmp_path)
    guard.check(acc, 5, tmp_path)  # forgotten: nothing noted since
    for step in range(3):
        guard.note(torch.isfinite(torch.tensor([1.0, math.inf][step == 1])), step)
    assert guard.first_bad_step() == 1 and guard.first_bad_step() == -1


def _reference_means(outs: list[dict]) -> dict[str, float]:
    """The per-name float32 running sums, divided by each name's count."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    for out in outs:
        for k, v in out.items():
            if isinstance(v, torch.Tensor) and v.ndim == 0:
                v = v.detach().float()
                sums[k] = sums[k] + v if k in sums else v
                counts[k] = counts.get(k, 0) + 1
    return {k: (sums[k] / counts[k]).item() for k in sorted(sums)}


def test_window_vector_sums_are_the_per_name_sums_bit_for_bit():
    g = torch.Generator().manual_seed(0)

    def out(names=("loss", "acc", "n")) -> dict:
        o = {"loss": torch.randn((), generator=g).requires_grad_(),
             "acc": torch.rand((), generator=g).to(torch.bfloat16),
             "n": torch.randint(0, 10 ** 6, (), generator=g), "embeddings": torch.randn(4, 3)}
        return {k: o[k] for k in (*names, "embeddings")}

    acc = SimpleNamespace(num_processes=1)
    same = [out() for _ in range(9)]  # the usual case: the vector path throughout
    changed = [out(), out(), out(("loss", "acc")), out(("n", "loss", "acc")), out()]
    for outs in (same, changed, [changed[2], *changed]):
        window = ScalarWindow()
        for o in outs:
            window.add(o)
        got = window.means(acc)
        want = _reference_means(outs)
        assert list(got) == list(want) and all(got[k] == want[k] for k in want)  # exact
        assert window.last is outs[-1] and window.means(acc) == {}  # a new window
