"""The hand-off from data to method: what a recipe's ``build_method(cfg, data)`` may know about
the data beyond its configuration.

What a method needs (its steps per epoch, the tokenizer's vocabulary, the task's labels, the
teacher) is known only after the data adapter has read the data, so the engine builds one
frozen :class:`DataInfo` then and gives it to the recipe: recipes read nothing from adapters
and patch nothing onto them, and configurations stay free of I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from contrastive.engine.config import RunConfig

if TYPE_CHECKING:
    from contrastive.augment.pipeline import Pipeline
    from contrastive.data.text_tasks import TextTask
    from contrastive.data.tokenizer import TextTokenizer
    from contrastive.engine.kits.base import HandOff
    from contrastive.methods.text_classifier import TextClassifier

__all__ = ["DataInfo", "data_info"]


@dataclass(frozen=True)
class DataInfo:
    """The run's data as the method sees it (built by :func:`data_info`)."""

    train_size: int  # examples in the training set
    steps_per_epoch: int  # optimiser steps in one pass at the global batch (last partial dropped)
    total_steps: int  # the budget: --steps, or --epochs x steps_per_epoch
    global_batch: int  # examples per optimiser step, all processes together
    micro_batch: int  # examples per process and micro-batch (accumulation splits a step)
    world_size: int  # processes
    num_classes: int | None = None  # image sets with labels; None when unlabelled
    tokenizer: TextTokenizer | None = None  # text and image-text: the run's tokenizer
    task: TextTask | None = None  # labelled text: the task (labels, regression, splits)
    teacher: TextClassifier | None = None  # labelled text: the teacher the recipe asked for
    pipeline: Pipeline | None = None  # images and image-text: the (augmentation) pipeline


def data_info(cfg: RunConfig, train_size: int, world_size: int = 1,
              kit: HandOff | None = None) -> DataInfo:
    """The :class:`DataInfo` of ``train_size`` examples under ``cfg``'s batch and budget in
    ``world_size`` processes; ``kit``: the kit's part (its adapter's ``handoff()``). A training
    set smaller than one batch is refused (the fix: a smaller ``--batch-size``)."""
    steps_per_epoch = train_size // cfg.batch_size
    if steps_per_epoch == 0:
        from contrastive.engine.loader import BatchSizeError

        raise BatchSizeError(f"the training set has {train_size} samples, fewer than one "
                         f"--batch-size {cfg.batch_size}: lower the batch size")
    return DataInfo(train_size=train_size, steps_per_epoch=steps_per_epoch,
                    total_steps=cfg.steps or steps_per_epoch * cfg.epochs,
                    global_batch=cfg.batch_size,
                    micro_batch=cfg.batch_size // (world_size * cfg.grad_accum_steps),
                    world_size=world_size, **(kit or {}))

