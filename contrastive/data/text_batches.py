"""Text batches for text methods: groups of sentences -> named tensors, and the files SimCSE reads.

The training engine's loader builds image batches (``views``, ``labels``, ``indices``); a text
method reads token tensors instead. This module gives the text side of that contract, for any
text method (SimCSE here; a classifier / distiller uses
:meth:`contrastive.data.tokenizer.TextTokenizer.collate`, which gives the same keys for single
sentences and (A, B) pairs plus ``labels``):

- :class:`SentenceGroups`: N examples of S sentences each (S = 1: one sentence, unsupervised
  SimCSE; S = 2: (anchor, positive); S = 3: (anchor, positive, hard negative), supervised
  SimCSE). Items are ``{"sentences": (s_1, ..., s_S)}``.
- :class:`GroupCollate`: ``collate_fn`` that tokenises the B x S sentences of a batch in one call
  and returns :data:`TEXT_BATCH_KEYS` shaped (B, S, T), padded to the longest sentence of the
  batch (the layout of SimCSE's ``cl_forward``, ``input_ids`` (bs, num_sent, len)).
- Readers of the official SimCSE training files (princeton-nlp/SimCSE, ``train.py`` and README
  "Training"): :func:`read_sentence_file` for ``wiki1m_for_simcse.txt`` (one sentence a line)
  and :func:`read_simcse_csv` for ``nli_for_simcse.csv`` (header ``sent0,sent1,hard_neg``;
  2 columns = pairs, 3 = pairs with a hard negative; ``.tsv`` = tab-separated). As there,
  columns are taken by position.
- :func:`nli_groups`: the generated task's NLI quadruples as SimCSE triples.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["TEXT_BATCH_KEYS", "GroupCollate", "SentenceGroups", "nli_groups",
           "read_sentence_file", "read_simcse_csv"]

TEXT_BATCH_KEYS: dict[str, str] = {
    "input_ids": "token ids (B, S, T) int64 (S sentences per example; (B, T) accepted for S = 1)",
    "attention_mask": "1 = token, 0 = padding, same shape as input_ids",
    "token_type_ids": "segment ids, same shape (all 0 for single sentences)",
}
"""What :class:`GroupCollate` provides; a text method's ``needs`` name a subset."""


class LabelledSentences(Dataset):
    """Labelled sentences or sentence pairs: ``text_a`` (N strings), ``text_b`` (N strings, or
    None for single sentences), ``labels`` (N,) numpy array; items ``{"text_a", ["text_b"],
    "label"}`` (an int class id, or a float score). The shape GLUE files and the generated text
    tasks share (:class:`~contrastive.data.glue.GlueDataset`,
    :class:`~contrastive.data.generated_text.GeneratedTextDataset`)."""

    text_a: list[str]
    text_b: list[str] | None
    labels: Any

    def __len__(self) -> int:
        return len(self.text_a)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item: dict[str, Any] = {"text_a": self.text_a[i]}
        if self.text_b is not None:
            item["text_b"] = self.text_b[i]
        item["label"] = self.labels[i].item()
        return item


class SentenceGroups(Dataset):
    """N examples of S sentences each; items ``{"sentences": tuple of S strings}``.

    Args:
        groups: N sequences of S non-empty strings (the same S for all).
        names: what each position is (e.g. ``("sent0", "sent1", "hard_neg")``), for messages.
    """

    def __init__(self, groups: Sequence[Sequence[str]], names: Sequence[str] | None = None) -> None:
        self.groups = [tuple(g) for g in groups]
        if not self.groups:
            raise ValueError("SentenceGroups: no examples")
        sizes = {len(g) for g in self.groups}
        if len(sizes) != 1 or min(sizes) < 1:
            raise ValueError(f"SentenceGroups: every example needs the same number (>= 1) of "
                             f"sentences; got sizes {sorted(sizes)}")
        self.size = sizes.pop()
        self.names = tuple(names) if names is not None else tuple(f"sent{i}" for i in range(self.size))
        for i, g in enumerate(self.groups):
            for name, s in zip(self.names, g):
                if not isinstance(s, str) or not s.strip():
                    raise ValueError(f"SentenceGroups: example {i} has an empty {name!r}: {g!r}")

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"sentences": self.groups[i]}


class GroupCollate:
    """``collate_fn``: items ``{"sentences"}`` -> :data:`TEXT_BATCH_KEYS`, each (B, S, T) int64.

    Args:
        tokenizer: a :class:`contrastive.data.tokenizer.TextTokenizer` (its ``max_length``
            truncates; SimCSE uses 32).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        if not items:
            raise ValueError("GroupCollate: empty batch")
        groups = [tuple(it["sentences"]) for it in items]
        s = len(groups[0])
        if any(len(g) != s for g in groups):
            raise ValueError(f"GroupCollate: examples with different sentence counts "
                             f"{sorted({len(g) for g in groups})} in one batch")
        flat = [sentence for g in groups for sentence in g]  # example-major: (B * S)
        tokens = self.tokenizer(flat)
        return {k: v.view(len(groups), s, v.shape[-1]) for k, v in tokens.items()}


def read_sentence_file(path: str | Path) -> SentenceGroups:
    """One sentence a line (SimCSE's ``wiki1m_for_simcse.txt``), blank lines skipped; S = 1."""
    p = Path(path)
    with open(p, encoding="utf-8-sig") as f:
        lines = [line.strip() for line in f]
    sentences = [line for line in lines if line]
    if not sentences:
        raise ValueError(f"{p}: no sentences (expected one sentence a line, as "
                         "wiki1m_for_simcse.txt)")
    return SentenceGroups([(s,) for s in sentences], names=("sent0",))


def read_simcse_csv(path: str | Path) -> SentenceGroups:
    """A SimCSE CSV (``nli_for_simcse.csv``): header row, then 2 or 3 columns by position.

    ``sent0, sent1`` (anchor, positive) or ``sent0, sent1, hard_neg``; ``.tsv`` files are
    tab-separated, others comma-separated with standard CSV quoting (as the official
    ``train.py``). A row with another field count or an empty field is an error naming it.
    """
    p = Path(path)
    delimiter = "\t" if p.suffix.lower() == ".tsv" else ","
    with open(p, encoding="utf-8-sig", newline="") as f:
        rows = [row for row in csv.reader(f, delimiter=delimiter) if row]
    if len(rows) < 2:
        raise ValueError(f"{p}: needs a header row and at least one example (SimCSE layout "
                         "sent0,sent1[,hard_neg])")
    header, body = rows[0], rows[1:]
    if len(header) not in (2, 3):
        raise ValueError(f"{p}: header {header!r} has {len(header)} columns; a SimCSE CSV has 2 "
                         "(sent0,sent1) or 3 (sent0,sent1,hard_neg); one-sentence data goes in "
                         "a .txt file, one sentence a line")
    for line, row in enumerate(body, start=2):
        if len(row) != len(header) or not all(field.strip() for field in row):
            raise ValueError(f"{p}, row {line}: expected {len(header)} non-empty fields "
                             f"({','.join(header)}), got {row!r}")
    return SentenceGroups([tuple(field.strip() for field in row) for row in body],
                          names=tuple(header))


def nli_groups(nli: Any, hard_negatives: bool = True) -> SentenceGroups:
    """SimCSE examples from a :class:`contrastive.data.generated_text.GeneratedNLI` (or any object
    with aligned ``premise``, ``entailment``, ``contradiction`` lists): (premise, entailment,
    contradiction), or (premise, entailment) without hard negatives."""
    if hard_negatives:
        groups = list(zip(nli.premise, nli.entailment, nli.contradiction))
        return SentenceGroups(groups, names=("premise", "entailment", "contradiction"))
    return SentenceGroups(list(zip(nli.premise, nli.entailment)), names=("premise", "entailment"))
