"""``<output_dir>/run_state.json``: what a run is doing or how it ended, for scripts and schedulers.

``accelerate launch`` and ``torchrun`` turn any non-zero exit of a training process into 1, so
the exit status alone cannot tell "stopped, resume me" from "failed". The main process therefore
writes this small JSON file (atomically: a temporary file, fsync, rename)::

    {"state": "running",   "step": 120, "last_step": 4000, "pid": 4242, ...}
    {"state": "stopped",   "step": 130, "reason": "SIGTERM", "resumable": true,
     "checkpoint": "checkpoints/step_00000130", "exit_code": 75, ...}
    {"state": "completed", "step": 4000, "reason": "epochs" | "max_steps", "exit_code": 0, ...}
    {"state": "failed",    "step": 100, "error": "NonFiniteLossError: ...", "resumable": true,
     "checkpoint": "checkpoints/step_00000100", ...}

A run started directly (``python recipes/x.py``) also exits with :data:`EXIT_STOPPED` (75,
``EX_TEMPFAIL`` of ``sysexits.h``: "temporary failure, retry later") when it was stopped by
SIGTERM, SIGINT or its launcher's exit after saving a checkpoint; 0 when it completed; 1 when it
failed; 2 for bad command-line input.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["EXIT_STOPPED", "RUN_STATE_FILE", "write_run_state", "read_run_state"]

#: Exit status of a run stopped early with a checkpoint saved: ``--resume auto`` continues it.
EXIT_STOPPED = 75
RUN_STATE_FILE = "run_state.json"


def write_run_state(output_dir: str | Path, state: str, **fields: Any) -> Path:
    """Replace ``output_dir/run_state.json`` with ``{"state": state, **fields, "time": ...}``.

    ``state`` is one of ``running``, ``stopped``, ``completed``, ``failed``. The file is written
    to a temporary name, flushed to disk and renamed, so a reader never sees half a file.
    """
    if state not in ("running", "stopped", "completed", "failed"):
        raise ValueError(f"unknown run state {state!r}")
    path = Path(output_dir) / RUN_STATE_FILE
    payload = {"state": state, **fields,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": fields.get("pid", os.getpid())}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(payload, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read_run_state(output_dir: str | Path) -> dict[str, Any] | None:
    """The last state written in ``output_dir`` (None when there is none or it is unreadable)."""
    try:
        return json.loads((Path(output_dir) / RUN_STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
