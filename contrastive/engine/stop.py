"""Stopping a run cleanly: SIGTERM / SIGINT and the launcher's exit become a request to stop.

The loop polls :meth:`StopRequests.check` after each optimiser step; on a request it saves a
checkpoint and the process exits with 75 (:data:`~contrastive.engine.run_state.EXIT_STOPPED`).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

__all__ = ["StopRequests", "watch_parent"]

logger = logging.getLogger(__name__)


class StopRequests:
    """Why the run should stop early: a signal or the launcher's exit (``reason``, else None).

    SIGTERM / SIGINT only set the reason; the loop saves a checkpoint after the current step and
    the run exits with status 75. Repeated SIGTERMs are ignored (Slurm signals every process of
    a job step and torchrun forwards the same signal again; a scheduler's SIGKILL follows
    anyway), also after the loop, until the process exits with 75; a second SIGINT (Ctrl-C
    twice) stops at once, without saving. A signal the process
    was started ignoring (``nohup``, background jobs) stays ignored.

    ``watch_parent``: :meth:`check` also reports the exit of the process that started this one
    (its parent pid changes when it is re-parented). One ``os.getppid()`` call per check: no
    host sync, no I/O.
    """

    def __init__(self, watch_parent: bool) -> None:
        self.reason: str | None = None
        self._parent = os.getppid() if watch_parent else None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.reason is None:
            self.reason = name
            logger.warning("received %s: saving a checkpoint after this step, then exiting "
                           "(%s)", name, "press Ctrl-C again to stop immediately, without "
                           "saving" if signum == signal.SIGINT else "further SIGTERMs are "
                           "ignored; SIGKILL stops immediately")
        if signum == signal.SIGINT:  # the next one stops immediately
            signal.signal(signum, self._old.get(signum, signal.default_int_handler))

    def check(self) -> str | None:
        """The reason to stop, if any (also polls the parent process when watched)."""
        if self.reason is None and self._parent is not None and os.getppid() != self._parent:
            self.reason = f"launcher exited (parent pid {self._parent})"
            logger.warning("%s: saving a checkpoint after this step, then exiting",
                           self.reason)
        return self.reason

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            if sig == signal.SIGTERM and self.reason is not None and old is signal.SIG_DFL:
                # the run is stopping: a late copy of the SIGTERM (Slurm signals every process,
                # a launcher forwards another) must not kill it before it exits with 75. A
                # Python handler, not SIG_IGN, so that processes started later do not inherit it
                signal.signal(sig, _ignore_late_sigterm)
                _ignore_sigterm_at_exit.register()
                continue
            signal.signal(sig, old)


def _ignore_late_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM after a stop was requested: the run has saved and is exiting; ignore it."""


class _IgnoreSigtermAtExit:
    """At interpreter exit CPython puts every signal with a Python handler back to the default
    action, which would let a late SIGTERM kill a stopped run during its last milliseconds
    (exit -15 instead of 75). SIG_IGN survives that reset: switch to it at exit, when the
    late-SIGTERM handler is still the one in place (so an embedding process that restored its
    own handler is left alone)."""

    registered = False

    def register(self) -> None:
        if not self.registered:
            import atexit

            atexit.register(self)
            self.registered = True

    def __call__(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) is _ignore_late_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread, or no signals here
            pass


_ignore_sigterm_at_exit = _IgnoreSigtermAtExit()


def watch_parent(setting: str) -> bool:
    """``--stop-if-orphaned``: auto = on when accelerate launch or torchrun started us."""
    if setting == "auto":
        return any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "ACCELERATE_USE_CPU"))
    return setting == "on"
