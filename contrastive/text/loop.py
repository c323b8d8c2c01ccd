"""A small single-process training loop for the text methods, resumable.

Why not the engine: ``contrastive.engine.train`` reads image data sets through augmentation
pipelines and a view loader; the text methods take a batch of token ids instead. Until the
engine takes named text batches, the text recipes train with :func:`train_text`, which keeps
the engine's guarantees that matter here:

- the method contract: ``model(batch)`` with ``batch`` = the collated token tensors plus the
  method's schedules evaluated once per optimiser step (``stage`` for LRC-BERT);
- AdamW with linear warm-up and linear decay (BERT's fine-tuning schedule), gradient clipping;
- a deterministic order: epoch e visits the data in ``randperm(seed, e)`` order, so step s
  always sees the same examples;
- checkpoints that run no code when read, written with the engine's helpers
  (:mod:`contrastive.engine.safe_state`: ``model.safetensors``, ``optimizer.pt`` and
  ``rng.pt`` read with ``weights_only=True``, ``meta.json`` with every file's SHA-256), and
  ``resume=True`` continuing exactly as the uninterrupted run (same data, same dropout).

One process only (several processes: the method is DDP-ready, see tests/text/
test_lrc_bert_distributed.py, but this loop does not launch them).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["TextTrainConfig", "train_text"]

log = logging.getLogger(__name__)

_FILES = ("model.safetensors", "optimizer.pt", "rng.pt")


@dataclass
class TextTrainConfig:
    """Optimisation settings of :func:`train_text` (defaults: BERT fine-tuning, Devlin et al.)."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    clip_grad_norm: float = 1.0
    seed: int = 0
    log_every: int = 50
    save_every: int = 0  # 0: only at the end

    def validate(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0 or self.log_every < 1:
            raise ValueError(f"need steps >= 1, batch_size >= 1, lr > 0, log_every >= 1; got "
                             f"{self.steps}, {self.batch_size}, {self.lr}, {self.log_every}")
        if not 0 <= self.warmup_fraction < 1 or self.save_every < 0 or self.weight_decay < 0:
            raise ValueError("need 0 <= warmup_fraction < 1, save_every >= 0, weight_decay >= 0")


def _lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def _optimizer(model: nn.Module, cfg: TextTrainConfig) -> torch.optim.Optimizer:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.dim() < 2 or "LayerNorm" in name else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)


def _order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def _save(folder: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int,
          config: dict[str, Any]) -> None:
    from contrastive.engine.safe_state import file_entry, rng_state, safetensors_bytes, torch_bytes

    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    blobs = {"model.safetensors": safetensors_bytes(model.state_dict()),
             "optimizer.pt": torch_bytes(opt.state_dict()), "rng.pt": torch_bytes(rng_state())}
    files = {}
    for name, data in blobs.items():
        (tmp / name).write_bytes(data)
        files[name] = file_entry(data)
    (tmp / "meta.json").write_text(json.dumps({"step": step, "config": config, "files": files}))
    if folder.exists():
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
    os.replace(tmp, folder)


def _load(folder: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    from contrastive.engine.safe_state import (
        load_safetensors_bytes,
        load_torch_bytes,
        read_json,
        read_verified,
        set_rng_state,
    )

    meta = read_json(folder / "meta.json")
    model.load_state_dict(load_safetensors_bytes(
        read_verified(folder, "model.safetensors", meta["files"]), folder / "model.safetensors"))
    opt.load_state_dict(load_torch_bytes(read_verified(folder, "optimizer.pt", meta["files"]),
                                         folder / "optimizer.pt"))
    set_rng_state(load_torch_bytes(read_verified(folder, "rng.pt", meta["files"]),
                                   folder / "rng.pt"), folder / "rng.pt")
    return int(meta["step"])


def train_text(model: nn.Module, dataset: Sequence[Any], collate: Callable[[list], dict],
               cfg: TextTrainConfig, output_dir: str | Path | None = None, *,
               resume: bool = False, max_steps: int | None = None,
               on_log: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Train ``model`` (a text method) for ``cfg.steps`` optimiser steps; returns the log records.

    Args:
        model: ``forward(batch) -> {"loss", metrics...}``, ``schedules()``.
        dataset: items for ``collate`` (``{"text_a", ["text_b"], "label"}``).
        collate: list of items -> batch of tensors (:meth:`TextTokenizer.collate`).
        output_dir: where ``checkpoint/`` and ``metrics.jsonl`` go (None: nothing written).
        resume: continue from ``output_dir/checkpoint`` when it exists.
        max_steps: stop after this many steps (the schedules still span ``cfg.steps``).
    """
    cfg.validate()
    if len(dataset) < cfg.batch_size:
        raise ValueError(f"the data set has {len(dataset)} examples, fewer than one batch of "
                         f"{cfg.batch_size}: lower the batch size")
    out = Path(output_dir) if output_dir is not None else None
    device = next(model.parameters()).device
    opt = _optimizer(model, cfg)
    get_schedules = getattr(model, "schedules", None)
    schedules = get_schedules() if callable(get_schedules) else {}
    step = 0
    if out is not None and resume and (out / "checkpoint" / "meta.json").is_file():
        step = _load(out / "checkpoint", model, opt)
        log.info("resumed from %s at step %d", out / "checkpoint", step)
    elif out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("")
        torch.manual_seed(cfg.seed)
    else:
        torch.manual_seed(cfg.seed)
    per_epoch = len(dataset) // cfg.batch_size
    warmup = math.floor(cfg.warmup_fraction * cfg.steps)
    last = min(cfg.steps, max_steps) if max_steps else cfg.steps
    records: list[dict[str, float]] = []
    sums: dict[str, float] = {}
    n_sum = 0
    model.train()
    while step < last:
        epoch, pos = divmod(step, per_epoch)
        order = _order(len(dataset), cfg.seed, epoch)
        idx = order[pos * cfg.batch_size:(pos + 1) * cfg.batch_size]
        batch: dict[str, Any] = {k: v.to(device) for k, v in collate([dataset[i] for i in idx]).items()}
        sched = {k: float(fn(step, cfg.steps)) for k, fn in schedules.items()}
        batch.update(sched)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg.steps, warmup)
        result = model(batch)
        opt.zero_grad(set_to_none=True)
        result["loss"].backward()
        if cfg.clip_grad_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
        opt.step()
        step += 1
        for k, v in result.items():
            if isinstance(v, torch.Tensor) and v.dim() == 0:
                sums[k] = sums.get(k, 0.0) + float(v.detach())
        n_sum += 1
        if step % cfg.log_every == 0 or step == last:
            record = {"step": step, "lr": opt.param_groups[0]["lr"], **sched,
                      **{k: round(v / n_sum, 6) for k, v in sums.items()}}
            records.append(record)
            sums, n_sum = {}, 0
            if out is not None:
                with open(out / "metrics.jsonl", "a") as fh:
                    fh.write(json.dumps(record) + "\n")
            if on_log is not None:
                on_log(record)
        if out is not None and ((cfg.save_every and step % cfg.save_every == 0) or step == last):
            _save(out / "checkpoint", model, opt, step, asdict(cfg))
    return records
