"""What a run leaves besides checkpoints, chosen by the recipe through its data adapter.

Every writer goes through :mod:`contrastive.records` (the one definition of each file's format,
which evaluation reads):

- :class:`EncoderArtefacts` (image runs): ``encoder.pt``, the backbone with the ``create_encoder``
  kwargs, crop size and normalisation;
- :class:`ClipArtefacts` (image-text runs): ``clip.pt`` + ``tokenizer/`` (the whole model, which
  ``contrastive-zeroshot`` reads) and the image tower's ``encoder.pt`` (for the linear probe and
  kNN tools);
- :class:`SentenceModelArtefacts` (text runs): ``model/``, the method's sentence encoder as a
  sentence-transformers folder (``SentenceTransformer(run/model)``; its Hugging Face files are
  what ``create_encoder("hf:...")`` reads) with ``simcse.json`` (evaluation pooling, step),
  which ``contrastive-sts-eval`` reads;
- :class:`ClassifierArtefacts` (labelled-text runs: fine-tuning, LRC-BERT): ``model/``, the
  method as a :class:`~contrastive.methods.text_classifier.TextClassifier` in a Hugging Face
  folder (:mod:`contrastive.eval.classifier_folder`: ``AutoModelForSequenceClassification``
  opens it, our metadata in ``classifier.json``; what ``recipes/lrc_bert.py --teacher`` and
  ``contrastive-export --format hf`` read), and ``results.json`` (the task and the latest dev
  metrics of the GLUE evaluator).

``write(out, cfg, module, recipe, step)`` returns the main file; ``step_of(out)`` the step it
was written at (None when absent or unreadable: a requeued finished run rewrites it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from contrastive.methods.base import encoder_of
from contrastive.records import (
    CLASSIFIER_FILE,
    CLIP_FILE,
    ENCODER_FILE,
    MODEL_DIR,
    RESULTS_FILE,
    SENTENCE_CONFIG,
    EncoderRecord,
    RecordError,
    save_clip_record,
    sentence_model_step,
)

__all__ = ["Artefacts", "EncoderArtefacts", "ClipArtefacts", "SentenceModelArtefacts",
           "ClassifierArtefacts", "write_encoder"]


class Artefacts(Protocol):
    what: str  # what main_file holds, for the run's end line ("encoder weights in PATH")

    def write(self, out: Path, cfg: Any, module: nn.Module, recipe: str, step: int) -> Path: ...

    def step_of(self, out: Path) -> int | None: ...

    def main_file(self, out: Path) -> Path: ...


def write_encoder(out: Path, cfg: Any, module: nn.Module, pipeline: Any, recipe: str,
                  step: int) -> Path:
    """``<out>/encoder.pt``: the method's backbone as a :class:`~contrastive.records.EncoderRecord`
    with the ``create_encoder`` kwargs, the crop size and the pipeline's normalisation (which
    evaluation uses by default)."""
    record = EncoderRecord.from_module(
        encoder_of(module), cfg.encoder, encoder_kwargs=cfg.encoder_options(),
        mean=getattr(pipeline, "mean", None), std=getattr(pipeline, "std", None),
        image_size=cfg.image_size, step=step, recipe=recipe, method=type(module).__name__)
    return record.save(out / ENCODER_FILE)


def encoder_step(out: Path) -> int | None:
    """The ``step`` recorded in ``<out>/encoder.pt`` (None if absent or unreadable)."""
    try:
        return EncoderRecord.load(out / ENCODER_FILE, mmap=True).step
    except (RecordError, OSError):
        return None


class EncoderArtefacts:
    """``encoder.pt`` with ``pipeline``'s normalisation."""

    what = "encoder weights"

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def write(self, out: Path, cfg: Any, module: nn.Module, recipe: str, step: int) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        return write_encoder(out, cfg, module, self.pipeline, recipe, step)

    def step_of(self, out: Path) -> int | None:
        return encoder_step(out)

    def main_file(self, out: Path) -> Path:
        return out / ENCODER_FILE


class ClipArtefacts:
    """``clip.pt`` + ``tokenizer/`` and the image tower's ``encoder.pt``. ``adapter``: the
    :class:`~contrastive.engine.adapters.ImageTextAdapter` (its tokenizer, pipeline and the
    recipe's model configuration). ``what`` names the method written last (CLIP, SigLIP...):
    recipes/clip.py and recipes/siglip.py share these artefacts."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.what = "the image-text model (its image tower also in encoder.pt)"

    def write(self, out: Path, cfg: Any, module: nn.Module, recipe: str, step: int) -> Path:
        self.what = f"the {type(module).__name__} model (its image tower also in encoder.pt)"
        a = self.adapter
        clamp = getattr(module, "clamp_logit_scale", None)
        if callable(clamp):
            clamp()
        config = {"model": a.model_config(cfg, a.tokenizer), "max_length":
                  int(a.tokenizer.max_length), "data": cfg.data, "image_size": cfg.image_size,
                  "step": step, "recipe": recipe,
                  "method": type(module).__name__.lower()}  # the registered name (clip, siglip)
        path = save_clip_record(out, module.state_dict(), config, a.tokenizer)
        write_encoder(out, cfg, module, a.pipeline, recipe, step)  # the image tower alone
        return path

    def step_of(self, out: Path) -> int | None:
        return encoder_step(out) if self.main_file(out).is_file() else None

    def main_file(self, out: Path) -> Path:
        return out / CLIP_FILE


class SentenceModelArtefacts:
    """``model/``: the method's ``sentence_encoder()`` (SimCSE: the encoder whose pooled output
    is the evaluation embedding, the supervised MLP as its pooler, as the authors'
    ``simcse_to_huggingface.py``) with the training tokenizer. ``adapter``: the
    :class:`~contrastive.engine.adapters.TextAdapter` (its tokenizer)."""

    what = "the sentence model's settings (weights and tokenizer beside them)"

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

    def write(self, out: Path, cfg: Any, module: nn.Module, recipe: str, step: int) -> Path:
        make = getattr(module, "sentence_encoder", None)
        if not callable(make):
            raise TypeError(f"{type(module).__name__} has no sentence_encoder(): a text run's "
                            "artefact is the method's sentence encoder")
        config = {"method": type(module).__name__.lower(), "recipe": recipe, "step": step,
                  "temperature": getattr(module, "temperature", None),
                  "mode": getattr(cfg, "mode", None)}
        from contrastive.eval.export_text import save_sentence_model

        return save_sentence_model(out / MODEL_DIR, make(), self.adapter.tokenizer,
                                   config)

    def step_of(self, out: Path) -> int | None:
        return sentence_model_step(out / MODEL_DIR)

    def main_file(self, out: Path) -> Path:
        return out / MODEL_DIR / SENTENCE_CONFIG


class ClassifierArtefacts:
    """``model/`` (:func:`~contrastive.eval.classifier_folder.save_classifier` of the method
    as a classifier, :func:`~contrastive.methods.text_classifier.as_classifier`: a fine-tuned
    teacher, or an LRC-BERT student with its prediction layer) with the training tokenizer, and
    ``results.json``: ``{"task", "step", "dev"}`` (the GLUE evaluator's latest metrics; the end
    ones for a finished run) plus ``teacher_dev`` for a distilled student. ``adapter``: the
    :class:`~contrastive.engine.adapters.LabelledTextAdapter` (task, tokenizer, evaluator)."""

    what = "the classifier's settings (weights and tokenizer beside them)"

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

    def write(self, out: Path, cfg: Any, module: nn.Module, recipe: str, step: int) -> Path:
        from contrastive.data.glue import GLUE_TASKS
        from contrastive.eval.classifier_folder import save_classifier
        from contrastive.methods.text_classifier import as_classifier

        a = self.adapter
        dev = a.evaluator.last if a.evaluator is not None else None
        info: dict[str, Any] = {"task": a.task.name, "step": step, "recipe": recipe, "dev": dev}
        result: dict[str, Any] = {"task": a.task.name, "step": step, "dev": dev}
        if a.task.eval_split != "dev":  # the metrics are of held-out training rows, not dev
            info["held_out"] = result["held_out"] = info.pop("dev")
            del result["dev"]
        teacher = a.teacher_folder(cfg) if a.teacher_folder is not None else ""
        if teacher:
            info["distilled_from"] = str(teacher)
            meta = Path(teacher) / CLASSIFIER_FILE
            result["teacher_dev"] = json.loads(meta.read_text()).get("dev") \
                if meta.is_file() else None
        out.mkdir(parents=True, exist_ok=True)
        labels = getattr(GLUE_TASKS.get(a.task.metric_task), "label_names", None)
        save_classifier(out / MODEL_DIR, as_classifier(module), a.tokenizer,
                        label_names=labels if labels and len(labels) == a.task.num_labels
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
