"""Checkpoints: written atomically in formats that cannot run code, checked before and after loading.

Layout (``<output_dir>/checkpoints/``)::

    step_00001000/             a complete checkpoint (it has meta.json)
        model.safetensors      the whole method: query + key encoders, heads, queue (no "module."
                               prefix, whatever the number of processes)
        optimizer.bin          the optimiser's state dict (torch file, tensors and numbers only)
        probe.pt               the online linear probe's head and optimiser (when it is on)
        scaler.pt              the fp16 gradient scaler (when there is one)
        random_states_<r>.pt   process r's torch/CUDA, ``random`` and numpy generator states
        meta.json              step, epoch, data position, config, model signature,
                               fingerprints, and every file's size and SHA-256 (written last)
    .tmp-step_00002000/        a save in progress

Nothing is unpickled when loading (:mod:`contrastive.engine.safe_state`): safetensors, JSON,
and ``torch.load(weights_only=True)``; every file is checked against the sizes and hashes in
``meta.json`` before it is parsed.

A save writes into ``.tmp-step_*`` (each file written then fsynced), writes ``meta.json`` last,
renames the folder and fsyncs its parent; only then are checkpoints beyond ``keep_last`` renamed
to ``.trash-*`` and deleted. A re-save of a step that exists renames the old copy to
``.tmp-old-step_*`` first. At the next start :meth:`CheckpointManager.cleanup_partial` promotes
any temporary folder whose files all verify (newest copy first) and removes the rest, so a kill
at any point of a save leaves the newest complete checkpoint loadable.

Before loading, :func:`~contrastive.engine.compat.check_compatible` compares the checkpoint's model signature (method class,
every state-dict key with shape and dtype) and run-defining config fields with the new run and
raises :class:`IncompatibleCheckpointError` naming the differences. After loading,
:meth:`CheckpointManager.verify` recomputes SHA-256 fingerprints of the model, the optimiser and
every process's RNG states (torch, CUDA, ``random``, numpy) and compares them with those taken at
save time: a resume that is not exact raises :class:`ResumeMismatchError`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch import nn

from contrastive.engine.compat import (
    FORMAT_VERSION,
    OPERATIONAL_FIELDS,
    IncompatibleCheckpointError,
    ResumeMismatchError,
    check_compatible,
    model_signature,
    rng_digest,
    tensor_digest,
)
from contrastive.engine.run_folder import RunFolderError, existing_run_files, os_error_message
from contrastive.engine.safe_state import (
    CheckpointFileError,
    file_entry,
    load_safetensors_bytes,
    load_torch_bytes,
    read_json,
    read_verified,
    rng_state,
    safetensors_bytes,
    set_rng_state,
    torch_bytes,
    verify_files,
)
from contrastive.engine.sharding import full_state, shard_like, shard_optimizer_state
from contrastive.records import (
    CHECKPOINTS,
    META,
    MODEL_FILE,
    STEP_PREFIX,
    complete_checkpoints,
    find_latest,
    step_dir_name,
)

__all__ = [
    "CheckpointFileError",
    "RunFolderError",
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
    "read_meta",
    "iter_checkpoints",
]

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.bin"
SCALER_FILE = "scaler.pt"

# ----------------------------------------------------------------------------------------------
# state registered with accelerate


class TrainState:
    """Loop position + fingerprints, saved in ``meta.json`` by :class:`CheckpointManager`.

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


def resolve_resume(resume: str, output_dir: str | Path) -> Path | None:
    """``--resume`` to a checkpoint folder: ``auto`` -> newest in ``output_dir`` (None if none);
    a checkpoint folder; or a run folder (its newest checkpoint)."""
    if not resume:
        return None
    if resume == "auto":
        latest = find_latest(Path(output_dir) / CHECKPOINTS)
        if latest is None:
            found = existing_run_files(Path(output_dir))
            if found:
                raise RunFolderError(
                    f"--resume auto: {output_dir} holds a run ({', '.join(found[:4])}) but no "
                    "complete checkpoint to continue from; refusing to start over it. To start "
                    f"again, delete {Path(output_dir) / 'checkpoints'} and "
                    f"{Path(output_dir) / 'encoder.pt'}, or pass another --output-dir")
        return latest
    path = Path(resume)
    if (path / META).is_file():
        return path
    for root in (path / CHECKPOINTS, path):
        latest = find_latest(root)
        if latest is not None:
            return latest
    raise FileNotFoundError(f"--resume {resume}: no complete checkpoint there (a folder with "
                            f"{META}, or a run folder with checkpoints/step_*/{META})")


def read_meta(path: str | Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json`` (JSON only), or :class:`CheckpointFileError` naming it."""
    meta = read_json(Path(path) / META)
    if not isinstance(meta, dict):
        raise CheckpointFileError(f"{Path(path) / META} is not a JSON object: the checkpoint is "
                                  "damaged or was altered")
    return meta


# ----------------------------------------------------------------------------------------------
# manager


# file-system steps of a save: module functions, so that a test can fail each one in turn


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def _fsync(path: Path) -> None:
    """Flush a file, or a folder's entries (the renames in it), to the disk."""
    if os.name == "nt" and path.is_dir():
        return  # Windows cannot open folders; NTFS journals renames
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(src: Path, dst: Path) -> None:
    os.replace(src, dst)


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


_TMP_DIR = re.compile(rf"^\.tmp-(old-)?({STEP_PREFIX}\d+)$")


def recover_partial(root: str | Path) -> list[Path]:
    """Tidy ``root`` after an interrupted save; return the checkpoints recovered.

    A ``.tmp-step_N`` / ``.tmp-old-step_N`` folder whose files all match its ``meta.json``
    (size and SHA-256, see :func:`~contrastive.engine.safe_state.verify_files`) becomes
    ``step_N`` when that does not exist (the new copy preferred); one without ``meta.json`` is
    an unfinished write and is removed, as are ``.trash-*`` folders (pruned checkpoints). A
    temporary folder whose ``meta.json`` lists files that do not match was damaged after the
    save: it is kept, with a warning, for the user to inspect.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    recovered = []
    groups: dict[str, list[Path]] = {}
    for p in sorted(root.iterdir()):
        m = _TMP_DIR.match(p.name)
        if p.name.startswith(".trash-"):
            _rmtree(p)
        elif m and p.is_dir():
            groups.setdefault(m.group(2), []).append(p)
        elif p.name.startswith(".tmp-"):
            logger.warning("removing %s (left by an interrupted save)", p)
            _rmtree(p) if p.is_dir() else p.unlink()
    for name, candidates in sorted(groups.items()):
        candidates.sort(key=lambda p: p.name.startswith(".tmp-old-"))  # the newest copy first
        final = root / name
        for cand in candidates:
            complete = (cand / META).is_file()
            if not final.exists() and complete and verify_files(cand):
                _replace(cand, final)
                _fsync(root)
                recovered.append(final)
                logger.warning("recovered the complete checkpoint %s from %s (a save was "
                               "interrupted after writing it)", final, cand.name)
            elif complete and not verify_files(cand):
                logger.warning("keeping %s: its files do not match its meta.json (damaged after "
                               "the save); inspect or delete it", cand)
            else:
                logger.warning("removing %s (left by an interrupted save; %s)", cand,
                               f"{final.name} is complete" if final.exists() else "incomplete")
                _rmtree(cand)
    return recovered


class CheckpointManager:
    """Atomic, code-free saves and verified loads of a run's whole training state.

    Args:
        accelerator: the run's ``Accelerator`` (model and optimiser already prepared).
        model: the prepared model (its unwrapped module is what gets saved, without wrappers).
        optimizer: the prepared optimiser.
        state: the :class:`TrainState` (saved in ``meta.json``).
        root: ``<output_dir>/checkpoints``.
        keep_last: complete checkpoints kept after each save.
        meta: extra JSON-able content for ``meta.json`` (config, signature, recipe).
        extras: more state saved by the main process as ``<name>.pt`` (``weights_only``
            torch files) and fingerprinted: objects with ``checkpoint_state()`` and
            ``load_checkpoint_state(state)``, the same on every process (the online probe).
    """

    def __init__(self, accelerator: Any, model: nn.Module, optimizer: Any, state: TrainState,
                 root: str | Path, *, keep_last: int = 2, meta: dict[str, Any] | None = None,
                 extras: dict[str, Any] | None = None):
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.state = state
        self.root = Path(root)
        self.keep_last = keep_last
        self.meta = dict(meta or {})
        self.extras = dict(extras or {})
        self.last_saved_step: int | None = None

    def cleanup_partial(self) -> None:
        """Recover or remove what an interrupted save left (main process; see
        :func:`recover_partial`)."""
        if self.accelerator.is_main_process:
            recover_partial(self.root)
        self.accelerator.wait_for_everyone()

    def _fingerprints(self, model_state: dict[str, Any], opt_state: dict[str, Any]
                      ) -> dict[str, Any]:
        from accelerate.utils import gather_object

        local = {"rng": rng_digest()}
        per_rank = gather_object([local])
        prints: dict[str, Any] = {
            "model": tensor_digest(model_state),
            "optimizer": tensor_digest(opt_state),
            "rng": [r["rng"] for r in per_rank],
        }
        if self.extras:
            prints["extras"] = {name: tensor_digest(x.checkpoint_state())
                                for name, x in self.extras.items()}
        return prints

    def _full_states(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's and the optimiser's state dicts, whole: gathered from the shards under
        ``--fsdp`` (a collective: every process calls it), as they are otherwise."""
        module = self.accelerator.unwrap_model(self.model)
        return full_state(module.state_dict()), full_state(self.optimizer.state_dict())

    def _gather(self, item: Any) -> list[Any]:
        if self.accelerator.num_processes == 1:
            return [item]
        from accelerate.utils import gather_object

        return gather_object([item])

    @staticmethod
    def _write_file(folder: Path, name: str, data: bytes) -> dict[str, Any]:
        _write(folder / name, data)
        _fsync(folder / name)
        return {name: file_entry(data)}

    def save(self) -> Path:
        """Write a checkpoint of the current state; return its folder.

        Raises :class:`RunFolderError` (on every process) when the disk refuses a write (full,
        read-only): the earlier checkpoints are left as they were.
        """
        acc = self.accelerator
        step = self.state.step
        name = step_dir_name(step)
        final, tmp, old = self.root / name, self.root / f".tmp-{name}", self.root / f".tmp-old-{name}"
        model_state, opt_state = self._full_states()
        self.state.fingerprints = self._fingerprints(model_state, opt_state)
        error = ""
        if acc.is_main_process:
            try:
                _mkdir(self.root)
                if tmp.exists():
                    _rmtree(tmp)
                _mkdir(tmp)
            except OSError as e:
                error = os_error_message(e, tmp)
        errors = self._gather(error)  # also the barrier: tmp exists for every process
        files: dict[str, Any] = {}
        if not any(errors):
            try:  # every process its own random generators
                files = self._write_file(tmp, f"random_states_{acc.process_index}.pt",
                                         torch_bytes(rng_state()))
            except OSError as e:
                error = os_error_message(e, tmp)
            gathered = self._gather((files, error))
            files = {k: v for f, _ in gathered for k, v in f.items()}
            errors = [e for _, e in gathered]
        if acc.is_main_process and not any(errors):
            try:
                files.update(self._write_file(tmp, MODEL_FILE, safetensors_bytes(model_state)))
                files.update(self._write_file(tmp, OPTIMIZER_FILE, torch_bytes(opt_state)))
                scaler = getattr(acc, "scaler", None)
                if scaler is not None:
                    files.update(self._write_file(tmp, SCALER_FILE,
                                                  torch_bytes(scaler.state_dict())))
                for name, extra in self.extras.items():
                    files.update(self._write_file(tmp, f"{name}.pt",
                                                  torch_bytes(extra.checkpoint_state())))
                meta = {
                    **self.meta,
                    "format": FORMAT_VERSION,
                    "step": step,
                    "epoch": self.state.epoch,
                    "micro_in_epoch": self.state.micro_in_epoch,
                    "images_seen": self.state.images_seen,
                    "world_size": acc.num_processes,
                    "accelerator_step": int(getattr(acc, "step", 0)),
                    "fingerprints": self.state.fingerprints,
                    "files": files,
                }
                part = tmp / (META + ".part")
                self._write_file(tmp, part.name,
                                 json.dumps(meta, indent=1, sort_keys=True).encode())
                _replace(part, tmp / META)
                _fsync(tmp)
                if final.exists():  # a re-save: keep the old copy until the new one is in place
                    _replace(final, old)
                    _replace(tmp, final)
                    _fsync(self.root)
                    _rmtree(old)
                else:
                    _replace(tmp, final)
                    _fsync(self.root)
                self._prune()
            except OSError as e:
                error = os_error_message(e, tmp)
        errors = self._gather(error)
        if any(errors):
            if acc.is_main_process:
                _rmtree(tmp)  # frees the space; a complete copy left as .tmp-old-* is recovered
            raise RunFolderError(f"checkpoint of step {step} not saved: "
                                 f"{next(e for e in errors if e)}; the earlier checkpoints in "
                                 f"{self.root} are intact (--resume auto continues from them)")
        self.last_saved_step = step
        logger.info("checkpoint saved: %s", final)
        return final

    def _prune(self) -> None:
        complete = complete_checkpoints(self.root)
        for _, path in complete[:-self.keep_last]:
            trash = self.root / f".trash-{path.name}"
            _replace(path, trash)  # atomic: never a half-deleted folder that looks complete
            _rmtree(trash)

    def load(self, path: str | Path) -> None:
        """Load a checkpoint (every file checked, nothing unpickled), then :meth:`verify`.

        Raises :class:`CheckpointFileError` naming the first file that is missing, does not
        match ``meta.json``, or is not in its safe format.
        """
        acc = self.accelerator
        path = Path(path)
        meta = read_meta(path)
        files = meta.get("files")
        if not isinstance(files, dict):
            raise CheckpointFileError(f"{path / META} lists no files: the checkpoint is damaged "
                                      "or was altered")
        module = acc.unwrap_model(self.model)
        weights = load_safetensors_bytes(read_verified(path, MODEL_FILE, files),
                                         path / MODEL_FILE)
        try:
            module.load_state_dict(shard_like(weights, module), strict=True)
        except RuntimeError as e:
            raise CheckpointFileError(f"{path / MODEL_FILE} does not fit the model "
                                      f"({str(e).splitlines()[0][:200]})") from None
        opt_state = load_torch_bytes(read_verified(path, OPTIMIZER_FILE, files),
                                     path / OPTIMIZER_FILE)
        declared = _declared_settings(self.optimizer)
        try:
            self.optimizer.load_state_dict(shard_optimizer_state(opt_state, self.optimizer))
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            raise CheckpointFileError(f"{path / OPTIMIZER_FILE} does not fit the optimiser "
                                      f"({type(e).__name__}: {e})") from None
        scaler = getattr(acc, "scaler", None)
        if scaler is not None:
            if SCALER_FILE in files:
                scaler.load_state_dict(load_torch_bytes(read_verified(path, SCALER_FILE, files),
                                                        path / SCALER_FILE))
            else:
                logger.warning("%s has no gradient scaler state: the fp16 loss scale restarts",
                               path)
        for name, extra in self.extras.items():
            if f"{name}.pt" in files:
                extra.load_checkpoint_state(load_torch_bytes(
                    read_verified(path, f"{name}.pt", files), path / f"{name}.pt"))
            else:
                logger.warning("%s has no %s state: it starts afresh", path, name)
        rng_name = f"random_states_{acc.process_index}.pt"
        if rng_name in files:
            set_rng_state(load_torch_bytes(read_verified(path, rng_name, files), path / rng_name),
                          path / rng_name)
        else:
            logger.warning("%s has no random generator states for process %d (saved by %s "
                           "processes)", path, acc.process_index, meta.get("world_size"))
        try:
            self.state.load_state_dict(meta)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointFileError(f"{path / META} lacks the loop position ({e})") from None
        if hasattr(acc, "step"):
            acc.step = int(meta.get("accelerator_step", 0))
        self.verify(path)
        _restore_declared_settings(self.optimizer, declared, path)

    def verify(self, path: str | Path = "") -> None:
        """Compare live fingerprints with the saved ones; raise :class:`ResumeMismatchError`."""
        saved = self.state.fingerprints
        if not saved:
            raise ResumeMismatchError(f"checkpoint {path} holds no fingerprints: cannot verify "
                                      "the resume")
        model_state, opt_state = self._full_states()
        rank = self.accelerator.process_index
        problems = []
        if self.accelerator.is_main_process:
            if tensor_digest(model_state) != saved["model"]:
                problems.append("model weights/buffers (incl. momentum encoder and queue)")
            if tensor_digest(opt_state) != saved["optimizer"]:
                problems.append("optimizer state")
        for name, extra in self.extras.items():
            digest = saved.get("extras", {}).get(name)
            if digest is not None and tensor_digest(extra.checkpoint_state()) != digest:
                problems.append(f"{name} state")
        rngs = saved.get("rng", [])
        if rank < len(rngs) and rng_digest() != rngs[rank]:
            problems.append(f"random number generator states of process {rank}")
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            problems = gather_object(problems)  # every process raises, none waits forever
        if problems:
            raise ResumeMismatchError(
                f"resume from {path} is not exact: {', '.join(problems)} differ from what was "
                "saved. The checkpoint may come from another software version or device; start "
                "a new run or investigate before continuing.")
        logger.info("resume verified: model, optimizer and RNG states equal the saved ones")


def _run_keys(group: dict[str, Any]) -> tuple[str, ...]:
    """The keys of ``group`` that are this run's settings: the declared ones and the optimiser
    flags' (:data:`~contrastive.engine.optim.DECLARED_KEYS`, ``FLAG_KEYS``), less the weight
    decay of a group whose decay a schedule writes every step (``"decays"``, set by
    :func:`~contrastive.engine.optim.set_weight_decay`: the saved value is the schedule's)."""
    from contrastive.engine.optim import DECLARED_KEYS, FLAG_KEYS

    return tuple(k for k in (*DECLARED_KEYS, *FLAG_KEYS)
                 if not (k == "weight_decay" and "decays" in group))


def _declared_settings(optimizer: Any) -> list[dict[str, Any]]:
    """Each param group's settings (:func:`_run_keys`: declared groups', optimiser flags') as
    this run built them."""
    return [{k: g[k] for k in _run_keys(g) if k in g} for g in optimizer.param_groups]


def _restore_declared_settings(optimizer: Any, declared: list[dict[str, Any]],
                               path: Path) -> None:
    """Give the loaded param groups this run's settings back: torch's ``load_state_dict``
    keeps the saved groups' keys, so a checkpoint of an older version (a DINOv2 last layer
    frozen by its gradient, no ``frozen_by_lr``) or of other flags (``--allow-config-change``
    with another ``--weight-decay``, ``--sgd-momentum``, ``--betas``) would otherwise go on
    with its own, silently. A difference is logged (the keys that differ)."""
    changed = []
    for g, mine in zip(optimizer.param_groups, declared):
        keys = _run_keys(g)
        saved = {k: g[k] for k in keys if k in g}
        mine = {k: v for k, v in mine.items() if k in keys}
        if saved != mine:
            differ = [k for k in keys if (k in saved) != (k in mine)
                      or (k in saved and saved[k] != mine[k])]
            was = {k: saved[k] for k in differ if k in saved}
            now = {k: mine[k] for k in differ if k in mine}
            changed.append(f"{g.get('name', '?')}: {was} -> {now}")
            for k in keys:
                g.pop(k, None)
            g.update(mine)
    if changed:
        logger.warning("%s: param-group settings differ from this run's, which are used: %s",
                       path, "; ".join(changed))


def iter_checkpoints(root: str | Path) -> Iterable[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    return [p for _, p in complete_checkpoints(root)]
