"""The engine's data seam: what a run trains on, chosen by the recipe.

A :class:`DataAdapter` owns everything modality-specific between the data spec and the method:

- ``train_set(cfg, accelerator)``: the training data set (the engine wraps it in its seeded,
  resumable sampler and loader, :mod:`contrastive.engine.loader`);
- ``batch(sample, needs, sched, ...)``: one collated loader sample -> the method's ``batch``
  mapping, on the device (the image adapter's device seam: batched augmentation there, and
  JPEG decoding with ``--decode device``);
- ``unit`` and ``count(batch)``: what throughput means (``images_per_s``, ``samples_per_s``,
  ``tokens_per_s``): ``count`` returns the micro-batch's units on the device (tokens: the sum of
  the attention mask) or None when a sample is the unit (then ``batch_size`` per step);
- ``evaluators(cfg, world)``: the monitors this kind of run has by default
  (:mod:`contrastive.engine.evaluators`);
- ``artefacts``: what the run leaves besides checkpoints (:mod:`contrastive.engine.artefacts`,
  formats in :mod:`contrastive.records`);
- ``resolved()``: values resolved at run time, for ``config.json``;
- ``step_hook(cfg, module, train_set, device)``: this kind of run's work beside the loop's steps
  (:class:`StepHook`; the image runs': the online probe and the images counter), or None;
- ``embedding_map_data()``: the data whose held-out split the trackers' embedding map shows
  with the run's ``encoder.pt`` (image runs), or None;
- ``handoff()``: what the method may know of the data besides the step counts (tokenizer, task,
  teacher, number of classes, pipeline), the kit's fields of the
  :class:`~contrastive.engine.handoff.DataInfo` the recipe's ``build_method(cfg, data)`` gets;
- optionally ``collate(items)``: the loader's collate function (in the workers), when torch's
  default stacking does not fit (text: tokenise a batch and pad it to its longest sentence).

:class:`ImageAdapter` is today's image path (views from an augmentation pipeline);
:class:`ImageTextAdapter` serves image-text pairs (CLIP: one centre-cropped image in [0, 1] and
the caption's token ids); :class:`TextAdapter` serves examples of 1-3 sentences as token
tensors (SimCSE), with no image fields, and counts tokens; :class:`LabelledTextAdapter` serves
labelled sentences or sentence pairs (GLUE, the generated tasks) as (B, T) token tensors and
``labels`` (fine-tuning, LRC-BERT), with the teacher a recipe names; both are
:class:`TokenAdapter` s (the token batch on the device, tokens/s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.utils.data import Dataset

from contrastive.engine.artefacts import (
    Artefacts,
    ClassifierArtefacts,
    ClipArtefacts,
    EncoderArtefacts,
    SentenceModelArtefacts,
)
from contrastive.engine.checkpoint import TrainState
from contrastive.engine.config import DualEncoderConfig
from contrastive.engine.extras import add_extras, split_item
from contrastive.engine.loader import step_generator
from contrastive.engine.probe import ImageStepHook, build_probe
from contrastive.eval.teacher import labelled_classes

__all__ = ["BATCH_KEYS", "DataAdapter", "StepHook", "ImageAdapter", "ImageTextAdapter",
           "dual_encoder_kwargs", "TokenAdapter", "TextAdapter", "LabelledTextAdapter",
           "prepare_views", "make_batch"]

logger = logging.getLogger(__name__)

BATCH_KEYS: dict[str, str] = {
    "views": "list of augmented views, tensors (N, C, H_v, W_v) of any count and sizes",
    "labels": "class labels (N,) int64, -1 where unknown",
    "indices": "data-set indices (N,) int64 of the images",
}
"""The inputs :func:`make_batch` provides from the image loader (a method's schedules and the
data set's extra fields come on top; :func:`contrastive.engine.setup.method_inputs` checks a
method's ``needs`` against them)."""


class DataAdapter(Protocol):
    """What the engine asks of a modality (module docstring)."""

    unit: str  # throughput unit: "images", "samples" or "tokens"
    artefacts: Artefacts

    def train_set(self, cfg: Any, accelerator: Any) -> Any: ...

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int) -> dict[str, Any]: ...

    def count(self, batch: dict[str, Any]) -> Tensor | None: ...

    def evaluators(self, cfg: Any, world: int) -> list[Any]: ...

    def resolved(self) -> dict[str, Any]: ...

    def describe(self) -> str: ...

    def step_hook(self, cfg: Any, module: torch.nn.Module, train_set: Any,
                  device: torch.device) -> StepHook | None: ...

    def embedding_map_data(self) -> str | None: ...

    def handoff(self) -> dict[str, Any]: ...


class StepHook(Protocol):
    """A kind of run's own work beside the loop's steps (an adapter's ``step_hook``; the image
    runs' :class:`~contrastive.engine.probe.ImageStepHook`). It must leave the method's training
    as it is: no gradient into the method, no draw from the training's generators."""

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


class NothingBesideSteps:
    """The :class:`DataAdapter` methods of a kind of run that has no work beside the loop's
    steps and no embedding map (image-text, text)."""

    def step_hook(self, cfg: Any, module: torch.nn.Module, train_set: Any,
                  device: torch.device) -> StepHook | None:
        return None

    def embedding_map_data(self) -> str | None:
        return None


def prepare_views(views: list[Tensor], device: torch.device,
                  device_fn: Callable[..., list[Tensor]] | None, *, seed: int, step: int,
                  micro: int, rank: int, channels_last: bool = False,
                  float64: bool = False) -> list[Tensor]:
    """The loader's views on the device: augmented there in a batch (``device_fn``, seeded by
    the position in the run), in channels_last / float64 when asked."""
    views = [v.to(device, non_blocking=True) for v in views]
    if device_fn is not None:
        views = device_fn(views, generator=step_generator(device, seed, step, micro, rank))
    if channels_last:
        views = [v.contiguous(memory_format=torch.channels_last) for v in views]
    if float64:
        views = [v.double() for v in views]
    return views


def make_batch(views: list[Tensor], sample: tuple[Any, ...], needs: tuple[str, ...],
               sched: dict[str, float], device: torch.device) -> dict[str, Any]:
    """The method's batch: the prepared ``views``, the per-sample fields of the loader's
    ``sample`` = ``(views, labels, indices)`` (or ``(views, labels, fields, indices)`` from a
    data set with extra fields, e.g. CLIP's ``input_ids``) the method ``needs``, and the
    schedule values."""
    _, labels, indices, fields = split_item(sample)
    batch: dict[str, Any] = {"views": views, **sched}
    if "labels" in needs:
        batch["labels"] = labels.to(device, non_blocking=True)
    if "indices" in needs:
        batch["indices"] = indices.to(device, non_blocking=True)
    add_extras(batch, fields, needs, device)
    return batch


class ImageAdapter:
    """Views of images from an augmentation ``pipeline`` (:class:`contrastive.augment.Pipeline`):
    per image in the loader workers, or its worker half there and the rest batched on the device
    (``--batched-augment``). Throughput in images/s; the kNN monitor; ``encoder.pt``."""

    unit = "images"

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.device_fn: Callable[..., list[Tensor]] | None = None
        self.artefacts: Artefacts = EncoderArtefacts(pipeline)
        self._cfg: Any = None
        self._decode = "worker"
        self._told = False  # warned that the workers decoded a whole micro-batch
        self._size = 0
        self._num_classes: int | None = None

    def train_set(self, cfg: Any, accelerator: Any) -> Any:
        from contrastive.data import get_dataset

        self._cfg = cfg
        self._decode = getattr(cfg, "decode", "worker")
        if self._decode == "device" and cfg.batched_augment == "off":
            raise ValueError("--decode device needs the batched augmentation: use "
                             "--batched-augment on (or auto) with it")
        transform = self.pipeline
        if cfg.batched_augment != "off":
            transform, self.device_fn = self.pipeline.split(decode=self._decode)
        ds: Any = get_dataset(cfg.data, "train", transform=transform, strict=cfg.strict_data)
        self._size = len(ds)
        self._num_classes = labelled_classes(ds)
        logger.info("JPEG decoding: %s", "on the training device (the workers read the bytes "
                    "and draw the crop boxes; other images are cropped in the workers)"
                    if self._decode == "device" else "in the loader workers")
        if self._decode == "device" and accelerator.device.type == "cuda":
            logger.info("--decode device spends GPU time on decoding: on one H200 (2026-11-27) "
                        "moco_r50 trained at 2,819 images/s with it and 3,599 with the workers "
                        "decoding (benchmarks/RESULTS.md, 'GPU'); use it when the workers are "
                        "the limit (data_wait_frac in metrics.jsonl)")
        return ds

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int) -> dict[str, Any]:
        from contrastive.augment.device_decode import DeviceDecodeBatch, decode_and_crop

        cfg = self._cfg
        views = sample[0]
        if isinstance(views, DeviceDecodeBatch):
            if not len(views.encoded) and not self._told:
                self._told = True
                logger.warning("--decode device: this micro-batch came decoded from the workers "
                               "(the data set hands decoded images, or none of them is a plain "
                               "JPEG): --decode device pays only on JPEG files or shards")
            views = decode_and_crop(views, self.pipeline.view_sizes, device)
        views = prepare_views(views, device, self.device_fn, seed=cfg.seed, step=step,
                              micro=micro, rank=rank, channels_last=cfg.channels_last,
                              float64=cfg.float64)
        return make_batch(views, sample, needs, sched, device)

    def count(self, batch: dict[str, Any]) -> Tensor | None:
        return None

    def evaluators(self, cfg: Any, world: int) -> list[Any]:
        from contrastive.engine.evaluators import build_knn_evaluator

        knn = build_knn_evaluator(cfg, self.pipeline, world)
        return [] if knn is None else [knn]

    def resolved(self) -> dict[str, Any]:
        return {"batched_augment": self.device_fn is not None, "decode": self._decode,
                "train_images": self._size, "encoder_kwargs": self._cfg.encoder_options()}

    def describe(self) -> str:
        text = "augmentation " + ("batched on device" if self.device_fn is not None
                                  else "per image")
        return text + (", decode on device" if self._decode == "device" else "")

    def step_hook(self, cfg: Any, module: torch.nn.Module, train_set: Any,
                  device: torch.device) -> StepHook:
        return ImageStepHook(build_probe(cfg, module, train_set, device), cfg.batch_size)

    def embedding_map_data(self) -> str | None:
        return self._cfg.data

    def handoff(self) -> dict[str, Any]:
        return {"num_classes": self._num_classes, "pipeline": self.pipeline}


def eval_pipeline(image_size: int) -> Any:
    """The image-text runs' image transform: resize the shorter side and centre-crop to
    ``image_size`` (no augmentation: captions name colour and position, which crops and jitter
    would falsify), scaled to [0, 1]."""
    from contrastive.augment import get_pipeline

    return get_pipeline("eval", image_size=image_size, crop_pct=1.0, mean=(0.0, 0.0, 0.0),
                        std=(1.0, 1.0, 1.0))


class ImageTextAdapter(NothingBesideSteps):
    """Image-text pairs (:class:`contrastive.data.captions.ImageTextDataset`, e.g. ``--data
    shapes-captions | captions:ROOT | wds-captions:DIR``): uint8 centre crops from the workers,
    scaled to [0, 1] on the device, and the caption's ``input_ids`` / ``attention_mask``.
    Throughput in samples/s (pairs); the zero-shot / retrieval evaluator; ``clip.pt``,
    ``tokenizer/`` and the image tower's ``encoder.pt``.

    ``model_config(cfg, tokenizer)`` (from the recipe, on :func:`dual_encoder_kwargs`) is
    recorded in ``clip.pt``, so evaluation rebuilds the model from it. ``tokenizer`` is the
    training set's, known after :meth:`train_set` (handed to the recipe's ``build_method``).
    """

    unit = "samples"

    def __init__(self, model_config: Callable[[Any, Any], dict[str, Any]]) -> None:
        self.model_config = model_config
        self.tokenizer: Any = None
        self.pipeline: Any = None
        self.device_fn: Callable[..., list[Tensor]] | None = None
        self.artefacts: Artefacts = ClipArtefacts(self)
        self._cfg: Any = None
        self._size = 0

    def train_set(self, cfg: Any, accelerator: Any) -> Any:
        from contrastive.data import get_dataset

        self._cfg = cfg
        self.pipeline = eval_pipeline(cfg.image_size)
        transform, self.device_fn = self.pipeline.split()
        ds: Any = get_dataset(cfg.data, "train", transform=transform, strict=cfg.strict_data)
        self.tokenizer = getattr(ds, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError(f"--data {cfg.data} is not an image-text data set (captions): use "
                             "shapes-captions, captions:ROOT or wds-captions:DIR")
        self._size = len(ds)
        return ds

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int) -> dict[str, Any]:
        cfg = self._cfg
        views = prepare_views(sample[0], device, self.device_fn, seed=cfg.seed, step=step,
                              micro=micro, rank=rank, float64=cfg.float64)
        return make_batch(views, sample, needs, sched, device)

    def count(self, batch: dict[str, Any]) -> Tensor | None:
        return None

    def evaluators(self, cfg: Any, world: int) -> list[Any]:
        from contrastive.engine.evaluators import build_zeroshot_evaluator

        ev = build_zeroshot_evaluator(cfg, self.pipeline, self.tokenizer)
        return [] if ev is None else [ev]

    def resolved(self) -> dict[str, Any]:
        return {"train_samples": self._size, "model": self.model_config(self._cfg,
                                                                       self.tokenizer)}

    def describe(self) -> str:
        return "image-text pairs, centre crops on device"

    def handoff(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer, "pipeline": self.pipeline}


def dual_encoder_kwargs(cfg: DualEncoderConfig, tokenizer: Any) -> dict[str, Any]:
    """The two towers' keyword arguments of :class:`~contrastive.methods.CLIP` and its kin:
    the image encoder, a BERT text encoder of ``cfg``'s sizes over ``tokenizer``'s vocabulary
    (mean pooled), the shared width."""
    from contrastive.nn.text_encoders import bert_options

    return dict(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), text_encoder="bert",
                dim=cfg.dim, text_kwargs=bert_options(
                    **cfg.bert_sizes(), vocab_size=tokenizer.vocab_size,
                    max_position_embeddings=int(tokenizer.max_length), pooling="mean"))


class TextExamples(Dataset):
    """Examples of S sentences (a :class:`~contrastive.data.text_batches.SentenceGroups`) as the
    engine's loader wants items: a tuple (``(sentences,)``); the token tensors it yields are
    the data set's per-sample fields (``extra_keys``, checked against the method's ``needs``)."""

    extra_keys = ("input_ids", "attention_mask", "token_type_ids")
    seeded_items = False  # nothing random in an item: the loader skips the per-item seeding

    def __init__(self, groups: Any) -> None:
        self.groups = groups
        self.size = int(groups.size)

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int) -> tuple[tuple[str, ...]]:
        return (self.groups.groups[i],)


class TokenCollate:
    """The text loader's collate: items ``(sentences, index)`` -> ``(fields, indices)``, the
    B x S sentences tokenised in one call and padded to the batch's longest
    (:class:`~contrastive.data.text_batches.GroupCollate`: ``input_ids`` / ``attention_mask`` /
    ``token_type_ids`` (B, S, T)), as the official SimCSE's data collator pads per batch."""

    def __init__(self, tokenizer: Any) -> None:
        from contrastive.data.text_batches import GroupCollate

        self.group_collate = GroupCollate(tokenizer)

    def __call__(self, items: list[tuple[Any, ...]]) -> tuple[dict[str, Tensor], Tensor]:
        fields = self.group_collate([{"sentences": item[0]} for item in items])
        return fields, torch.tensor([item[-1] for item in items], dtype=torch.long)


class TokenAdapter(NothingBesideSteps):
    """What the text kits share: items tokenised in the loader workers (``collate``, set by
    ``train_set``) and padded per batch; the method's batch holds the token tensors it
    ``needs`` (and ``indices``), on the device; throughput in tokens/s (the attention mask's
    sum); the tokenizer handed to the method."""

    unit = "tokens"

    def __init__(self) -> None:
        self.tokenizer: Any = None
        self.collate: Callable[[list[tuple[Any, ...]]], Any] | None = None
        self._cfg: Any = None
        self._data: Any = None

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int) -> dict[str, Any]:
        fields, indices = sample
        batch: dict[str, Any] = dict(sched)
        if "indices" in needs:
            batch["indices"] = indices.to(device, non_blocking=True)
        add_extras(batch, fields, needs, device)
        return batch

    def count(self, batch: dict[str, Any]) -> Tensor | None:
        mask = batch.get("attention_mask")
        return None if mask is None else mask.sum()

    def handoff(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer}


class TextAdapter(TokenAdapter):
    """Text examples of 1-3 sentences (SimCSE: one sentence; (anchor, positive); (anchor,
    positive, hard negative)), tokenised in the loader workers and padded per batch; the
    method's batch holds the token tensors it ``needs`` ((B, S, T), on the device).
    Throughput in tokens/s (the attention mask's sum); the STS evaluator
    (:func:`~contrastive.engine.evaluators.build_sts_evaluator`: ``--eval``, ``--eval-every``);
    ``model/``, a Hugging Face folder (:class:`~contrastive.engine.artefacts.SentenceModelArtefacts`).

    ``groups(cfg)`` (from the recipe) returns the training examples, a
    :class:`~contrastive.data.text_batches.SentenceGroups`. The tokenizer is ``--tokenizer`` (a
    folder) or a WordPiece vocabulary of ``--vocab-size`` trained on the training sentences
    (deterministic, so every process builds the same one); it is known after :meth:`train_set`
    (handed to the recipe's ``build_method``).
    """

    def __init__(self, groups: Callable[[Any], Any]) -> None:
        super().__init__()
        self.groups = groups
        self.artefacts: Artefacts = SentenceModelArtefacts(self)

    def train_set(self, cfg: Any, accelerator: Any) -> Any:
        from contrastive.data.tokenizer import load_tokenizer, train_wordpiece

        self._cfg = cfg
        groups = self.groups(cfg)
        if cfg.tokenizer:
            self.tokenizer = load_tokenizer(cfg.tokenizer, max_length=cfg.max_length)
        else:
            corpus = [sentence for group in groups.groups for sentence in group]
            self.tokenizer = train_wordpiece(corpus, vocab_size=cfg.vocab_size,
                                             max_length=cfg.max_length)
        self.collate = TokenCollate(self.tokenizer)
        self._data = TextExamples(groups)
        return self._data

    def evaluators(self, cfg: Any, world: int) -> list[Any]:
        from contrastive.engine.evaluators import build_sts_evaluator

        ev = build_sts_evaluator(cfg, self.tokenizer)
        return [] if ev is None else [ev]

    def resolved(self) -> dict[str, Any]:
        assert self._data is not None
        return {"train_examples": len(self._data), "sentences_per_example": self._data.size,
                "vocab_size": int(self.tokenizer.vocab_size)}

    def describe(self) -> str:
        size = self._data.size if self._data is not None else 0
        return (f"{size} sentence(s) per example, tokenised in the loader (max length "
                f"{self._cfg.max_length if self._cfg is not None else '?'})")


class LabelledExamples(Dataset):
    """A task's items ``{"text_a", ["text_b"], "label"}`` as the engine's loader wants them: a
    tuple ``(item,)``; the collate (:class:`LabelledCollate`) makes the per-sample fields."""

    extra_keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
    seeded_items = False

    def __init__(self, items: Any) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[dict[str, Any]]:
        return (self.items[i],)


class LabelledCollate:
    """The labelled-text loader's collate: items ``(item, index)`` -> ``(fields, indices)``,
    the sentences (pairs) tokenised in one call and padded to the batch's longest
    (:meth:`~contrastive.data.tokenizer.TextTokenizer.collate`: ``input_ids`` /
    ``attention_mask`` / ``token_type_ids`` (B, T) and ``labels`` (B,))."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, items: list[tuple[Any, ...]]) -> tuple[dict[str, Tensor], Tensor]:
        fields = self.tokenizer.collate([item[0] for item in items])
        return fields, torch.tensor([item[-1] for item in items], dtype=torch.long)


class LabelledTextAdapter(TokenAdapter):
    """Labelled sentences or sentence pairs of a task (``--task``: GLUE under ``--glue-dir``,
    or a generated one; :func:`~contrastive.data.text_tasks.load_task`), tokenised in the loader
    and padded per batch: the method's batch holds ``input_ids`` / ``attention_mask`` /
    ``token_type_ids`` (B, T) and ``labels`` (B,) as it ``needs``. Throughput in tokens/s and
    the batch seam are :class:`TokenAdapter`'s. The evaluator is the task's official dev metric
    (:class:`~contrastive.engine.evaluators.GlueEvaluator`); the artefacts ``model/`` (the
    classifier: safetensors + JSON + tokenizer) and ``results.json`` (the dev metric)
    (:class:`~contrastive.engine.artefacts.ClassifierArtefacts`).

    The tokenizer is ``--tokenizer``, else the folder ``model_folder(cfg)`` names (the recipe's:
    an ``hf:`` model's, the LRC-BERT teacher's), else the generated tasks' own WordPiece.
    A recipe that distils names its teacher's folder (``teacher_folder(cfg)``, a classifier
    folder) and checks it against the task (``check_teacher(cfg, task, teacher)`` raises
    ``ValueError``); the teacher is handed to the method.
    :meth:`prepare` reads task, teacher and tokenizer; a recipe calls it before :func:`run` so
    that bad input fails before the run folder exists (the engine calls it otherwise).
    """

    def __init__(self, model_folder: Callable[[Any], str | None], *,
                 teacher_folder: Callable[[Any], str] | None = None,
                 check_teacher: Callable[[Any, Any, Any], None] | None = None) -> None:
        super().__init__()
        self.model_folder = model_folder
        self.teacher_folder = teacher_folder
        self.check_teacher = check_teacher
        self.task: Any = None
        self.teacher: Any = None
        self.evaluator: Any = None
        self.artefacts: Artefacts = ClassifierArtefacts(self)

    def prepare(self, cfg: Any) -> None:
        """Check and read ``--task``, the teacher and the tokenizer, in that order (errors name
        the flag to fix)."""
        from contrastive.data.text_tasks import (
            GENERATED_TASKS,
            check_task,
            generated_tokenizer,
            load_task,
        )
        from contrastive.data.tokenizer import load_tokenizer
        from contrastive.eval.classifier_folder import load_classifier

        key = check_task(cfg.task, cfg.glue_dir or None)
        teacher = None
        if self.teacher_folder is not None:
            teacher, _ = load_classifier(self.teacher_folder(cfg))
        folder = self.model_folder(cfg)
        if cfg.tokenizer or folder:
            tokenizer = load_tokenizer(str(cfg.tokenizer or folder), max_length=cfg.max_length)
        elif key in GENERATED_TASKS:
            tokenizer = generated_tokenizer(max_length=min(cfg.max_length, 64))
        else:
            raise ValueError(f"a 'bert' model with random weights on GLUE task {cfg.task!r} has "
                             "no tokenizer: pass --tokenizer FOLDER (a BERT vocab.txt / "
                             "tokenizer.json) or a checkpoint folder with its tokenizer "
                             "(--model hf:FOLDER)")
        self.task = load_task(cfg.task, cfg.glue_dir or None, n_train=cfg.n_train,
                              n_dev=cfg.n_dev, seed=cfg.data_seed, train_rows=cfg.train_rows,
                              held_out=cfg.held_out, eval_on=cfg.eval_on)
        if teacher is not None and self.check_teacher is not None:
            self.check_teacher(cfg, self.task, teacher)
        self.tokenizer, self.teacher = tokenizer, teacher
        self._cfg = cfg

    def train_set(self, cfg: Any, accelerator: Any) -> Any:
        if self.task is None:
            self.prepare(cfg)
        self._cfg = cfg
        self.collate = LabelledCollate(self.tokenizer)
        self._data = LabelledExamples(self.task.train)
        return self._data

    def evaluators(self, cfg: Any, world: int) -> list[Any]:
        from contrastive.engine.evaluators import GlueEvaluator

        self.evaluator = GlueEvaluator(self.task.dev, self.tokenizer, self.task.metric_task,
                                       every=cfg.eval_every, at_start=cfg.eval_at_start)
        return [self.evaluator]

    def resolved(self) -> dict[str, Any]:
        t = self.task
        return {"task": t.name, "train_examples": len(t.train), "dev_examples": len(t.dev),
                "evaluated_on": t.eval_split,
                "num_labels": t.num_labels, "regression": t.regression,
                "vocab_size": int(self.tokenizer.vocab_size)}

    def describe(self) -> str:
        pairs = "pairs" if len(self.task.train) and "text_b" in self.task.train[0] else \
            "sentences"
        return (f"task {self.task.name}: labelled {pairs}, tokenised in the loader (max length "
                f"{self._cfg.max_length})")

    def handoff(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer, "task": self.task, "teacher": self.teacher}
