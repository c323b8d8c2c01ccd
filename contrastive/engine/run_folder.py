"""The run folder (``--output-dir``): can it be written, does it hold a run, its metrics log.

Problems here are the user's to fix (a path that is a file, a read-only folder, a full disk, a
run that would be overwritten), so they raise :class:`RunFolderError`, whose message is one
line naming the problem and the fix; the recipes print it without a traceback.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

from contrastive.records import CHECKPOINTS, ENCODER_FILE, STEP_PREFIX

__all__ = [
    "RunFolderError",
    "check_output_dir",
    "os_error_message",
    "existing_run_files",
    "read_metrics_records",
    "truncate_metrics",
]

logger = logging.getLogger(__name__)


class RunFolderError(RuntimeError):
    """A problem with the run folder or its checkpoints; the message names it and the fix."""


def os_error_message(e: OSError, path: Path, doing: str = "writing") -> str:
    """One line for an ``OSError`` while ``doing`` ``path``: what happened and what to do."""
    if e.errno == errno.ENOSPC or e.errno == errno.EDQUOT:
        return (f"no space left on the device while {doing} {path}: free some space or pass "
                "an --output-dir on another disk")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (f"cannot write {path} ({e.strerror or 'permission denied'}): make the folder "
                "writable or pass another --output-dir")
    if e.errno == errno.ENOTDIR or e.errno == errno.EEXIST:
        return (f"{path} cannot be a folder (a file of that name is in the way): pass another "
                "--output-dir")
    return f"{doing} {path} failed ({e.strerror or e}): check the folder or pass another --output-dir"


def check_output_dir(out: Path) -> None:
    """Fail early, with one line, when ``out`` cannot hold a run: it (or a parent) is a file,
    or the nearest existing folder is not writable (read-only file system, permissions)."""
    out = Path(out)
    probe_dir = out
    while not probe_dir.exists():
        if probe_dir.parent == probe_dir:
            break
        probe_dir = probe_dir.parent
    if probe_dir.exists() and not probe_dir.is_dir():
        what = "--output-dir" if probe_dir == out else f"--output-dir's parent {probe_dir}"
        raise RunFolderError(f"--output-dir {out}: {what} is a file, not a folder; pass a "
                             "folder path (a new one or an earlier run's)")
    probe = probe_dir / f".write-test-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise RunFolderError(f"--output-dir {out}: " + os_error_message(e, probe_dir)) from None


def existing_run_files(out: Path) -> list[str]:
    """What in ``out`` shows that a run already saved progress there (checkpoint folders, left
    over or damaged ones, ``encoder.pt``): starting a new run would overwrite it."""
    out = Path(out)
    found = []
    ckpts = out / CHECKPOINTS
    if ckpts.is_dir():
        found += sorted(f"{CHECKPOINTS}/{p.name}" for p in ckpts.iterdir()
                        if p.name.startswith((STEP_PREFIX, ".tmp-")))
    if (out / ENCODER_FILE).exists():
        found.append(ENCODER_FILE)
    return found


def read_metrics_records(path: Path) -> list[str]:
    """The lines of ``metrics.jsonl`` that parse as JSON objects; a torn line (power loss, full
    disk) is dropped with a warning instead of blocking every resume."""
    kept = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict):
            where = "its last line" if i == len(lines) else f"line {i}"
            logger.warning("%s: dropping %s, which is not a complete JSON record (a write was "
                           "cut short): %.80r", path, where, line)
            continue
        kept.append(line)
    return kept


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records of ``metrics.jsonl`` up to ``step`` (those after the checkpoint a run
    resumes from are written again), atomically: a kill here loses no record."""
    if not path.exists():
        return
    kept = [ln for ln in read_metrics_records(path) if _step_of(ln) <= step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(ln + "\n" for ln in kept))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _step_of(line: str) -> Any:
    step = json.loads(line).get("step", 0)
    return step if isinstance(step, (int, float)) else 0
