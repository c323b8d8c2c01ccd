"""The one call a recipe makes: parse the command line into its config, then train.

:func:`run` parses and trains. A recipe that reads its own input before training (a task, a
teacher folder) wraps those reads in :func:`bad_input` and runs as a script through
:func:`cli`: a missing file or an impossible value is then one line ``prog: error: ...`` with
exit status 2 (as argparse reports a bad flag), before the run folder exists; called
in-process (tests), the same errors raise as they are."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from contrastive.engine.config import RunConfig, parse_config
from contrastive.engine.grad_cache import GradCacheError
from contrastive.engine.handoff import DataInfo
from contrastive.engine.kits.base import DataAdapter, KitOptionError
from contrastive.engine.loader import BatchSizeError
from contrastive.engine.run_folder import RunFolderError, os_error_message
from contrastive.engine.setup import MethodOptionError
from contrastive.engine.step import ClipPartsError
from contrastive.engine.trainer import TrainResult, kit_of, train
from contrastive.eval.init import InitError
from contrastive.nn.checkpointing import GradCheckpointingError
from contrastive.nn.encoders import EncoderArgumentError
from contrastive.nn.text_encoders import UnsafeCheckpointError

__all__ = ["run", "setup_logging", "bad_input", "cli"]

# what bad_input marks as the user's input
_INPUT_ERRORS = (ValueError, OSError, UnsafeCheckpointError)
# a full disk, a read-only folder: the user's to fix, reported in one line (exit status 1)
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def setup_logging(level: int = logging.INFO) -> None:
    """``time level name: message`` on stderr (the recipes are programs; the library only logs).
    Other processes than the main one are silenced by the trainer."""
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("accelerate").setLevel(max(level, logging.WARNING))  # per-file save logs


def run(config_cls: type[RunConfig], build_method: Callable[[Any, DataInfo], nn.Module],
        build_pipeline: Callable[[Any], Any] | None = None, *,
        adapter: DataAdapter[Any] | None = None, argv: Sequence[str] | None = None,
        name: str | None = None) -> TrainResult:
    """Parse ``argv`` (default ``sys.argv[1:]``) into ``config_cls`` and :func:`train` it (on
    images augmented by ``build_pipeline``, or on what the data ``adapter`` serves).

    ``name`` (default: the calling script's file name) names the run folder ``runs/<name>`` and
    is recorded in ``config.json`` and checkpoints (a checkpoint of another recipe is refused).
    Bad input (unknown flag, impossible value) exits with status 2 before anything is built,
    a model file that would run code to load (a pickle) with status 2 when it is refused;
    errors found while setting up (missing data, incompatible checkpoint) raise before the first
    training step. A run stopped by SIGTERM / SIGINT or by its launcher's exit saves a
    checkpoint and exits with status 75 (:data:`~contrastive.engine.run_state.EXIT_STOPPED`,
    "resumable"); ``run_state.json`` in the output folder says the same for launchers that
    turn every non-zero status into 1.
    """
    name = name or Path(sys.argv[0]).stem or "run"
    cfg = parse_config(config_cls, argv, prog=f"{name}.py")
    setup_logging()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if (build_pipeline is None) == (adapter is None):
        raise TypeError("run: give build_pipeline (images) or adapter, not both")
    kit = kit_of(build_pipeline, adapter, cfg)
    try:  # the kit's input (--init, --task, a teacher), before the run folder: one line
        kit.prepare(cfg)
    except _INPUT_ERRORS as e:
        sys.stderr.write(f"{name}.py: error: {e}\n")
        raise SystemExit(2) from None
    try:
        result = train(cfg, build_method, adapter=kit, recipe=name)
    except (RunFolderError, GradCacheError, ClipPartsError, EncoderArgumentError,
            InitError, KitOptionError, GradCheckpointingError, BatchSizeError,
            MethodOptionError) as e:
        # the folder, a checkpoint file, options the method or the encoder refuses: one line
        raise SystemExit(f"{name}: error: {e}") from None
    except UnsafeCheckpointError as e:  # the user's model file, refused unread: bad input
        sys.stderr.write(f"{name}.py: error: {e}\n")
        raise SystemExit(2) from None
    except OSError as e:
        if e.errno not in _DISK_ERRNOS:
            raise
        path = Path(e.filename) if e.filename else Path(cfg.output_dir or ".")
        raise SystemExit(f"{name}: error: {os_error_message(e, path)}") from None
    close_process_group()  # not after an error: a rank still in a collective would hang it
    if result.exit_code:
        logging.getLogger(__name__).warning(
            "stopped (%s) at step %d with a checkpoint: continue with --resume auto "
            "(exit status %d)", result.stop_reason, result.step, result.exit_code)
        raise SystemExit(result.exit_code)
    return result


@contextlib.contextmanager
def bad_input() -> Iterator[None]:
    """Mark the ``ValueError`` / ``OSError`` / ``UnsafeCheckpointError`` raised inside as the
    user's input (a missing file, an unknown task, a folder that is not one, a pickle that would
    run code), which :func:`cli` reports in one line. Errors of training itself keep their
    traceback."""
    try:
        yield
    except _INPUT_ERRORS as e:
        e.bad_input = True  # type: ignore[union-attr]
        raise


def cli(main: Callable[[list[str] | None], Any], prog: str,
        argv: list[str] | None = None) -> int:
    """Run ``main(argv)`` as a program: an error marked by :func:`bad_input` is one line
    ``prog: error: ...`` on stderr and exit status 2; returns 0 otherwise."""
    try:
        main(argv)
    except _INPUT_ERRORS as e:
        if not getattr(e, "bad_input", False):
            raise
        sys.stderr.write(f"{prog}: error: {e}\n")
        return 2
    return 0


def close_process_group() -> None:
    """Destroy the default process group of a multi-process run that ended normally (finished
    or stopped with its checkpoint), before the interpreter exits: left to exit-time
    destruction, gloo's worker threads can abort a finished rank ("terminate called without an
    active exception", exit -6: seen once here, and pytorch/pytorch issue #190489, PR #179291).
    Not after an error (torchtitan PR #1342: a rank still in a collective would hang). A no-op
    in one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
