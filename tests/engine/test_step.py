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

    from contrastive.engine import reset_accelerate_state

    reset_accelerate_state()
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


# ---- clipping parts (Method.clip_parts: DINOv2 clips its backbone and heads apart) -------------

class _Parts(nn.Module):
    """Three parameters: ``a`` and ``b`` declared as parts, ``c`` in none (the rest)."""

    def __init__(self, declare: bool = True) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.b = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.c = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.frozen = nn.Parameter(torch.zeros(2, dtype=torch.float64), requires_grad=False)
        self.declare = declare

    def clip_parts(self) -> dict:
        return {"a": [self.a], "b": [self.b, self.frozen]} if self.declare else {}

    def forward(self, batch: dict) -> dict:
        w = batch["w"]  # the gradients: d loss / d param = w[i]
        return {"loss": (w[0] * self.a).sum() + (w[1] * self.b).sum() + (w[2] * self.c).sum()}


#: gradient norms 5 (a), 1 (b), 10 (c): with max norm 2, a and c are clipped, b is not
_GRADS = torch.tensor([[3.0, 4.0], [0.6, 0.8], [6.0, 8.0]], dtype=torch.float64)


def _accelerator(accum: int = 1, precision: str = "no"):
    from accelerate import Accelerator

    from contrastive.engine import reset_accelerate_state

    reset_accelerate_state()
    return Accelerator(cpu=True, gradient_accumulation_steps=accum, mixed_precision=precision)


def _clipped_grads(model: nn.Module, direct: bool = True, accum: int = 1) -> list[torch.Tensor]:
    """The gradients after one optimiser step's clip (to 2.0) through the step, with the
    optimiser step itself a no-op (lr 0), over ``accum`` micro-batches of _GRADS / ... each."""
    acc = _accelerator(accum)
    model = acc.prepare(model)
    opt = acc.prepare(torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0))
    up = Updater(model, opt, acc)
    up.direct, up._inner = direct, (opt.optimizer if direct else opt)
    grads: list[torch.Tensor] = []
    up.zero_grad = lambda: grads.extend(  # type: ignore[method-assign]
        p.grad.clone() for p in (model.a, model.b, model.c) if acc.sync_gradients)
    cfg = SimpleNamespace(on_nonfinite="stop", clip_grad_norm=2.0)
    for _ in range(accum):  # each micro-batch's loss is divided by accum: the sum is _GRADS
        optimisation_step(model, {"w": _GRADS}, opt, acc, cfg, 0, NonFiniteGuard(acc.device),
                          ScalarWindow(), updater=up)
    return grads


def _formula(parts: list[list[int]]) -> list[torch.Tensor]:
    """torch's clip_grad_norm_ written out: each part's gradients times min(1, 2 / (|g| +
    1e-6)), |g| the norm of the part's gradients together."""
    out = [g.clone() for g in _GRADS]
    for part in parts:
        norm = torch.cat([_GRADS[i] for i in part]).norm()
        for i in part:
            out[i] = _GRADS[i] * min(1.0, 2.0 / (float(norm) + 1e-6))
    return out


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("accum", [1, 2])
def test_each_clip_part_is_clipped_to_the_formula(direct, accum):
    """Parts a and b and the rest c: each clipped apart by its own norm (a x 2/5, b unclipped at
    norm 1, c x 2/10), through the torch calls and accelerate's path, with and without
    accumulation (the clip sees the summed gradients once); the frozen parameter of part b
    (no gradient) is left out. All together would clip all three by 2 / sqrt(126)."""
    got = _clipped_grads(_Parts(), direct, accum)
    want = _formula([[0], [1], [2]])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-15, atol=0)
    assert float(got[1].norm()) == pytest.approx(1.0) and float(got[0].norm()) < 2.0 + 1e-9
    together = _formula([[0, 1, 2]])
    assert not torch.allclose(got[0], together[0])


@pytest.mark.parametrize("direct", [True, False])
def test_without_parts_the_clip_is_torchs_over_all_parameters_bit_for_bit(direct):
    """The default (a model without clip_parts, or one that declares none) is the clip of
    before: torch's clip_grad_norm_ of every parameter together, bit for bit."""
    got = _clipped_grads(_Parts(declare=False), direct)
    ref = [nn.Parameter(g.clone()) for g in _GRADS]
    for p, g in zip(ref, _GRADS):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(ref, 2.0)
    assert all(torch.equal(a, p.grad) for a, p in zip(got, ref))
    plain = Updater(nn.Linear(2, 2), SimpleNamespace(), SimpleNamespace(
        gradient_accumulation_steps=1, distributed_type="other"))
    assert plain.clip_lists is None  # no clip_parts at all: the same path


def test_clip_parts_with_an_fp16_scaler_unscale_once_then_clip_each_part():
    """accelerate's fp16 path: the scaled gradients are unscaled once (the scaler refuses a
    second unscale_ before update()), then each part is clipped: the same gradients as without
    scaling (the scale is a power of 2: exact). On the CPU accelerate makes no scaler: one is
    set by hand where its fp16 path reads it."""
    acc = _accelerator(precision="fp16")
    model = acc.prepare(_Parts())
    opt = acc.prepare(torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    acc.scaler, acc.native_amp, opt.scaler = scaler, True, scaler
    up = Updater(model, opt, acc)
    assert not up.direct and up.clip_lists is not None
    scaler.scale(model({"w": _GRADS})["loss"]).backward()
    assert torch.equal(model.a.grad, _GRADS[0] * 2.0 ** 10)
    up.clip(2.0)
    want = _formula([[0], [1], [2]])
    for p, w in zip((model.a, model.b, model.c), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-15, atol=0)
    with pytest.raises(RuntimeError, match="unscale_"):  # what a second unscale would meet
        scaler.unscale_(opt.optimizer)


def test_clip_parts_refused_where_accelerate_clips_the_whole_model():
    from accelerate.utils import DistributedType

    from contrastive.engine.step import ClipPartsError, clip_groups

    model = _Parts()
    for kind in (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.XLA):
        acc = SimpleNamespace(distributed_type=kind, gradient_accumulation_steps=1, scaler=None)
        with pytest.raises(ClipPartsError, match="clips its parts \\['a', 'b'\\] apart"):
            Updater(model, SimpleNamespace(), acc)
        Updater(_Parts(declare=False), SimpleNamespace(), acc)  # no parts: accelerate's clip
        # no clipping at all (--clip-grad-norm 0): the parts are not read, nothing refused
        assert Updater(model, SimpleNamespace(), acc, clips=False).clip_lists is None
    with pytest.raises(ClipPartsError, match="two clipping parts: 'a' and 'b'"):
        clip_groups(list(model.parameters()), {"a": [model.a], "b": [model.a]})
    groups = clip_groups(list(model.parameters()), model.clip_parts())
    assert [[id(p) for p in g] for g in groups] == [[id(model.a)], [id(model.b)], [id(model.c)]]


def _spread_grads(shapes: list[tuple[int, ...]], dtype: torch.dtype, none: tuple[int, ...] = (),
                  first_dtype: torch.dtype | None = None) -> list[nn.Parameter]:
    """Parameters with random gradients whose norms spread over 0.01 - 100 (so that a max norm
    of 2 clips some parts and not others); those at ``none`` without a gradient; the first of
    ``first_dtype`` if given."""
    g = torch.Generator().manual_seed(5)
    params = []
    for i, shape in enumerate(shapes):
        p = nn.Parameter(torch.zeros(shape, dtype=first_dtype if i == 0 and first_dtype
                                     else dtype))
        grad = torch.randn(shape, generator=g, dtype=torch.float64)
        p.grad = None if i in none else (grad / grad.norm() * 10 ** (-2 + 4 * ((i * 7) % 11) / 10)
                                          ).to(p.dtype)
        params.append(p)
    return params


SHAPES = [(3,), (5, 4), (7,), (2, 3, 4), (1,), (16, 9), (6,), (4, 4), (33,), (2, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("layout", ["each", "mixed", "one", "fallback"])
def test_fused_clip_parts_is_clip_grad_norm_per_part_bit_for_bit(dtype, layout):
    """``clip_parts_`` (one foreach norm, the coefficients at once, one foreach multiply) gives
    each part what torch's ``clip_grad_norm_(part, 2.0)`` gives, bit for bit: one tensor per
    part (DINO's per-parameter clip), parts of several tensors beside one-tensor ones (DINOv2's
    per-part clip) with gradient-less parameters left out, all in one part, and a part of two
    dtypes (the per-part loop)."""
    from contrastive.engine.step import clip_parts_

    def split(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
        if layout == "each":
            return [[p] for p in params]
        if layout == "one":
            return [params]
        return [params[:3], [params[3]], params[4:8], [params[8]], [params[9]]]

    none = (1, 3, 6) if layout == "mixed" else ()
    first = (torch.float32 if dtype == torch.float64 else torch.float64) \
        if layout == "fallback" else None
    got, ref, before = (_spread_grads(SHAPES, dtype, none, first) for _ in range(3))
    clip_parts_(split(got), 2.0)
    for part in split(ref):
        torch.nn.utils.clip_grad_norm_(part, 2.0)
    for a, b, c in zip(got, ref, before):
        assert (a.grad is None) == (b.grad is None) == (c.grad is None)
        if a.grad is not None:
            assert a.grad.dtype == b.grad.dtype and torch.equal(a.grad, b.grad)
    scaled = [not torch.equal(a.grad, c.grad) for a, c in zip(got, before) if a.grad is not None]
    assert any(scaled) and (layout == "one" or not all(scaled))  # both cases met
