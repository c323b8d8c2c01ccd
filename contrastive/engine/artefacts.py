"""What a run leaves besides checkpoints, chosen by the recipe through its data adapter.

Every writer goes through :mod:`contrastive.records` (the one definition of each file's format,
which evaluation reads):

- :class:`EncoderArtefacts` (image runs): ``encoder.pt``, the backbone with the ``create_encoder``
  kwargs, crop size and normalisation;
- :class:`ClipArtefacts` (image-text runs): ``clip.pt`` + ``tokenizer/`` (the whole model, which
  ``contrastive-zeroshot`` reads) and the image tower's ``encoder.pt`` (for the linear probe and
  kNN tools);
- :class:`SentenceModelArtefacts` (text runs): ``model/``, the method's sentence encoder as a
  Hugging Face folder with its tokenizer and ``simcse.json`` (evaluation pooling, step), which
  ``contrastive-sts-eval`` and ``create_encoder("hf:...")`` read.

``write(out, cfg, module, recipe, step)`` returns the main file; ``step_of(out)`` the step it
was written at (None when absent or unreadable: a requeued finished run rewrites it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from torch import nn

from contrastive.engine.monitor import encoder_of
from contrastive.records import (
    CLIP_FILE,
    ENCODER_FILE,
    SENTENCE_CONFIG,
    SENTENCE_MODEL_DIR,
    EncoderRecord,
    RecordError,
    save_clip_record,
    save_sentence_model,
    sentence_model_step,
)

__all__ = ["Artefacts", "EncoderArtefacts", "ClipArtefacts", "SentenceModelArtefacts",
           "write_encoder"]


class Artefacts(Protocol):
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
    recipe's model configuration)."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

    def write(self, out: Path, cfg: Any, module: nn.Module, recipe: str, step: int) -> Path:
        a = self.adapter
        clamp = getattr(module, "clamp_logit_scale", None)
        if callable(clamp):
            clamp()
        config = {"model": a.model_config(cfg, a.tokenizer), "max_length":
                  int(a.tokenizer.max_length), "data": cfg.data, "image_size": cfg.image_size,
                  "step": step, "recipe": recipe}
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
        return save_sentence_model(out / SENTENCE_MODEL_DIR, make(), self.adapter.tokenizer,
                                   config)

    def step_of(self, out: Path) -> int | None:
        return sentence_model_step(out / SENTENCE_MODEL_DIR)

    def main_file(self, out: Path) -> Path:
        return out / SENTENCE_MODEL_DIR / SENTENCE_CONFIG
