"""What the two text kits share (:mod:`~contrastive.engine.kits.sentences`,
:mod:`~contrastive.engine.kits.labelled_text`): the text fields of a run
(:class:`TextRunConfig`), a BERT's sizes (:class:`BertSizes`, also the image-text kit's text
tower), BERT's optimiser (:class:`BertOptimiser`: fine-tuning and distilling a BERT) and the
token batch on the device (:class:`TokenAdapter`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from contrastive.engine.config import RunConfig
from contrastive.engine.extras import add_extras
from contrastive.engine.fields import as_flag, help_field, override
from contrastive.engine.kits.base import HandOff, KitDefaults

__all__ = ["TextRunConfig", "BertSizes", "BertOptimiser", "TokenAdapter"]

#: a text kit's configuration
T = TypeVar("T", bound="TextRunConfig", contravariant=True)


@dataclass
class TextRunConfig(RunConfig):
    """What every run on text has besides :class:`RunConfig`'s fields: the tokenizer folder, the
    sentence length, the seed of generated data and the evaluator's cadence. Its two
    subclasses add their data: :class:`TextConfig` (sentences, SimCSE) and
    :class:`LabelledTextConfig` (labelled sentences and pairs, GLUE)."""

    data_seed: int = help_field(0, "seed of generated data (--seed drives model and order)")
    tokenizer: str = help_field("", "folder with tokenizer.json or vocab.txt")
    max_length: int = help_field(128, "tokens per sentence (longer ones are truncated)")
    eval_every: int = help_field(0, "evaluation every N optimiser steps (0 = at the end only)")
    eval_at_start: bool = help_field(True, "also evaluate before training (random init)")

    def validate(self) -> None:
        """The checks of every run, a positive length and cadence >= 0."""
        super().validate()
        if self.max_length <= 0:
            raise ValueError(f"--max-length must be positive, got {self.max_length}")
        if self.eval_every < 0:
            raise ValueError(f"--eval-every must be >= 0, got {self.eval_every}")



@dataclass
class BertOptimiser(TextRunConfig):
    """BERT's optimiser, for the runs that fine-tune or distil a BERT (Devlin et al. 2019, sec.
    A.3; the authors' google-research/bert ``run_classifier.py`` and ``optimization.py``; the
    same in TinyBERT's ``general_distill.py`` and ``task_distill.py``): AdamW (betas 0.9 /
    0.999; eps 1e-8, torch's and the Hugging Face Trainer's, where the authors' TensorFlow code
    has 1e-6), linear warm-up over ``--warmup-fraction`` (``warmup_proportion`` 0.1) of the
    budget then linear decay to 0, weight decay 0.01 except biases and LayerNorm, gradient norm
    clipped to 1.0. The recipes set the budget and the learning rate."""

    optimizer: str = override("adamw", "AdamW (BERT's)")
    lr_scaling: str = override("none", "lr is absolute")
    lr_schedule: str = override("linear", "linear decay to 0 after the warm-up (BERT's)")
    warmup_fraction: float = help_field(
        0.1, "linear warm-up over this fraction of the budget (sets --warmup-steps, or "
        "--warmup-epochs with an --epochs budget, when those are 0)")
    weight_decay: float = override(0.01, "AdamW weight decay (none on biases and LayerNorm)")
    clip_grad_norm: float = override(1.0, "max gradient norm (0 = off)")

    derived_fields: ClassVar[tuple[str, ...]] = ("warmup_steps", "warmup_epochs")

    def __post_init__(self) -> None:
        """``--warmup-fraction`` into the engine's warm-up in steps (or epochs)."""
        if self.warmup_fraction > 0 and not (self.warmup_steps or self.warmup_epochs):
            if self.steps:
                self.warmup_steps = int(self.warmup_fraction * self.steps)
            else:
                self.warmup_epochs = self.warmup_fraction * self.epochs

    def validate(self) -> None:
        """The checks of every text run and the warm-up fraction."""
        super().validate()
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"--warmup-fraction must be in [0, 1), got {self.warmup_fraction}")

@dataclass
class BertSizes:
    """The sizes of a BERT built from a configuration (random weights: a recipe's model named
    ``bert``), one spelling in every recipe; :meth:`bert_sizes` hands them to
    :func:`contrastive.nn.text_encoders.text_encoder` (or ``bert_options``). Declared here once
    for the text and image-text configurations (the recipes :func:`override` the defaults)."""

    layers: int = help_field(12, "layers of a 'bert' model (random weights; an hf: folder has "
                             "its own sizes)")
    hidden: int = help_field(768, "bert: hidden size")
    heads: int = help_field(12, "bert: attention heads")
    intermediate_size: int = help_field(0, "bert: feed-forward width (0 = 4 x hidden)")
    dropout: float = help_field(0.1, "bert: dropout of the hidden states and the attention "
                                "(BERT 0.1)")

    def bert_sizes(self) -> dict[str, Any]:
        """The sizes as :func:`~contrastive.nn.text_encoders.bert_options` takes them."""
        return dict(layers=self.layers, hidden=self.hidden, heads=self.heads,
                    intermediate_size=self.intermediate_size, dropout=self.dropout)

    def check_bert_sizes(self) -> None:
        """Positive sizes (``--intermediate-size`` >= 0) and a dropout in [0, 1)."""
        for name in ("layers", "hidden", "heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{as_flag(name)} must be positive, got {getattr(self, name)}")
        if self.intermediate_size < 0:
            raise ValueError(f"--intermediate-size must be >= 0 (0 = 4 x hidden), got "
                             f"{self.intermediate_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")


class TokenAdapter(KitDefaults[T]):
    """What the text kits share: items tokenised in the loader workers (``collate``, set by
    ``train_set``) and padded per batch; the method's batch holds the token tensors it
    ``needs`` (and ``indices``), on the device; throughput in tokens/s (the attention mask's
    sum); the tokenizer handed to the method."""

    unit = "tokens"

    def __init__(self) -> None:
        self.tokenizer: Any = None
        self.collate: Callable[[list[tuple[Any, ...]]], Any] | None = None
        self.max_length = 0  # --max-length, from train_set on

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int,
              world: int = 1) -> dict[str, Any]:
        fields, indices = sample
        batch: dict[str, Any] = dict(sched)
        if "indices" in needs:
            batch["indices"] = indices.to(device, non_blocking=True)
        add_extras(batch, fields, needs, device)
        return batch

    def count(self, batch: dict[str, Any]) -> Tensor | None:
        mask = batch.get("attention_mask")
        return None if mask is None else mask.sum()

    def handoff(self) -> HandOff:
        return {"tokenizer": self.tokenizer}
