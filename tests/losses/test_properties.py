"""Generic properties, checked for every loss in the registry (a new built-in loss gets them for
free once it defines ``example_inputs``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from contrastive.losses import BaseLoss, get_loss, list_losses, loss_class

NAMES = list_losses()
N = 6


def example(
    name: str, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    cls = loss_class(name)
    return cls.example_inputs(
        n=N, dim=8, dtype=dtype, generator=torch.Generator().manual_seed(seed)
    )


def map_floats(inputs: tuple[torch.Tensor, ...], fn: Callable) -> tuple[torch.Tensor, ...]:
    return tuple(fn(x) if x.is_floating_point() else x for x in inputs)


def test_the_six_builtin_losses_are_registered():
    assert {"infonce", "ntxent", "cosnce", "supcon", "dcl", "kd"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_builtin_has_example_inputs_indexed_by_sample(name):
    cls = loss_class(name)
    assert issubclass(cls, BaseLoss), f"{name}: built-in losses derive from BaseLoss"
    inputs = example(name)
    assert inputs and all(x.shape[0] == N for x in inputs)


@pytest.mark.parametrize("name", NAMES)
def test_returns_finite_float32_scalar_with_gradients(name):
    inputs = map_floats(example(name), lambda x: x.requires_grad_())
    out = get_loss(name)(*inputs)
    assert out.shape == () and out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    for x in inputs:
        if x.is_floating_point():
            assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def batch_level(name: str) -> bool:
    return loss_class(name).batch_level


@pytest.mark.parametrize("name", NAMES)
def test_reductions_agree(name):
    inputs = example(name)
    if batch_level(name):  # a statistic of the whole batch: "mean" only, the others refused
        assert get_loss(name)(*inputs).shape == ()
        for other in ("sum", "none"):
            with pytest.raises(ValueError, match="batch-level"):
                get_loss(name, reduction=other)
        return
    per_sample = get_loss(name, reduction="none")(*inputs)
    assert per_sample.shape[0] == N and per_sample.dtype == torch.float32
    torch.testing.assert_close(get_loss(name, reduction="mean")(*inputs), per_sample.mean())
    torch.testing.assert_close(get_loss(name, reduction="sum")(*inputs), per_sample.sum())


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name):
    inputs = map_floats(example(name, torch.float64), lambda x: x.detach().requires_grad_())
    floats = [x for x in inputs if x.is_floating_point()]
    loss_fn = get_loss(name, reduction="mean" if batch_level(name) else "none")

    def f(*grads_in: torch.Tensor) -> torch.Tensor:
        it = iter(grads_in)
        return loss_fn(*(next(it) if x.is_floating_point() else x for x in inputs))

    assert f(*floats).dtype == torch.float64
    assert torch.autograd.gradcheck(f, floats, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_scale_invariance_when_normalising(name):
    if not loss_class(name).scale_invariant:
        pytest.skip(f"{name} is not scale invariant (no normalisation, or an eps in it)")
    inputs = example(name)
    loss_fn = get_loss(name, reduction="none")
    expected = loss_fn(*inputs)
    for scale in (0.01, 3.7, 250.0):
        scaled = map_floats(inputs, lambda x, s=scale: x * s)
        torch.testing.assert_close(loss_fn(*scaled), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_permutation_equivariance(name):
    inputs = example(name)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    permuted = tuple(x[perm] for x in inputs)
    if batch_level(name):  # invariant: the batch statistics do not depend on the order
        torch.testing.assert_close(get_loss(name)(*permuted), get_loss(name)(*inputs))
        return
    loss_fn = get_loss(name, reduction="none")
    torch.testing.assert_close(loss_fn(*permuted), loss_fn(*inputs)[perm], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(get_loss(name)(*permuted), get_loss(name)(*inputs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_inputs_give_float32(name, dtype):
    half = example(name, dtype)
    out = get_loss(name)(*half)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    # the same numbers in float32 give the same result: the maths itself is float32
    full = get_loss(name)(*map_floats(half, lambda x: x.float()))
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_autocast_does_not_lower_the_loss_precision(name):
    inputs = example(name)
    expected = get_loss(name)(*inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = get_loss(name)(*inputs)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_zero_vectors_give_no_nan(name):
    def zero_first(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[0] = 0
        return x.requires_grad_()

    for make in (zero_first, lambda x: torch.zeros_like(x).requires_grad_()):
        inputs = map_floats(example(name), make)
        out = get_loss(name)(*inputs)
        assert torch.isfinite(out), f"{name}: {out}"
        out.backward()
        for x in inputs:
            if x.is_floating_point():
                assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", NAMES)
def test_bad_temperature_and_reduction_raise_value_error(name):
    with pytest.raises(ValueError, match="reduction"):
        get_loss(name, reduction="avg")
    if "temperature" in loss_class(name).__init__.__code__.co_varnames:
        for bad in (0.0, -0.1, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="temperature"):
                get_loss(name, temperature=bad)
