"""The run log: ``metrics.jsonl`` records, the scalar window behind them, and the failure record.

Every ``log_every`` optimiser steps the loop writes one record: the mean over the window of every
0-d tensor the method returned, averaged over processes, with the learning rate, the method's
schedules, the embedding spread and the throughput. kNN and probe figures are records of their
own (``knn_top1``) or fields of the step record (``probe_top1``). :class:`Throughput` measures
the window's work and time.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from contrastive.engine.checkpoint import read_meta
from contrastive.engine.run_folder import truncate_metrics
from contrastive.engine.run_state import write_run_state
from contrastive.records import CHECKPOINTS, find_latest

__all__ = ["MetricsLog", "ScalarWindow", "Throughput", "log_record", "rel", "record_failure"]

logger = logging.getLogger(__name__)


class MetricsLog:
    """``metrics.jsonl`` writer (main process) with a truncate-on-resume rule."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None) -> None:
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        if resume_step is None:
            self.path.write_text("")
        else:  # drop lines written after the checkpoint we resume from (and a torn last line)
            truncate_metrics(self.path, resume_step)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")


class ScalarWindow:
    """Sums of every 0-d tensor the method returns, on the device (no host sync per step).

    While every step returns the same scalars (the usual case) they are summed as one vector:
    one stack and one add per step instead of an add per scalar. A step with other scalars
    turns the window's sums into per-name ones for the rest of the window. Either way each
    name's sum is the same sequence of float32 additions, so the means are the same bits.
    """

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}  # per-name sums (after a change of names)
        self.counts: dict[str, int] = {}
        self.last: dict[str, Any] = {}  # the last step's output (its embeddings)
        self._names: tuple[str, ...] = ()  # the names summed in _vec, in the method's order
        self._vec: torch.Tensor | None = None
        self._n = 0  # steps summed in _vec

    def add(self, out: dict[str, Any]) -> None:
        self.last = out
        names = tuple(k for k, v in out.items() if isinstance(v, torch.Tensor) and v.ndim == 0)
        if not names:
            return
        if self._vec is not None and names != self._names:
            self._to_per_name()
        if self._vec is None and not self.sums:  # a new window: sum as one vector
            self._names, self._n = names, 1
            self._vec = torch.stack([out[k].detach() for k in names]).float()
        elif self._vec is not None:
            self._vec = self._vec + torch.stack([out[k].detach() for k in names]).float()
            self._n += 1
        else:
            for k in names:
                v = out[k].detach().float()
                self.sums[k] = self.sums[k] + v if k in self.sums else v
                self.counts[k] = self.counts.get(k, 0) + 1

    def _to_per_name(self) -> None:
        assert self._vec is not None
        for i, k in enumerate(self._names):
            self.sums[k], self.counts[k] = self._vec[i], self._n
        self._vec, self._names, self._n = None, (), 0

    def means(self, accelerator: Any) -> dict[str, float]:
        """The window means, averaged over processes (one collective), then a new window."""
        if self._vec is not None:
            order = sorted(range(len(self._names)), key=self._names.__getitem__)
            keys = [self._names[i] for i in order]
            vec: torch.Tensor | None = (self._vec / self._n)[order]
        else:
            keys = sorted(self.sums)
            vec = torch.stack([self.sums[k] / self.counts[k] for k in keys]) if keys else None
        means: dict[str, float] = {}
        if vec is not None:
            if accelerator.num_processes > 1:
                vec = accelerator.reduce(vec, "mean")
            means = dict(zip(keys, vec.tolist()))
        self.sums, self.counts = {}, {}
        self._vec, self._names, self._n = None, (), 0
        return means


class Throughput:
    """The log window's work and time: the units the data adapter counts on the device (tokens;
    summed over processes when the window closes) or ``batch_size`` samples per optimiser step,
    the seconds since the window opened, and those spent waiting for the loader."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.opened, self.waited, self.steps = time.perf_counter(), 0.0, 0
        self.counted: torch.Tensor | None = None

    def timed(self, start: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """The items of ``start()`` (the loader's, its workers started there), the time taken
        to get each counted as waiting."""
        t = time.perf_counter()
        items = start()
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            self.waited += time.perf_counter() - t
            yield item
            t = time.perf_counter()

    def count(self, units: torch.Tensor | None) -> None:
        """A micro-batch's units as the adapter counts them (None: it counts samples)."""
        if units is not None:
            self.counted = units.double() if self.counted is None else self.counted + units

    def close(self, accelerator: Any) -> tuple[float, int, float]:
        """``(seconds, units, seconds waiting)`` of the window that ends now; a new one opens."""
        now = time.perf_counter()
        if self.counted is not None:  # counted on the device, summed over processes
            n = self.counted.reshape(1)
            units = int((accelerator.reduce(n, "sum") if accelerator.num_processes > 1
                         else n).item())
        else:
            units = self.steps * self.batch_size
        window = (now - self.opened, units, self.waited)
        self.opened, self.waited, self.steps, self.counted = now, 0.0, 0, None
        return window


def log_record(step: int, steps_per_epoch: int, lr: float, sched: dict[str, float],
               means: dict[str, float], last_out: dict[str, Any], seconds: float, units: int,
               wait: float, unit: str = "images") -> dict[str, Any]:
    """One metrics.jsonl record of the window that ends at ``step``; throughput as
    ``<unit>_per_s`` (the data adapter's unit: images, samples, tokens)."""
    emb_std = None
    emb = last_out.get("embeddings")
    if emb is not None and emb.shape[0] > 1:
        emb_std = F.normalize(emb.float(), dim=1).std(dim=0).mean().item()
    record = {
        "step": step,
        "epoch": round(step / steps_per_epoch, 4),
        **{k: round(v, 6) for k, v in means.items()},
        "lr": lr,
        **sched,  # the method's schedules at the last step of the window
        "embedding_std": None if emb_std is None else round(emb_std, 6),
        f"{unit}_per_s": round(units / max(seconds, 1e-9), 2),
        "data_wait_frac": round(wait / max(seconds, 1e-9), 4),
        "time": round(time.time(), 3),
    }
    loss = record.get("loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        record["loss"] = None
    return record


def rel(path: Path | None, out: Path) -> str | None:
    """``path`` relative to the run folder ``out`` (as run_state.json records it)."""
    if path is None:
        return None
    try:
        return str(Path(path).relative_to(out))
    except ValueError:
        return str(path)


def record_failure(out: Path, exc: BaseException) -> None:
    """``run_state.json`` = failed, with the error and the newest complete checkpoint."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    error = text[0][:500] if text else type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):
        error = "KeyboardInterrupt: stopped without saving (a second SIGINT)"
    try:
        latest = find_latest(out / CHECKPOINTS)
        step = read_meta(latest).get("step") if latest is not None else None
        write_run_state(out, "failed", step=step, error=error, resumable=latest is not None,
                        checkpoint=rel(latest, out))
    except Exception as e:  # noqa: BLE001 - the failure itself may be a full or read-only disk
        logger.warning("could not record the failure in %s: %s", out / "run_state.json", e)
