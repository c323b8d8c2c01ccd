"""Gradient caching: the whole batch's exact gradient with the backbone run chunk by chunk.

Gao, Zhang, Han, Callan, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup" (RepL4NLP 2021, arXiv 2101.06983; the authors' code ``luyug/GradCache``, whose
``RandContext`` replays the random state as the second pass here does). The loss of a
contrastive method couples the samples of a batch, so accumulating micro-batches trains another
experiment (fewer negatives, other batch statistics). Caching at the backbone's output keeps the
experiment and bounds the memory that grows with the batch (the backbone's activations):

1. the backbone runs on each call's input chunk by chunk WITHOUT gradient: features ``h``
   (done lazily, when the method calls its backbone, so the calls need not be known in advance);
2. the method's forward runs ONCE on the whole batch with ``h`` as leaves that require grad: the
   heads (their batch norm sees the whole batch), the targets, the EMA / queue / centre updates
   and the loss happen once, as without chunks; ``loss.backward()`` leaves ``dL/dh`` on the
   leaves (and the heads' gradients in place);
3. the backbone re-runs chunk by chunk WITH gradient, each chunk back-propagating its slice of
   ``dL/dh`` (``torch.autograd.backward(h_chunk, grad_chunk)``). Each chunk replays the random
   state its first pass drew from (dropout, drop path: the same masks), under the same autocast.

The contract change (see :mod:`contrastive.methods`): during a training step the engine may stand
in for the method's backbones (``Method.backbones``: ``("encoder",)``, CLIP's two towers) with a
proxy that returns the cached features in call order; a method must call its backbone as
``backbone(tensors...)`` (one tensor out, one row per input row) and read nothing else from it
than attributes (calling one of its methods, e.g. ``encode``, is refused with a clear error).
The momentum copies (:class:`~contrastive.nn.MomentumEncoder` of ``Sequential(backbone, head)``:
MoCo's key network, BYOL's target, DINO's teacher) run their backbone chunk by chunk without
gradient too, so that their activations stay bounded; their heads see the whole batch.

Exact (float64: equal to rounding) for every method whose backbone has no batch norm; a
backbone with batch norm normalises each chunk with its own statistics (as several GPUs without
SyncBN do), and its running statistics are updated once per chunk of the first pass, never by the
second (restored). Several processes: the step runs without DDP's hooks (``no_sync``) and the
gradients are averaged over processes afterwards (what DDP does), in buckets.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["GradCache", "GradCacheError", "backbone_names", "check_grad_cache",
           "concat_batches", "couples_samples", "all_reduce_grads"]

logger = logging.getLogger(__name__)


class GradCacheError(ValueError):
    """A method or a call that gradient caching cannot serve; the message names the fix."""


def backbone_names(method: nn.Module) -> tuple[str, ...]:
    """The attribute names of the method's backbones (``Method.backbones``; ``("encoder",)``
    for a module without the attribute that has an ``encoder``)."""
    names = getattr(method, "backbones", None)
    if names is None:
        names = ("encoder",) if isinstance(getattr(method, "encoder", None), nn.Module) else ()
    return tuple(names)


def couples_samples(method: nn.Module) -> bool:
    """Whether the method's loss couples the samples of a batch through the gradient (in-batch
    negatives, batch statistics of the embeddings): gradient accumulation would train another
    experiment there."""
    return bool(getattr(method, "uses_in_batch_negatives", False)
                or getattr(method, "couples_samples", False))


def check_grad_cache(method: nn.Module, chunk: int, accum: int) -> str:
    """How the step trains: ``"plain"`` (no cache), ``"cache"`` (``--grad-cache-chunk``, or
    ``--grad-accum-steps`` > 1 of a per-sample method, whose micro-batches are collected and
    trained as one cached step). Raises :class:`GradCacheError` (one line) for what cannot
    work: accumulation where the loss couples samples, caching where the method has no
    backbone to cache."""
    name = type(method).__name__
    cacheable = bool(backbone_names(method))
    if accum > 1 and couples_samples(method):
        fix = ("pass --grad-cache-chunk N instead (the whole batch's exact gradient, the "
               "backbone run N samples at a time)" if cacheable else
               "train with a smaller --batch-size, or more processes")
        raise GradCacheError(
            f"--grad-accum-steps {accum} with {name}: its loss couples the samples of a batch "
            f"(in-batch negatives or batch statistics), so micro-batches would train a smaller "
            f"batch, another experiment; {fix}")
    reason = getattr(method, "no_accumulation", "")
    if accum > 1 and reason:
        raise GradCacheError(f"--grad-accum-steps {accum} with {name}: {reason}; train with a "
                             "smaller --batch-size, or more processes")
    if (chunk > 0 or accum > 1) and not cacheable:
        if chunk == 0:
            return "plain"  # a per-sample method without a backbone to cache: accumulate
        raise GradCacheError(
            f"--grad-cache-chunk {chunk}: {name} has no backbone the engine can cache (it uses "
            "more than the backbone's output on its input: intermediate layers, or tokens it "
            "masks itself); train without --grad-cache-chunk")
    return "cache" if chunk > 0 or accum > 1 else "plain"


# ---- random state and autocast, per chunk -------------------------------------------------------

def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state: tuple[Tensor, Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


@dataclass
class _Call:
    """One recorded backbone call: its chunks' inputs, random states, the leaf it returned."""

    module: nn.Module
    chunks: list[tuple[tuple[Any, ...], dict[str, Any]]]
    bounds: list[tuple[int, int]]
    rng: list[tuple[Tensor, Tensor | None]]
    autocast: tuple[bool, torch.dtype]
    device: torch.device
    leaf: Tensor
    versions: list[int] = field(default_factory=list)


def _split(args: tuple[Any, ...], kwargs: dict[str, Any], chunk: int, who: str
           ) -> tuple[int, list[tuple[int, int]], list[tuple[tuple[Any, ...], dict[str, Any]]]]:
    """Cut every tensor argument with the batch's leading size into row chunks."""
    first = next((a for a in [*args, *kwargs.values()] if isinstance(a, Tensor) and a.dim()), None)
    if first is None:
        raise GradCacheError(f"{who} was called without a batched tensor argument; gradient "
                             "caching cuts the inputs' first dimension into chunks")
    n = first.shape[0]

    def cut(x: Any, s: int, e: int) -> Any:
        return x[s:e] if isinstance(x, Tensor) and x.dim() and x.shape[0] == n else x

    bounds = [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
    pieces = [(tuple(cut(a, s, e) for a in args), {k: cut(v, s, e) for k, v in kwargs.items()})
              for s, e in bounds]
    return n, bounds, pieces


def _checked(out: Any, rows: int, who: str) -> Tensor:
    if not isinstance(out, Tensor) or out.dim() == 0 or out.shape[0] != rows:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise GradCacheError(f"{who} returned {got} for {rows} input rows; gradient caching "
                             "needs one tensor with one row per input row")
    return out


class _Proxy(nn.Module):
    """Stands in for a backbone during a cached step: runs it chunk by chunk without gradient
    and returns the features as a leaf (recorded by its :class:`GradCache`), or, for a momentum
    copy (``record=False``), the features alone. Attributes come from the backbone; its
    parameters are the backbone's (same order); calling one of its methods is refused."""

    def __init__(self, inner: nn.Module, cache: GradCache, label: str, record: bool) -> None:
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_record", record)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        inner = super().__getattr__("inner")
        value = getattr(inner, name)
        if callable(value) and not isinstance(value, (nn.Module, type)):
            raise GradCacheError(
                f"{self._label}.{name}() was called during a cached training step; gradient "
                f"caching (--grad-cache-chunk, --grad-accum-steps) serves only calls of the "
                f"backbone itself, {self._label}(...)")
        return value

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._cache._call(self, args, kwargs)


class GradCache:
    """The three passes of a cached step for ``method`` with backbone chunks of ``chunk`` rows.

    Use::

        with cache.recording():          # proxies in place of the backbones
            out = model(batch)            # pass 1 (no grad, chunked) inside, pass 2 once
        out["loss"].backward()            # dL/dh on the cached leaves, the heads' gradients
        cache.backward()                  # pass 3: chunk by chunk with grad, dL/dh slices

    ``replay_rng=False`` (tests only) draws new random numbers in pass 3: with dropout in the
    backbone the gradient is then wrong, which the tests show.
    """

    def __init__(self, method: nn.Module, chunk: int, *, replay_rng: bool = True) -> None:
        if chunk <= 0:
            raise GradCacheError(f"the chunk must be a positive number of rows, got {chunk}")
        self.method, self.chunk, self.replay_rng = method, int(chunk), replay_rng
        self.names = backbone_names(method)
        if not self.names:
            raise GradCacheError(f"{type(method).__name__} has no backbone to cache")
        for attr in self.names:
            if not isinstance(getattr(method, attr, None), nn.Module):
                raise GradCacheError(f"{type(method).__name__}.backbones names {attr!r}, which "
                                     "is not a submodule")
        self._calls: list[_Call] = []
        self.pending: list[Mapping[str, Any]] = []  # micro-batches of the step so far

    # ---- pass 1 (inside the method's forward) ---------------------------------------------------

    def _call(self, proxy: _Proxy, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        who, inner = proxy._label, proxy.inner
        n, bounds, pieces = _split(args, kwargs, self.chunk, who)
        record = proxy._record and torch.is_grad_enabled()
        device = next((a.device for a in [*args, *kwargs.values()] if isinstance(a, Tensor)),
                      torch.device("cpu"))
        rng, outs = [], []
        with torch.no_grad():
            for (a, kw), (s, e) in zip(pieces, bounds):
                if record:
                    rng.append(_rng_state(device))
                outs.append(_checked(inner(*a, **kw), e - s, who))
        h = torch.cat(outs) if len(outs) > 1 else outs[0]
        if not record:
            return h
        leaf = h.detach().requires_grad_(True)
        first = [x for x in [*pieces[0][0], *pieces[0][1].values()] if isinstance(x, Tensor)]
        self._calls.append(_Call(inner, pieces, bounds, rng, _autocast_state(device.type),
                                 device, leaf, [x._version for x in first]))
        return leaf

    def _momentum_backbones(self) -> list[tuple[nn.Module, str]]:
        """(container, key) of each momentum copy's backbone: ``MomentumEncoder`` modules
        whose ``module`` is a ``Sequential`` starting with a copy of a backbone's class."""
        from contrastive.nn.momentum import MomentumEncoder

        kinds = {type(getattr(self.method, n)) for n in self.names}
        found: list[tuple[nn.Module, str]] = []
        for m in self.method.modules():
            if isinstance(m, MomentumEncoder) and isinstance(m.module, nn.Sequential) and \
                    len(m.module) and type(m.module[0]) in kinds:
                found.append((m.module, "0"))
        return found

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Proxies in place of the backbones (and of the momentum copies' backbones)."""
        self._calls = []
        swaps: list[tuple[nn.Module, str, nn.Module]] = []
        for name in self.names:
            inner = getattr(self.method, name)
            swaps.append((self.method, name, inner))
        for container, key in self._momentum_backbones():
            swaps.append((container, key, container._modules[key]))  # type: ignore[arg-type]
        method_name = type(self.method).__name__
        try:
            for i, (owner, key, inner) in enumerate(swaps):
                label = f"{method_name}.{key}" if i < len(self.names) else f"{method_name} " \
                    "momentum copy"
                proxy = _Proxy(inner, self, label, record=i < len(self.names))
                object.__setattr__(proxy, "training", inner.training)
                owner._modules[key] = proxy
            yield
        finally:
            for owner, key, inner in swaps:
                owner._modules[key] = inner

    # ---- pass 3 ---------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget the recorded calls (a skipped step)."""
        self._calls = []

    def backward(self) -> None:
        """Re-run each recorded call chunk by chunk with gradient and back-propagate its slice
        of ``dL/dh``; the backbones' buffers (batch-norm running statistics) are restored
        afterwards, so that the first pass alone updated them."""
        calls, self._calls = self._calls, []
        if not calls:
            return
        modules = {id(c.module): c.module for c in calls}
        kept = {k: [b.detach().clone() for b in m.buffers()] for k, m in modules.items()}
        device = calls[0].device
        after = _rng_state(device)
        try:
            for c in calls:
                grad = c.leaf.grad
                if grad is None:  # this call's features did not reach the loss
                    continue
                first = [x for x in [*c.chunks[0][0], *c.chunks[0][1].values()]
                         if isinstance(x, Tensor)]
                if [x._version for x in first] != c.versions:
                    raise GradCacheError(
                        f"an input of {type(c.module).__name__} was changed in place after the "
                        "call; gradient caching re-runs the backbone on its inputs: copy them "
                        "before changing them")
                for (a, kw), (s, e), state in zip(c.chunks, c.bounds, c.rng):
                    if self.replay_rng:
                        _set_rng_state(c.device, state)
                    with torch.autocast(c.device.type, dtype=c.autocast[1],
                                        enabled=c.autocast[0]):
                        out = c.module(*a, **kw)
                    torch.autograd.backward(out, grad[s:e].to(out.dtype))
                c.leaf.grad = None
        finally:
            _set_rng_state(device, after)
            with torch.no_grad():
                for k, m in modules.items():
                    for b, saved in zip(m.buffers(), kept[k]):
                        b.copy_(saved)


def concat_batches(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The micro-batches of one optimiser step as one batch: tensors (and lists of them, the
    views) concatenated along the first dimension; other values (the schedules) from the
    first, which all share."""
    if len(batches) == 1:
        return dict(batches[0])
    out: dict[str, Any] = {}
    for key, value in batches[0].items():
        items = [b[key] for b in batches]
        try:
            if isinstance(value, Tensor) and value.dim():
                out[key] = torch.cat(items)
            elif isinstance(value, (list, tuple)) and value and isinstance(value[0], Tensor):
                out[key] = [torch.cat(parts) for parts in zip(*items)]
            else:
                out[key] = value
        except RuntimeError as err:
            raise GradCacheError(f"the micro-batches' {key!r} cannot be joined into the step's "
                                 f"batch ({err}); train with --grad-cache-chunk instead of "
                                 "--grad-accum-steps") from None
    return out


def all_reduce_grads(params: Sequence[nn.Parameter], world: int,
                     bucket_numel: int = 1 << 24) -> None:
    """Average the gradients over the ``world`` processes (what DDP's hooks do), flattened in
    buckets of at most ``bucket_numel`` elements of one dtype and device."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in groups.values():
        bucket: list[Tensor] = []
        size = 0
        for g in [*grads, None]:
            if g is not None and (not bucket or size + g.numel() <= bucket_numel):
                bucket.append(g)
                size += g.numel()
                continue
            if bucket:
                flat = _flatten_dense_tensors(bucket)
                dist.all_reduce(flat)
                flat /= world
                for g0, v in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    g0.copy_(v)
            bucket, size = ([g], g.numel()) if g is not None else ([], 0)

