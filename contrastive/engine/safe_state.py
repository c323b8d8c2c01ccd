"""Checkpoint files that cannot run code when they are read.

A checkpoint folder may come from someone else (a shared run, a downloaded resume point), so
nothing in it is ever unpickled: tensors go to safetensors (``model.safetensors``), other state
(optimiser, gradient scaler, random generators) to torch files read with
``torch.load(weights_only=True)`` -- whose unpickler only builds tensors and plain containers --
and positions/config to JSON (``meta.json``). A file that is not what it claims fails with
:class:`CheckpointFileError`, one line naming the file, before anything it holds is used.

Every file's size and SHA-256 are listed in ``meta.json`` (written last), so a reader also
notices a truncated or altered file, and a save interrupted after its last write can be
recognised as complete (see :func:`verify_files`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contrastive.engine.run_folder import RunFolderError
from contrastive.records import META

__all__ = [
    "CheckpointFileError",
    "file_entry",
    "verify_files",
    "read_verified",
    "read_json",
    "torch_bytes",
    "load_torch_bytes",
    "safetensors_bytes",
    "load_safetensors_bytes",
    "rng_state",
    "set_rng_state",
]


class CheckpointFileError(RunFolderError):
    """A checkpoint file is missing, altered, truncated, or not in its safe format."""


def file_entry(data: bytes) -> dict[str, Any]:
    """The manifest entry of a file's content: ``{"bytes": size, "sha256": hex}``."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_json(path: Path) -> Any:
    """A JSON file, or :class:`CheckpointFileError` naming it (never a traceback of the parser)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise CheckpointFileError(f"{path} is missing: the checkpoint is incomplete; resume "
                                  "from another checkpoint folder") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointFileError(f"{path} is not a JSON file ({type(e).__name__}: "
                                  f"{_first_line(e)}): the checkpoint is damaged or was "
                                  "altered; resume from another checkpoint folder") from None


def read_verified(folder: Path, name: str, manifest: dict[str, Any]) -> bytes:
    """The bytes of ``folder/name`` after checking its size and SHA-256 against ``manifest``."""
    path = folder / name
    expected = manifest.get(name)
    if not isinstance(expected, dict):
        raise CheckpointFileError(f"{path}: not listed in {folder / 'meta.json'}; the "
                                  "checkpoint is damaged or was altered")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointFileError(f"{path} is missing: the checkpoint is incomplete; resume "
                                  "from another checkpoint folder") from None
    if file_entry(data) != {"bytes": expected.get("bytes"), "sha256": expected.get("sha256")}:
        raise CheckpointFileError(f"{path} does not match the size/SHA-256 recorded in "
                                  f"{folder / 'meta.json'}: the file is damaged or was altered; "
                                  "resume from another checkpoint folder")
    return data


def verify_files(folder: Path) -> bool:
    """True when ``folder/meta.json`` parses and lists files that all match (size and hash)."""
    try:
        meta = read_json(folder / META)
        files = meta["files"]
        if not isinstance(files, dict) or not files:
            return False
        for name in files:
            read_verified(folder, name, files)
    except (CheckpointFileError, KeyError, TypeError, OSError):
        return False
    return True


def _first_line(e: BaseException) -> str:
    """The informative line of an error (torch's weights-only refusal names the global)."""
    found = re.search(r"Unsupported (global: GLOBAL \S+|operand \d+)", str(e))
    if found:
        return f"it holds a pickled object or code: unsupported {found.group(1)}"
    text = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return text[0][:200] if text else type(e).__name__


def torch_bytes(obj: Any) -> bytes:
    """``torch.save(obj)`` into memory (tensors and plain containers only, see the loader)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def load_torch_bytes(data: bytes, path: Path) -> Any:
    """``torch.load(weights_only=True)`` of ``data`` (read from ``path``): tensors, numbers,
    strings and containers only; anything else is refused without being run."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle with code in it, or not a torch file at all
        raise CheckpointFileError(f"{path} cannot be read with torch.load(weights_only=True) "
                                  f"({type(e).__name__}: {_first_line(e)}): refusing it; the "
                                  "checkpoint is damaged or was altered") from None


def safetensors_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """A state dict as safetensors bytes (CPU copies: shared storage is allowed in the input)."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()})


def load_safetensors_bytes(data: bytes, path: Path) -> dict[str, torch.Tensor]:
    """Parse safetensors ``data`` (read from ``path``), or :class:`CheckpointFileError`."""
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as e:
        raise CheckpointFileError(f"{path} is not a safetensors file ({type(e).__name__}: "
                                  f"{_first_line(e)}): the checkpoint is damaged or was "
                                  "altered") from None


# ----------------------------------------------------------------------------------------------
# random generators as tensors and plain values (torch's weights-only unpickler reads them)


def rng_state() -> dict[str, Any]:
    """This process's torch (CPU, CUDA), ``random`` and numpy generator states."""
    version, internal, gauss = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": {"name": str(name), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


@contextlib.contextmanager
def kept_rng(path: Path) -> Iterator[None]:
    """Run the block, then put this process's random generators back as they were: work beside
    training (an evaluation, an export into ``best/`` on the main process alone) must not move
    the generators training draws from, or a resume (and the other processes) would drift.
    ``path`` names the run in errors."""
    kept = rng_state()
    try:
        yield
    finally:
        set_rng_state(kept, path)


def set_rng_state(state: dict[str, Any], path: Path) -> None:
    """Restore :func:`rng_state`'s output (read from ``path``, named in errors)."""
    try:
        torch.set_rng_state(state["torch"])
        version, internal, gauss = state["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))
        npy = state["numpy"]
        np.random.set_state((npy["name"], npy["key"].numpy().astype(np.uint32), int(npy["pos"]),
                             int(npy["has_gauss"]), float(npy["cached_gaussian"])))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise CheckpointFileError(f"{path} does not hold random generator states "
                                  f"({type(e).__name__}: {_first_line(e)})") from None
