"""The labelled-text kit: runs on labelled sentences or sentence pairs (fine-tuning a
classifier, distilling one: recipes/bert_finetune.py, recipes/lrc_bert.py).

- configuration: :class:`LabelledTextConfig` (the task, a BERT's sizes, BERT's fine-tuning
  optimiser);
- data: :class:`LabelledTextAdapter` (the task, its tokenizer and the teacher the recipe names,
  read and checked by :meth:`~LabelledTextAdapter.prepare` before the run folder exists;
  :class:`LabelledExamples` tokenised in the loader by :class:`LabelledCollate`);
- evaluators: :class:`GlueEvaluator` (the task's official dev metric);
- artefacts: :class:`ClassifierArtefacts`, ``model/`` (a Hugging Face classifier folder) and
  ``results.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from contrastive.engine.fields import as_flag, help_field, override
from contrastive.engine.kits.base import Artefacts, HandOff
from contrastive.engine.kits.text import BertOptimiser, BertSizes, TokenAdapter
from contrastive.records import CLASSIFIER_FILE, MODEL_DIR, RESULTS_FILE

if TYPE_CHECKING:
    from contrastive.data.text_tasks import TextTask
    from contrastive.methods.text_classifier import TextClassifier

__all__ = ["LabelledTextConfig", "LabelledTextAdapter", "LabelledExamples", "LabelledCollate",
           "GlueEvaluator", "ClassifierArtefacts"]

#: a recipe's labelled-text configuration
C = TypeVar("C", bound="LabelledTextConfig")


@dataclass
class LabelledTextConfig(BertSizes, BertOptimiser):
    """A run on labelled sentences or sentence pairs (fine-tuning an encoder with a prediction
    layer, distilling one): the task (GLUE, read from ``--glue-dir``, or a generated one), the
    sizes of a BERT built from a configuration, and BERT's fine-tuning optimiser
    (:class:`~contrastive.engine.kits.text.BertOptimiser`). The evaluator is the task's official
    dev metric (``glue_*`` in metrics.jsonl). The recipes set the model flags' names and
    sizes."""

    task: str = help_field("generated", "a GLUE task (sst2, mnli, stsb, ...; with --glue-dir) "
                           "or generated | generated-nli | generated-sts")
    glue_dir: str = help_field("", "folder of the GLUE TSV files (glue_data: SST-2/, MNLI/ ...)")
    n_train: int = help_field(4000, "generated task: training examples")
    n_dev: int = help_field(1000, "generated task: dev examples (the independent test stream)")
    train_rows: int = help_field(0, "GLUE: train on a stratified subset of this many training "
                                 "rows (0 = all; drawn with --data-seed)")
    held_out: int = help_field(0, "GLUE: hold this many training rows out (stratified, "
                               "--data-seed), never trained on")
    eval_on: str = help_field("dev", "what the GLUE evaluator scores: dev | held_out (the "
                              "held-out training rows: choose hyper-parameters there, report dev)",
                              choices=("dev", "held_out"))
    tokenizer: str = override(
        "", "folder with tokenizer.json or vocab.txt; empty = the model folder's, or the "
        "generated tasks' own WordPiece")
    keep_layers: str = help_field(
        "", "hf: model: keep only these 0-based layers, e.g. 1,3,5 (a student initialised from "
        "a deeper model's layers, as DistilBERT's)")
    dropout: float = override(0.1, "also the prediction layer's")
    eval_at_start: bool = override(False, "also evaluate before training")
    # BERT fine-tuning (Devlin et al. 2019; the Hugging Face Trainer's AdamW)
    steps: int = override(1000, "optimiser steps (the budget; 0 = --epochs decide: "
                          "--steps 0 --epochs N)")
    batch_size: int = override(32, "GLOBAL examples per optimiser step")
    lr: float = override(2e-5, "peak AdamW learning rate, absolute")
    num_workers: int = override(0, "loader workers (tokenising is cheap: 0 = in the main "
                                "process)")
    log_every: int = 50

    def validate(self) -> None:
        """The checks of every text run, the warm-up fraction, the sizes and the task's."""
        super().validate()
        self.check_bert_sizes()
        for name in ("n_train", "n_dev"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{as_flag(name)} must be positive, got {getattr(self, name)}")
        if self.train_rows < 0 or self.held_out < 0:
            raise ValueError(f"--train-rows and --held-out must be >= 0, got {self.train_rows}, "
                             f"{self.held_out}")
        if self.keep_layers and not all(p.strip().isdigit() for p in self.keep_layers.split(",")):
            raise ValueError(f"--keep-layers must be 0-based layer numbers like 1,3,5, got "
                             f"{self.keep_layers!r}")
        if self.eval_on == "held_out" and not self.held_out:
            raise ValueError("--eval-on held_out needs --held-out N (training rows to hold out)")


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


class GlueEvaluator:
    """The official GLUE dev metric(s) of ``task`` (a GLUE name; the generated tasks are scored
    as SST-2, MNLI, STS-B) of ``module.predict`` on ``dataset`` (items ``{"text_a",
    ["text_b"], "label"}``) every ``every`` optimiser steps, in eval mode
    (:func:`contrastive.methods.text_classifier.evaluate`). Every process computes the same
    figures on its own (no collective, so no process can wait on another that evaluates
    later). ``last``: the latest metrics, which the run's ``results.json`` reports."""

    name, per = "glue", "step"

    def __init__(self, dataset: Any, tokenizer: Any, task: str, *, every: int = 0,
                 at_start: bool = False, batch_size: int = 64) -> None:
        self.dataset, self.tokenizer, self.task = dataset, tokenizer, task
        self.every, self.at_start, self.batch_size = every, at_start, batch_size
        self.last: dict[str, float] | None = None
        # imported now, before the run seeds or restores its generators: importing
        # scikit-learn's metrics imports rich, which draws from Python's global `random`
        # (rich/style.py), so a first import mid-run would make a resumed run's Python random
        # state differ from the uninterrupted run's
        import sklearn.metrics  # noqa: F401

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        from contrastive.eval.glue import evaluate

        res = evaluate(module, self.dataset, self.tokenizer, self.task,
                       batch_size=self.batch_size)
        self.last = {f"glue_{k}": round(v, 6) for k, v in res.items()}
        return dict(self.last)


class ClassifierArtefacts:
    """``model/`` (:func:`~contrastive.eval.classifier_folder.save_classifier` of the method
    as a classifier, :func:`~contrastive.methods.text_classifier.as_classifier`: a fine-tuned
    teacher, or an LRC-BERT student with its prediction layer) with the training tokenizer, and
    ``results.json``: ``{"task", "step", "dev"}`` (the GLUE evaluator's latest metrics; the end
    ones for a finished run) plus ``teacher_dev`` for a distilled student (``teacher``: its
    folder, empty when the run distils nothing)."""

    what = "the classifier's settings (weights and tokenizer beside them)"

    def __init__(self, task: TextTask, tokenizer: Any, evaluator: GlueEvaluator,
                 teacher: str = "") -> None:
        self.task, self.tokenizer, self.evaluator, self.teacher = task, tokenizer, evaluator, \
            teacher

    def write(self, out: Path, cfg: LabelledTextConfig, module: nn.Module, recipe: str,
              step: int) -> Path:
        from contrastive.data.glue import GLUE_TASKS
        from contrastive.eval.classifier_folder import save_classifier
        from contrastive.methods.text_classifier import as_classifier

        task, dev, teacher = self.task, self.evaluator.last, self.teacher
        info: dict[str, Any] = {"task": task.name, "step": step, "recipe": recipe, "dev": dev}
        result: dict[str, Any] = {"task": task.name, "step": step, "dev": dev}
        if task.eval_split != "dev":  # the metrics are of held-out training rows, not dev
            info["held_out"] = result["held_out"] = info.pop("dev")
            del result["dev"]
        if teacher:
            info["distilled_from"] = str(teacher)
            meta = Path(teacher) / CLASSIFIER_FILE
            result["teacher_dev"] = json.loads(meta.read_text()).get("dev") \
                if meta.is_file() else None
        out.mkdir(parents=True, exist_ok=True)
        labels = getattr(GLUE_TASKS.get(task.metric_task), "label_names", None)
        save_classifier(out / MODEL_DIR, as_classifier(module), self.tokenizer,
                        label_names=labels if labels and len(labels) == task.num_labels
                        else None, **info)
        (out / RESULTS_FILE).write_text(json.dumps(result, indent=1))
        return self.main_file(out)

    def step_of(self, out: Path) -> int | None:
        try:
            step = json.loads(self.main_file(out).read_text()).get("step")
        except (OSError, ValueError):
            return None
        return step if isinstance(step, int) else None

    def main_file(self, out: Path) -> Path:
        return out / MODEL_DIR / CLASSIFIER_FILE
class LabelledTextAdapter(TokenAdapter[C]):
    """Labelled sentences or sentence pairs of a task (``--task``: GLUE under ``--glue-dir``,
    or a generated one; :func:`~contrastive.data.text_tasks.load_task`), tokenised in the loader
    and padded per batch: the method's batch holds ``input_ids`` / ``attention_mask`` /
    ``token_type_ids`` (B, T) and ``labels`` (B,) as it ``needs``. Throughput in tokens/s and
    the batch seam are :class:`TokenAdapter`'s. The evaluator is the task's official dev metric
    (:class:`GlueEvaluator`); the artefacts ``model/`` (the classifier: safetensors + JSON +
    tokenizer) and ``results.json`` (the dev metric) (:class:`ClassifierArtefacts`).

    The tokenizer is ``--tokenizer``, else the folder ``model_folder(cfg)`` names (the recipe's:
    an ``hf:`` model's, the LRC-BERT teacher's), else the generated tasks' own WordPiece.
    ``weights_folder(cfg)``: the pretrained model's folder the method starts from (an ``hf:``
    model; None for random weights), whose pickled weights are refused here, unread, if they
    would run code. A recipe that distils names its teacher's folder (``teacher_folder(cfg)``,
    a classifier folder) and checks it against the task (``check_teacher(cfg, task, teacher)``
    raises ``ValueError``); the teacher is handed to the method.
    :meth:`prepare` reads task, teacher and tokenizer; a recipe calls it before :func:`run` so
    that bad input fails before the run folder exists (the engine calls it otherwise).
    """

    artefacts: Artefacts[C]  # ClassifierArtefacts, from train_set on

    def __init__(self, model_folder: Callable[[C], str | None], *,
                 weights_folder: Callable[[C], str | None] | None = None,
                 teacher_folder: Callable[[C], str] | None = None,
                 check_teacher: Callable[[C, TextTask, TextClassifier], None] | None = None
                 ) -> None:
        super().__init__()
        self.model_folder = model_folder
        self.weights_folder = weights_folder
        self.teacher_folder = teacher_folder
        self.check_teacher = check_teacher
        self.task: TextTask | None = None
        self.teacher: Any = None
        self.evaluator: GlueEvaluator | None = None
        self._prepared: C | None = None

    def prepare(self, cfg: C) -> None:
        """Check and read ``--task``, the starting weights, the teacher and the tokenizer, in
        that order (errors name the flag to fix); nothing to do again for an equal ``cfg``."""
        if self._prepared is not None and self._prepared == cfg:
            return
        from contrastive.data.text_tasks import (
            GENERATED_TASKS,
            check_task,
            generated_tokenizer,
            load_task,
        )
        from contrastive.data.tokenizer import load_tokenizer
        from contrastive.eval.classifier_folder import load_classifier
        from contrastive.nn.text_encoders import check_safe_weights

        key = check_task(cfg.task, cfg.glue_dir or None)
        weights = self.weights_folder(cfg) if self.weights_folder is not None else None
        if weights:
            check_safe_weights(weights)  # a pickle that would run code: refused, unread
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
        self._prepared = cfg

    def train_set(self, cfg: C, accelerator: Any) -> Any:
        self.prepare(cfg)
        assert self.task is not None
        self.max_length = cfg.max_length
        self.collate = LabelledCollate(self.tokenizer)
        self.evaluator = GlueEvaluator(self.task.dev, self.tokenizer, self.task.metric_task,
                                       every=cfg.eval_every, at_start=cfg.eval_at_start)
        teacher = self.teacher_folder(cfg) if self.teacher_folder is not None else ""
        self.artefacts = ClassifierArtefacts(self.task, self.tokenizer, self.evaluator,
                                             str(teacher or ""))
        return LabelledExamples(self.task.train)

    def evaluators(self, cfg: C, world: int) -> list[Any]:
        assert self.evaluator is not None, "LabelledTextAdapter: train_set() first"
        return [self.evaluator]

    @property
    def _task(self) -> TextTask:
        assert self.task is not None, "LabelledTextAdapter: prepare() first"
        return self.task

    def resolved(self) -> dict[str, Any]:
        t = self._task
        return {"task": t.name, "train_examples": len(t.train), "dev_examples": len(t.dev),
                "evaluated_on": t.eval_split,
                "num_labels": t.num_labels, "regression": t.regression,
                "vocab_size": int(self.tokenizer.vocab_size)}

    def describe(self) -> str:
        t = self._task
        pairs = "pairs" if len(t.train) and "text_b" in t.train[0] else "sentences"
        return (f"task {t.name}: labelled {pairs}, tokenised in the loader (max length "
                f"{self.max_length})")

    def handoff(self) -> HandOff:
        return {"tokenizer": self.tokenizer, "task": self._task, "teacher": self.teacher}
