"""What every kit provides the engine: the data seam, the step hook, the artefacts.

A kit is one modality's front door (:mod:`contrastive.engine.kits`): its configuration, its
:class:`DataAdapter` (data set, collate, batch on the device, evaluators, artefacts, hand-off),
in one module. The engine knows kits only through these protocols.

A :class:`DataAdapter` owns everything modality-specific between the data spec and the method:

- ``prepare(cfg)``: read and check the kit's input before the run folder exists (a refusal is
  one line from :func:`contrastive.engine.run`); called again with an equal configuration it
  does nothing;
- ``method_building(cfg)``: a context the recipe's ``build_method`` runs in (the image kit's
  ``--init``: every backbone the method creates starts from those weights, before any copy);
- ``train_set(cfg, accelerator)``: the training data set (the engine wraps it in its seeded,
  resumable sampler and loader, :mod:`contrastive.engine.loader`);
- ``batch(sample, needs, sched, ...)``: one collated loader sample -> the method's ``batch``
  mapping, on the device (the image kit's device seam: batched augmentation there, and JPEG
  decoding with ``--decode device``);
- ``unit`` and ``count(batch)``: what throughput means (``images_per_s``, ``samples_per_s``,
  ``tokens_per_s``): ``count`` returns the micro-batch's units on the device (tokens: the sum of
  the attention mask) or None when a sample is the unit (then ``batch_size`` per step);
- ``prepare_method(cfg, method, device)``: the built method converted for this kind of run
  (the image kit's memory format, ``--channels-last``, resolved there when unset);
- ``param_groups(cfg, method)``: parameter groups the kit declares to the optimiser besides the
  method's own (:class:`~contrastive.methods.ParamGroup` s, after ``prepare_method``; the image
  kit's ``--init`` backbone at its lr multiplier and warm start,
  :mod:`~contrastive.engine.kits.finetune`). They are built like a method's groups
  (:func:`~contrastive.engine.optim.param_groups`: a method's group keeps its parameters, the
  kit's take the rest of theirs, the ungrouped rest comes last), so a checkpoint keeps their
  settings and a resume restores this run's; none by default;
- ``evaluators(cfg, world)``: the monitors this kind of run has by default
  (:mod:`contrastive.engine.evaluators`);
- ``artefacts``: what the run leaves besides checkpoints (:class:`Artefacts`; formats in
  :mod:`contrastive.records`), known once ``train_set`` has read the data;
- ``resolved()``: values resolved at run time, for ``config.json``;
- ``step_hook(cfg, module, train_set, device)``: this kind of run's work beside the loop's steps
  (:class:`StepHook`; the image runs': the online probe and the images counter), or None;
- ``embedding_map_data()``: the data whose held-out split the trackers' embedding map shows
  with the run's ``encoder.pt`` (image runs), or None;
- ``handoff()``: what the method may know of the data besides the step counts
  (:class:`HandOff`), the kit's fields of the :class:`~contrastive.engine.handoff.DataInfo`
  the recipe's ``build_method(cfg, data)`` gets;
- optionally ``collate(items)``: the loader's collate function (in the workers), when torch's
  default stacking does not fit (text: tokenise a batch and pad it to its longest sentence).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar

import torch
from torch import Tensor, nn

from contrastive.engine.checkpoint import TrainState
from contrastive.engine.config import RunConfig

if TYPE_CHECKING:
    from contrastive.augment.pipeline import Pipeline
    from contrastive.data.text_tasks import TextTask
    from contrastive.data.tokenizer import TextTokenizer
    from contrastive.methods.base import ParamGroup
    from contrastive.methods.text_classifier import TextClassifier

__all__ = ["BATCH_KEYS", "DataAdapter", "StepHook", "Artefacts", "HandOff", "KitDefaults", "KitOptionError"]

#: a kit's configuration type (its ``RunConfig`` subclass): what its methods are given
KitConfig = TypeVar("KitConfig", bound=RunConfig, contravariant=True)

BATCH_KEYS: dict[str, str] = {
    "views": "list of augmented views, tensors (N, C, H_v, W_v) of any count and sizes",
    "labels": "class labels (N,) int64, -1 where unknown",
    "indices": "data-set indices (N,) int64 of the images",
    "crop_boxes": "each view's crop box (N, V, 4) float32, (top, left, h, w) in the original "
                  "image, when the recipe's pipeline returns them (Pipeline(crop_boxes=True))",
}
"""The inputs :func:`~contrastive.engine.kits.image.make_batch` provides from the image loader (a method's schedules and the
data set's extra fields come on top; :func:`contrastive.engine.setup.method_inputs` checks a
method's ``needs`` against them)."""


class KitOptionError(ValueError):
    """A kit's option that the method the recipe built cannot take (e.g. backbone controls for a
    method with no ``--encoder`` backbone): :func:`~contrastive.engine.run.run` reports it in one
    line, as the options the method or the encoder refuses."""


class HandOff(TypedDict, total=False):
    """A kit's part of the hand-off to the method (:meth:`DataAdapter.handoff`): the fields of
    :class:`~contrastive.engine.handoff.DataInfo` only the data knows."""

    num_classes: int | None  # images with labels
    tokenizer: TextTokenizer  # text and image-text
    task: TextTask  # labelled text
    teacher: TextClassifier | None  # labelled text, when the recipe distils
    pipeline: Pipeline  # images and image-text


class Artefacts(Protocol[KitConfig]):
    """What a run leaves besides checkpoints (a kit's writer): ``write`` returns the main
    file; ``step_of(out)`` the step it was written at (None when absent or unreadable: a
    requeued finished run rewrites it)."""

    what: str  # what main_file holds, for the run's end line ("encoder weights in PATH")

    def write(self, out: Path, cfg: KitConfig, module: nn.Module, recipe: str,
              step: int) -> Path: ...

    def step_of(self, out: Path) -> int | None: ...

    def main_file(self, out: Path) -> Path: ...


class DataAdapter(Protocol[KitConfig]):
    """What the engine asks of a modality (module docstring), for runs of configuration type
    ``KitConfig``."""

    unit: str  # throughput unit: "images", "samples" or "tokens"

    @property
    def artefacts(self) -> Artefacts[KitConfig]: ...  # the writer (known after train_set)

    def prepare(self, cfg: KitConfig) -> None: ...

    def method_building(self, cfg: KitConfig) -> contextlib.AbstractContextManager[Any]: ...

    def train_set(self, cfg: KitConfig, accelerator: Any) -> Any: ...

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int,
              world: int = 1) -> dict[str, Any]: ...

    def count(self, batch: dict[str, Any]) -> Tensor | None: ...

    def prepare_method(self, cfg: KitConfig, method: nn.Module,
                       device: torch.device) -> nn.Module: ...

    def param_groups(self, cfg: KitConfig, method: nn.Module) -> list[ParamGroup]: ...

    def evaluators(self, cfg: KitConfig, world: int) -> list[Any]: ...

    def resolved(self) -> dict[str, Any]: ...

    def describe(self) -> str: ...

    def step_hook(self, cfg: KitConfig, module: torch.nn.Module, train_set: Any,
                  device: torch.device) -> StepHook | None: ...

    def embedding_map_data(self) -> str | None: ...

    def handoff(self) -> HandOff: ...


class StepHook(Protocol):
    """A kind of run's own work beside the loop's steps (an adapter's ``step_hook``; the image
    runs' :class:`~contrastive.engine.kits.image_probe.ImageStepHook`). It must leave the
    method's training as it is: no gradient into the method, no draw from the training's
    generators."""

    #: name -> an object with ``checkpoint_state()`` / ``load_checkpoint_state(state)``: saved
    #: with every checkpoint, restored on resume (the online probe's head)
    checkpointed: dict[str, Any]

    def after_micro_batch(self, batch: dict[str, Any], sample: tuple[Any, ...],
                          module: torch.nn.Module, accelerator: Any) -> None:
        """After each micro-batch's forward and backward (and the update, at a step's last):
        the method's ``batch`` and the loader's ``sample``."""

    def after_optimizer_step(self, state: TrainState) -> None:
        """After each optimiser step (``state.step`` counts it already)."""

    def log_fields(self, accelerator: Any) -> dict[str, Any]:
        """Fields for the step's metrics.jsonl record (every process calls it: a collective
        may sit here)."""


class KitDefaults(Generic[KitConfig]):
    """The :class:`DataAdapter` methods of a kind of run that reads nothing before the run
    folder, takes no part in building the method, converts nothing in it and declares no
    parameter group, has no work beside the loop's steps and no embedding map (image-text,
    text)."""

    def prepare(self, cfg: KitConfig) -> None:
        return None

    def method_building(self, cfg: KitConfig) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def prepare_method(self, cfg: KitConfig, method: nn.Module,
                       device: torch.device) -> nn.Module:
        return method

    def param_groups(self, cfg: KitConfig, method: nn.Module) -> list[ParamGroup]:
        return []

    def step_hook(self, cfg: KitConfig, module: torch.nn.Module, train_set: Any,
                  device: torch.device) -> StepHook | None:
        return None

    def embedding_map_data(self) -> str | None:
        return None
