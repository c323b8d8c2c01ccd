"""The one call a recipe makes: parse the command line into its config, then train."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from contrastive.engine.config import TrainConfig, parse_config
from contrastive.engine.trainer import TrainResult, train

__all__ = ["run", "setup_logging"]


def setup_logging(level: int = logging.INFO) -> None:
    """``time level name: message`` on stderr (the recipes are programs; the library only logs).
    Other processes than the main one are silenced by the trainer."""
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("accelerate").setLevel(max(level, logging.WARNING))  # per-file save logs


def run(config_cls: type[TrainConfig], build_method: Callable[[Any], nn.Module],
        build_pipeline: Callable[[Any], Any], *, argv: Sequence[str] | None = None,
        name: str | None = None) -> TrainResult:
    """Parse ``argv`` (default ``sys.argv[1:]``) into ``config_cls`` and :func:`train` it.

    ``name`` (default: the calling script's file name) names the run folder ``runs/<name>`` and
    is recorded in ``config.json`` and checkpoints (a checkpoint of another recipe is refused).
    Bad input (unknown flag, impossible value) exits with status 2 before anything is built;
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
    result = train(cfg, build_method, build_pipeline, recipe=name)
    if result.exit_code:
        logging.getLogger(__name__).warning(
            "stopped (%s) at step %d with a checkpoint: continue with --resume auto "
            "(exit status %d)", result.stop_reason, result.step, result.exit_code)
        raise SystemExit(result.exit_code)
    return result
