"""Checkpoints: ``accelerate.save_state`` written atomically, checked before and after loading.

Layout (``<output_dir>/checkpoints/``)::

    step_00001000/           a complete checkpoint (it has meta.json)
        model.safetensors    the whole method: query + key encoders, heads, queue (no "module."
                             prefix, whatever the number of processes)
        optimizer.bin, scaler.pt (fp16), random_states_<rank>.pkl, custom_checkpoint_0.pkl
        meta.json            step, epoch, data position, config, model signature, fingerprints
    .tmp-step_00002000/      a save in progress (ignored, removed at the next start)

A save writes into ``.tmp-step_*``, flushes the files, writes ``meta.json`` last and renames the
folder: a crash mid-save leaves the previous checkpoints untouched. Only then are checkpoints
beyond ``keep_last`` deleted.

Before loading, :func:`check_compatible` compares the checkpoint's model signature (method class,
every state-dict key with shape and dtype) and run-defining config fields with the new run and
raises :class:`IncompatibleCheckpointError` naming the differences. After loading,
:meth:`CheckpointManager.verify` recomputes SHA-256 fingerprints of the model, the optimiser and
every process's RNG states (torch, CUDA, ``random``, numpy) and compares them with those taken at
save time: accelerate only logs when it cannot restore RNG states, a resume that is not exact
raises :class:`ResumeMismatchError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "IncompatibleCheckpointError",
    "ResumeMismatchError",
    "TrainState",
    "CheckpointManager",
    "model_signature",
    "check_compatible",
    "find_latest",
    "resolve_resume",
    "tensor_digest",
    "rng_digest",
    "OPERATIONAL_FIELDS",
]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
META = "meta.json"
FORMAT_VERSION = 1

#: Config fields that may change between a run and its resume (they do not change the maths).
OPERATIONAL_FIELDS = frozenset({
    "output_dir", "resume", "max_steps", "num_workers", "save_every_steps", "save_every_epochs",
    "keep_last", "log_every", "progress", "report_to", "allow_config_change", "strict_data",
    "knn_every", "knn_at_start", "knn_max_train", "knn_max_test", "knn_k", "knn_t",
    "knn_feature", "compile", "channels_last", "batched_augment", "cpu", "on_nonfinite",
    "mixed_precision", "ddp_find_unused_parameters", "stop_if_orphaned",
})


class IncompatibleCheckpointError(ValueError):
    """The checkpoint was written by another model, method or run configuration."""


class ResumeMismatchError(RuntimeError):
    """A loaded state differs from the state that was saved: the resume would not be exact."""


# ----------------------------------------------------------------------------------------------
# fingerprints


def _update_tensor(h: Any, t: torch.Tensor) -> None:
    t = t.detach()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())


def _update_any(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        _update_tensor(h, obj)
    elif isinstance(obj, np.ndarray):
        h.update(str(obj.dtype).encode() + obj.tobytes())
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(str(k).encode())
            _update_any(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _update_any(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def tensor_digest(obj: Any) -> str:
    """SHA-256 of a (nested) state dict: keys, dtypes, shapes and bytes of every tensor."""
    h = hashlib.sha256()
    _update_any(h, obj)
    return h.hexdigest()


def rng_digest() -> str:
    """SHA-256 of this process's torch, CUDA, ``random`` and numpy generator states."""
    h = hashlib.sha256()
    _update_tensor(h, torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for s in torch.cuda.get_rng_state_all():
            _update_tensor(h, s)
    _update_any(h, random.getstate())
    _update_any(h, np.random.get_state())
    return h.hexdigest()


def model_signature(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint must match: the method class and every state-dict entry's shape/dtype."""
    tensors = {k: f"{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}"
               for k, v in model.state_dict().items()}
    digest = hashlib.sha256(json.dumps([type(model).__name__, tensors],
                                       sort_keys=True).encode()).hexdigest()
    return {"method": type(model).__name__, "digest": digest, "tensors": tensors}


# ----------------------------------------------------------------------------------------------
# state registered with accelerate


class TrainState:
    """Loop position + fingerprints, saved by ``accelerator.register_for_checkpointing``.

    ``micro_in_epoch`` counts the micro-batches of the current epoch already consumed (what a
    resume skips); ``fingerprints`` is filled by :class:`CheckpointManager` just before a save.
    """

    def __init__(self) -> None:
        self.step = 0
        self.epoch = 0
        self.micro_in_epoch = 0
        self.images_seen = 0
        self.fingerprints: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch,
                "images_seen": self.images_seen, "fingerprints": self.fingerprints}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.micro_in_epoch = int(state["micro_in_epoch"])
        self.images_seen = int(state.get("images_seen", 0))
        self.fingerprints = dict(state.get("fingerprints", {}))


# ----------------------------------------------------------------------------------------------
# finding checkpoints


def _complete_steps(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / META).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def find_latest(root: str | Path) -> Path | None:
    """Newest complete checkpoint folder under ``root`` (a run's ``checkpoints/``) or None."""
    found = _complete_steps(Path(root))
    return found[-1][1] if found else None


def resolve_resume(resume: str, output_dir: str | Path) -> Path | None:
    """``--resume`` to a checkpoint folder: ``auto`` -> newest in ``output_dir`` (None if none);
    a checkpoint folder; or a run folder (its newest checkpoint)."""
    if not resume:
        return None
    if resume == "auto":
        return find_latest(Path(output_dir) / "checkpoints")
    path = Path(resume)
    if (path / META).is_file():
        return path
    for root in (path / "checkpoints", path):
        latest = find_latest(root)
        if latest is not None:
            return latest
    raise FileNotFoundError(f"--resume {resume}: no complete checkpoint there (a folder with "
                            f"{META}, or a run folder with checkpoints/step_*/{META})")


def read_meta(path: str | Path) -> dict[str, Any]:
    with open(Path(path) / META) as fh:
        return json.load(fh)


def check_compatible(meta: dict[str, Any], signature: dict[str, Any], config: dict[str, Any], *,
                     world_size: int, allow_config_change: bool = False,
                     path: str | Path = "") -> list[str]:
    """Raise :class:`IncompatibleCheckpointError` when the checkpoint cannot continue this run.

    The model signature must match exactly. Config fields outside :data:`OPERATIONAL_FIELDS`
    and the number of processes must match unless ``allow_config_change`` (then they are
    returned as warnings).
    """
    where = f" {path}" if path else ""
    if meta.get("format") != FORMAT_VERSION:
        raise IncompatibleCheckpointError(
            f"checkpoint{where} has format {meta.get('format')!r}, this version reads "
            f"{FORMAT_VERSION}")
    old = meta["signature"]
    if old["digest"] != signature["digest"]:
        problems = []
        if old["method"] != signature["method"]:
            problems.append(f"method {old['method']} in the checkpoint, {signature['method']} "
                            "now")
        a, b = old["tensors"], signature["tensors"]
        missing = [k for k in b if k not in a]
        extra = [k for k in a if k not in b]
        shaped = [f"{k}: {a[k]} vs {b[k]}" for k in b if k in a and a[k] != b[k]]
        for label, items in (("not in the checkpoint", missing), ("only in the checkpoint", extra),
                             ("different shape/dtype (checkpoint vs now)", shaped)):
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                problems.append(f"{len(items)} tensors {label}: {', '.join(items[:5])}{more}")
        old_cfg = meta.get("config", {})
        hint_fields = [k for k in ("encoder", "recipe") if old_cfg.get(k) != config.get(k)]
        hint = "".join(f"; checkpoint {k}={old_cfg.get(k)!r}, now {config.get(k)!r}"
                       for k in hint_fields)
        raise IncompatibleCheckpointError(
            f"checkpoint{where} was written by a different model{hint}: "
            + "; ".join(problems)
            + ". Resume with the same recipe and model options, or start a new --output-dir.")
    changed = []
    old_cfg = meta.get("config", {})
    for key in sorted(set(old_cfg) | set(config)):
        if key in OPERATIONAL_FIELDS:
            continue
        if old_cfg.get(key) != config.get(key):
            changed.append(f"{key}: {old_cfg.get(key)!r} -> {config.get(key)!r}")
    if meta.get("world_size", world_size) != world_size:
        changed.append(f"processes: {meta.get('world_size')} -> {world_size} (RNG states cannot "
                       "be restored exactly)")
    if changed and not allow_config_change:
        raise IncompatibleCheckpointError(
            f"checkpoint{where} belongs to a run with other settings: {'; '.join(changed)}. "
            "Pass the same values, start a new --output-dir, or add --allow-config-change to "
            "continue anyway (the resumed run is then not the same run).")
    return changed


# ----------------------------------------------------------------------------------------------
# manager


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())


class CheckpointManager:
    """Atomic ``save_state`` / verified ``load_state`` for one run.

    Args:
        accelerator: the run's ``Accelerator`` (model and optimiser already prepared).
        model: the prepared model (its unwrapped module is what gets saved, without wrappers).
        optimizer: the prepared optimiser.
        state: the :class:`TrainState` (registered for checkpointing here).
        root: ``<output_dir>/checkpoints``.
        keep_last: complete checkpoints kept after each save.
        meta: extra JSON-able content for ``meta.json`` (config, signature, recipe).
    """

    def __init__(self, accelerator: Any, model: nn.Module, optimizer: Any, state: TrainState,
                 root: str | Path, *, keep_last: int = 2, meta: dict[str, Any] | None = None):
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.state = state
        self.root = Path(root)
        self.keep_last = keep_last
        self.meta = dict(meta or {})
        self.last_saved_step: int | None = None
        accelerator.register_for_checkpointing(state)
        accelerator.register_save_state_pre_hook(self._save_hook)
        accelerator.register_load_state_pre_hook(self._load_hook)

    # accelerate hooks: store the unwrapped module's state so that checkpoints do not depend on
    # the DDP wrapper (a 2-process checkpoint has no "module." prefix and loads in 1 process).
    def _save_hook(self, models: list, weights: list, output_dir: str) -> None:
        for i, m in enumerate(models):
            weights[i] = self.accelerator.unwrap_model(m).state_dict()

    def _load_hook(self, models: list, input_dir: str) -> None:
        from safetensors.torch import load_file

        for i, m in enumerate(models):
            name = "model.safetensors" if i == 0 else f"model_{i}.safetensors"
            file = Path(input_dir) / name
            if not file.is_file():
                raise FileNotFoundError(f"checkpoint {input_dir} has no {name}")
            self.accelerator.unwrap_model(m).load_state_dict(load_file(str(file)), strict=True)
        models.clear()  # loaded here; accelerate must not load them again

    def cleanup_partial(self) -> None:
        """Remove ``.tmp-*`` folders left by a save that crashed (main process)."""
        if self.accelerator.is_main_process and self.root.is_dir():
            for p in self.root.glob(".tmp-*"):
                logger.warning("removing incomplete checkpoint %s (a save was interrupted)", p)
                shutil.rmtree(p, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def _fingerprints(self) -> dict[str, Any]:
        from accelerate.utils import gather_object

        module = self.accelerator.unwrap_model(self.model)
        local = {"rng": rng_digest()}
        per_rank = gather_object([local])
        return {
            "model": tensor_digest(module.state_dict()),
            "optimizer": tensor_digest(self.optimizer.state_dict()),
            "rng": [r["rng"] for r in per_rank],
        }

    def save(self) -> Path:
        """Write a checkpoint of the current state; return its folder."""
        acc = self.accelerator
        step = self.state.step
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f".tmp-step_{step:08d}"
        if acc.is_main_process:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
        acc.wait_for_everyone()
        self.state.fingerprints = self._fingerprints()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if acc.is_main_process:
            meta = {
                **self.meta,
                "format": FORMAT_VERSION,
                "step": step,
                "epoch": self.state.epoch,
                "micro_in_epoch": self.state.micro_in_epoch,
                "images_seen": self.state.images_seen,
                "world_size": acc.num_processes,
                "fingerprints": self.state.fingerprints,
            }
            _fsync_tree(tmp)
            part = tmp / (META + ".part")
            part.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(part, tmp / META)
            if final.exists():
                old = self.root / f".tmp-old-step_{step:08d}"
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
            self._prune()
        acc.wait_for_everyone()
        self.last_saved_step = step
        logger.info("checkpoint saved: %s", final)
        return final

    def _prune(self) -> None:
        complete = _complete_steps(self.root)
        for _, path in complete[:-self.keep_last]:
            shutil.rmtree(path, ignore_errors=True)

    def load(self, path: str | Path) -> None:
        """``accelerator.load_state(path)`` then :meth:`verify`."""
        self.accelerator.load_state(str(path))
        self.verify(path)

    def verify(self, path: str | Path = "") -> None:
        """Compare live fingerprints with the saved ones; raise :class:`ResumeMismatchError`."""
        saved = self.state.fingerprints
        if not saved:
            raise ResumeMismatchError(f"checkpoint {path} holds no fingerprints: cannot verify "
                                      "the resume")
        module = self.accelerator.unwrap_model(self.model)
        rank = self.accelerator.process_index
        problems = []
        if self.accelerator.is_main_process:
            if tensor_digest(module.state_dict()) != saved["model"]:
                problems.append("model weights/buffers (incl. momentum encoder and queue)")
            if tensor_digest(self.optimizer.state_dict()) != saved["optimizer"]:
                problems.append("optimizer state")
        rngs = saved.get("rng", [])
        if rank < len(rngs) and rng_digest() != rngs[rank]:
            problems.append(f"random number generator states of process {rank} (accelerate "
                            "could not restore them)")
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            problems = gather_object(problems)  # every process raises, none waits forever
        if problems:
            raise ResumeMismatchError(
                f"resume from {path} is not exact: {', '.join(problems)} differ from what was "
                "saved. The checkpoint may come from another software version or device; start "
                "a new run or investigate before continuing.")
        logger.info("resume verified: model, optimizer and RNG states equal the saved ones")


def iter_checkpoints(root: str | Path) -> Iterable[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    return [p for _, p in _complete_steps(Path(root))]
