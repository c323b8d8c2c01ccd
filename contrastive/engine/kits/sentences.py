"""The sentences kit: runs on examples of 1-3 sentences (SimCSE).

- configuration: :class:`TextConfig` (the text fields, the tokenizer or a WordPiece vocabulary
  trained on the training sentences, the STS evaluator's pairs and cadence);
- data: :class:`TextAdapter` (:class:`TextExamples` tokenised in the loader workers by
  :class:`TokenCollate`, padded per batch; tokens/s);
- evaluators: :class:`STSEvaluator` (Spearman of cosine similarities, SimCSE's protocol);
- artefacts: :class:`SentenceModelArtefacts`, ``model/``, a sentence-transformers folder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from contrastive.engine.fields import as_flag, help_field, override
from contrastive.engine.kits.base import Artefacts
from contrastive.engine.kits.text import TextRunConfig, TokenAdapter
from contrastive.records import MODEL_DIR, SENTENCE_CONFIG, sentence_model_step

if TYPE_CHECKING:
    from contrastive.data.text_batches import SentenceGroups

__all__ = ["TextConfig", "TextAdapter", "TextExamples", "TokenCollate", "STSEvaluator",
           "SentenceModelArtefacts", "build_sts_evaluator"]

#: a recipe's sentences configuration
C = TypeVar("C", bound="TextConfig")


@dataclass
class TextConfig(TextRunConfig):
    """A run on sentences (SimCSE): the text fields, the tokenizer (a saved one or a WordPiece
    vocabulary trained on the training sentences) and the STS evaluator's pairs and cadence. No
    image fields. Recipes add their data and model fields."""

    data: str = help_field("generated", "training text (the recipe says which forms it reads)")
    tokenizer: str = override(
        "", "folder with tokenizer.json or vocab.txt; empty = train a WordPiece vocabulary on "
        "the training sentences (deterministic)")
    vocab_size: int = help_field(1000, "trained WordPiece vocabulary size")
    eval: str = help_field(
        "generated", "STS pairs the evaluator scores (Spearman of cosine similarities): "
        "generated | a GLUE STS-B folder or TSV | none")
    eval_split: str = help_field("dev", "STS-B split (dev; test has no scores)")
    n_eval: int = help_field(2000, "generated STS pairs (the test stream, --data-seed)")
    eval_every: int = override(0, "STS evaluation every N optimiser steps (0 = at the end only)")

    def model_info(self) -> dict[str, Any]:
        """What the recipe records about its model in the sentence model's metadata
        (``simcse.json``; recipes/simcse.py: its ``--mode``); none here."""
        return {}

    def validate(self) -> None:
        """The checks of every text run, and positive sizes."""
        super().validate()
        for name in ("vocab_size", "n_eval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{as_flag(name)} must be positive, got {getattr(self, name)}")


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


class TextAdapter(TokenAdapter[C]):
    """Text examples of 1-3 sentences (SimCSE: one sentence; (anchor, positive); (anchor,
    positive, hard negative)), tokenised in the loader workers and padded per batch; the
    method's batch holds the token tensors it ``needs`` ((B, S, T), on the device).
    Throughput in tokens/s (the attention mask's sum); the STS evaluator
    (:func:`build_sts_evaluator`: ``--eval``, ``--eval-every``); ``model/``, a Hugging Face
    folder (:class:`SentenceModelArtefacts`).

    ``groups(cfg)`` (from the recipe) returns the training examples, a
    :class:`~contrastive.data.text_batches.SentenceGroups`. The tokenizer is ``--tokenizer`` (a
    folder) or a WordPiece vocabulary of ``--vocab-size`` trained on the training sentences
    (deterministic, so every process builds the same one); it is known after :meth:`train_set`
    (handed to the recipe's ``build_method``).
    """

    artefacts: Artefacts[C]  # SentenceModelArtefacts, from train_set on

    def __init__(self, groups: Callable[[C], SentenceGroups]) -> None:
        super().__init__()
        self.groups = groups
        self._data: TextExamples | None = None

    def train_set(self, cfg: C, accelerator: Any) -> Any:
        from contrastive.data.tokenizer import load_tokenizer, train_wordpiece

        self.max_length = cfg.max_length
        groups = self.groups(cfg)
        if cfg.tokenizer:
            self.tokenizer = load_tokenizer(cfg.tokenizer, max_length=cfg.max_length)
        else:
            corpus = [sentence for group in groups.groups for sentence in group]
            self.tokenizer = train_wordpiece(corpus, vocab_size=cfg.vocab_size,
                                             max_length=cfg.max_length)
        self.collate = TokenCollate(self.tokenizer)
        self.artefacts = SentenceModelArtefacts(self.tokenizer, cfg.model_info())
        self._data = TextExamples(groups)
        return self._data

    def evaluators(self, cfg: C, world: int) -> list[Any]:
        ev = build_sts_evaluator(cfg, self.tokenizer)
        return [] if ev is None else [ev]

    def resolved(self) -> dict[str, Any]:
        assert self._data is not None
        return {"train_examples": len(self._data), "sentences_per_example": self._data.size,
                "vocab_size": int(self.tokenizer.vocab_size)}

    def describe(self) -> str:
        size = self._data.size if self._data is not None else 0
        return (f"{size} sentence(s) per example, tokenised in the loader (max length "
                f"{self.max_length})")


class STSEvaluator:
    """STS Spearman of a text method's sentence embeddings every ``every`` optimiser steps.

    The embedding is the method's ``embed(input_ids, attention_mask, token_type_ids)`` (SimCSE:
    the official ``sentemb_forward``, MLP at test only when supervised) or, without one, its
    ``encoder``'s pooled output; in eval mode (no dropout). Every process computes the same
    figures on its own (no collective): the pairs are monitor-sized (``--n-eval``; STS-B dev
    has 1,500).
    """

    name, per = "sts", "step"

    def __init__(self, text_a: Sequence[str], text_b: Sequence[str], scores: Any,
                 tokenizer: Any, *, every: int = 0, at_start: bool = False,
                 batch_size: int = 128) -> None:
        self.text_a, self.text_b, self.scores = list(text_a), list(text_b), scores
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.every, self.at_start = every, at_start

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        from contrastive.eval.sts import evaluate_sts

        embed: Any = getattr(module, "embed", None)
        if not callable(embed):
            embed = module.encoder
        res = evaluate_sts(module, self.tokenizer, self.text_a, self.text_b, self.scores,
                           batch_size=self.batch_size, embed=embed)
        return {"sts_spearman": round(res["spearman"], 6), "sts_pearson": round(res["pearson"], 6)}


def build_sts_evaluator(cfg: TextConfig, tokenizer: Any) -> STSEvaluator | None:
    """The STS evaluator of a text run (``--eval``: ``generated`` = ``--n-eval`` pairs of the
    generated task's test stream, or a GLUE STS-B folder / TSV and ``--eval-split``; ``none``
    = no evaluator), every ``--eval-every`` steps and at the end."""
    if cfg.eval == "none":
        return None
    from contrastive.eval.sts import load_sts_pairs

    if cfg.eval != "generated" and not Path(cfg.eval).exists():
        raise FileNotFoundError(f"--eval {cfg.eval}: no such STS-B folder or file; give "
                                "'generated', a GLUE STS-B folder / TSV, or 'none'")
    a, b, gold = load_sts_pairs(cfg.eval, cfg.eval_split, cfg.n_eval, cfg.data_seed)
    return STSEvaluator(a, b, gold, tokenizer, every=cfg.eval_every, at_start=cfg.eval_at_start)


class SentenceModelArtefacts:
    """``model/``: the method's ``sentence_encoder()`` (SimCSE: the encoder whose pooled output
    is the evaluation embedding, the supervised MLP as its pooler, as the authors'
    ``simcse_to_huggingface.py``) with the training ``tokenizer``; ``info`` (the recipe's
    :meth:`TextConfig.model_info`) joins the metadata."""

    what = "the sentence model's settings (weights and tokenizer beside them)"

    def __init__(self, tokenizer: Any, info: dict[str, Any]) -> None:
        self.tokenizer, self.info = tokenizer, info

    def write(self, out: Path, cfg: TextConfig, module: nn.Module, recipe: str,
              step: int) -> Path:
        make = getattr(module, "sentence_encoder", None)
        if not callable(make):
            raise TypeError(f"{type(module).__name__} has no sentence_encoder(): a text run's "
                            "artefact is the method's sentence encoder")
        config = {"method": type(module).__name__.lower(), "recipe": recipe, "step": step,
                  "temperature": getattr(module, "temperature", None), **self.info}
        from contrastive.eval.export_text import save_sentence_model

        return save_sentence_model(out / MODEL_DIR, make(), self.tokenizer, config)

    def step_of(self, out: Path) -> int | None:
        return sentence_model_step(out / MODEL_DIR)

    def main_file(self, out: Path) -> Path:
        return out / MODEL_DIR / SENTENCE_CONFIG
