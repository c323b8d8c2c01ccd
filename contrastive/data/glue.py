"""GLUE from its official TSV files, and its official metrics (scikit-learn / scipy).

Point :func:`load_glue` at the folder of one task as the GLUE distribution unpacks it
(``glue_data/SST-2``, ``glue_data/MNLI``, ...; the files of ``download_glue_data.py``) or at
``glue_data`` itself. Nothing is downloaded.

Layouts (tab-separated, UTF-8, quoting disabled: GLUE text contains unbalanced ``"``, which a
default CSV reader would treat as a quoted field spanning lines). Columns are found by header
name, as in the Hugging Face ``datasets`` GLUE script (huggingface/datasets,
``datasets/glue/glue.py``) and the GLUE baseline / ``transformers`` processors
(``src/transformers/data/processors/glue.py``):

========  =====================================  ======================================  ==============
task      files                                  text columns                            label column
========  =====================================  ======================================  ==============
CoLA      train.tsv, dev.tsv (NO header),        4th field (source, label, original      2nd field 0/1
          test.tsv (header index, sentence)      annotation, sentence)
SST-2     train.tsv, dev.tsv, test.tsv           sentence                                label 0/1
MRPC      train.tsv, dev.tsv, test.tsv           #1 String, #2 String                    Quality 0/1
QQP       train.tsv, dev.tsv, test.tsv           question1, question2                    is_duplicate
STS-B     train.tsv, dev.tsv, test.tsv           sentence1, sentence2                    score (0-5)
MNLI      train.tsv, dev_matched.tsv,            sentence1, sentence2                    gold_label
          dev_mismatched.tsv, test_*.tsv
QNLI      train.tsv, dev.tsv, test.tsv           question, sentence                      label
RTE       train.tsv, dev.tsv, test.tsv           sentence1, sentence2                    label
========  =====================================  ======================================  ==============

Test files have no label column; their examples get label -1 (NaN for STS-B). Label ids follow
the ``datasets`` GLUE script: CoLA unacceptable/acceptable, SST-2 negative/positive, MRPC
not_equivalent/equivalent, QQP not_duplicate/duplicate, MNLI entailment/neutral/contradiction,
QNLI and RTE entailment/not_entailment. A UTF-8 byte-order mark (MRPC's source files) is skipped.

Rows with the wrong number of fields or an unknown label (the original QQP train file has a
few) are skipped with a warning; more than 1 % of them means a wrong file or layout and is an
error (:class:`GlueFormatError`).

Metrics (:func:`glue_metrics`), as GLUE reports them: accuracy; F1 of the positive class plus
accuracy for MRPC and QQP; Matthews correlation for CoLA; Pearson and Spearman correlation for
STS-B. ``score`` is GLUE's single number per task (the mean of the two for MRPC, QQP, STS-B),
on a 0-1 scale (GLUE's leaderboard multiplies by 100).
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contrastive.data.text_batches import LabelledSentences

__all__ = [
    "GLUE_TASKS",
    "GlueDataset",
    "GlueFormatError",
    "GlueTask",
    "glue_metrics",
    "load_glue",
    "stratified_indices",
    "read_tsv",
]

log = logging.getLogger(__name__)

MAX_BAD_FRACTION = 0.01


class GlueFormatError(ValueError):
    """A GLUE file that does not have its task's official layout."""


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its files are, which columns hold what, how it is scored."""

    name: str
    folder: str
    text_a: str
    text_b: str | None
    label: str
    label_names: tuple[str, ...] | None  # None: regression
    label_values: tuple[str, ...] | None  # raw value in the file for each label id
    splits: tuple[tuple[str, str], ...]  # (split, file name)
    metrics: tuple[str, ...]

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        """Output width of a prediction head: classes, or 1 for regression."""
        return 1 if self.label_names is None else len(self.label_names)

    def file(self, split: str) -> str:
        files = dict(self.splits)
        if split not in files:
            raise ValueError(
                f"GLUE {self.name}: unknown split {split!r}; choose from {sorted(files)}"
            )
        return files[split]


_STD_SPLITS = (("train", "train.tsv"), ("dev", "dev.tsv"), ("test", "test.tsv"))
_BINARY = ("0", "1")
_ENT2 = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", "CoLA", "sentence", None, "label", ("unacceptable", "acceptable"),
                 _BINARY, _STD_SPLITS, ("mcc",)),
        GlueTask("sst2", "SST-2", "sentence", None, "label", ("negative", "positive"),
                 _BINARY, _STD_SPLITS, ("accuracy",)),
        GlueTask("mrpc", "MRPC", "#1 String", "#2 String", "Quality",
                 ("not_equivalent", "equivalent"), _BINARY, _STD_SPLITS, ("accuracy", "f1")),
        GlueTask("qqp", "QQP", "question1", "question2", "is_duplicate",
                 ("not_duplicate", "duplicate"), _BINARY, _STD_SPLITS, ("accuracy", "f1")),
        GlueTask("stsb", "STS-B", "sentence1", "sentence2", "score", None, None, _STD_SPLITS,
                 ("pearson", "spearman")),
        GlueTask("mnli", "MNLI", "sentence1", "sentence2", "gold_label",
                 ("entailment", "neutral", "contradiction"),
                 ("entailment", "neutral", "contradiction"),
                 (("train", "train.tsv"), ("dev_matched", "dev_matched.tsv"),
                  ("dev_mismatched", "dev_mismatched.tsv"), ("test_matched", "test_matched.tsv"),
                  ("test_mismatched", "test_mismatched.tsv")),
                 ("accuracy",)),
        GlueTask("qnli", "QNLI", "question", "sentence", "label", _ENT2, _ENT2, _STD_SPLITS,
                 ("accuracy",)),
        GlueTask("rte", "RTE", "sentence1", "sentence2", "label", _ENT2, _ENT2, _STD_SPLITS,
                 ("accuracy",)),
    )
}
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli_matched": "mnli"}
_COLA_FIELDS = 4  # CoLA train/dev: source, label, original annotation, sentence (no header)


def _task(name: str) -> GlueTask:
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; choose from {sorted(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def read_tsv(path: str | Path) -> list[list[str]]:
    """All rows of a TSV file: UTF-8 (a byte-order mark skipped), tabs, quoting disabled."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        return [row for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if row]


class GlueDataset(LabelledSentences):
    """One split of one GLUE task, as lists of strings and a label array.

    Attributes:
        task: the :class:`GlueTask`; split: the split name; path: the file read.
        text_a: list of N strings; text_b: list of N strings, or None for single-sentence tasks.
        labels: (N,) int64 class ids (-1 when the split has no labels), or float32 scores for
            STS-B (NaN when unlabelled).

    Items are dicts ``{"text_a", "text_b" (pair tasks), "label"}``.
    """

    def __init__(self, task: GlueTask, split: str, path: Path, text_a: list[str],
                 text_b: list[str] | None, labels: np.ndarray) -> None:
        self.task, self.split, self.path = task, split, path
        self.text_a, self.text_b, self.labels = text_a, text_b, labels


    @property
    def has_labels(self) -> bool:
        if self.task.is_regression:
            return bool(len(self.labels)) and not np.isnan(self.labels).any()
        return bool(len(self.labels)) and bool((self.labels >= 0).all())

    def __repr__(self) -> str:
        return f"GlueDataset({self.task.name}, {self.split}, n={len(self)}, path={str(self.path)!r})"

    def subset(self, indices: Sequence[int] | np.ndarray, split: str | None = None) -> GlueDataset:
        """The examples at ``indices`` (in that order) as a data set of their own; ``split``
        names it (default: this split's name)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (len(idx) and (idx.min() < 0 or idx.max() >= len(self))):
            raise IndexError(f"{self!r}.subset: indices must be a 1-d sequence in 0..{len(self) - 1}")
        text_b = None if self.text_b is None else [self.text_b[i] for i in idx]
        return GlueDataset(self.task, split or self.split, self.path,
                           [self.text_a[i] for i in idx], text_b, self.labels[idx])

    def split_off(self, n_held_out: int, seed: int = 0) -> tuple[GlueDataset, GlueDataset]:
        """``(rest, held_out)``: a stratified draw of ``n_held_out`` examples held out of this
        split (to choose hyper-parameters on, never the dev set that is reported) and the rest;
        the same seed always draws the same examples."""
        held = stratified_indices(self.labels, n_held_out, seed, regression=self.task.is_regression)
        rest = np.setdiff1d(np.arange(len(self)), held)
        return self.subset(rest), self.subset(held, f"{self.split}_held_out")


def stratified_indices(labels: np.ndarray, n: int, seed: int = 0, *, regression: bool = False
                       ) -> np.ndarray:
    """``n`` distinct indices into ``labels``, sorted, keeping each class's share of the examples
    (largest-remainder rounding; regression: the share of each score quintile). Seeded with
    ``numpy.random.default_rng(seed)``, independent of any other random state."""
    labels = np.asarray(labels)
    if not 0 <= n <= len(labels):
        raise ValueError(f"stratified_indices: n must be in 0..{len(labels)}, got {n}")
    strata = (np.digitize(labels, np.quantile(labels, [0.2, 0.4, 0.6, 0.8])) if regression
              else labels)
    classes, counts = np.unique(strata, return_counts=True)
    exact = counts * n / len(labels)
    take = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - take), kind="stable")[: n - int(take.sum())]:
        take[i] += 1
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(np.flatnonzero(strata == c), size=k, replace=False)
              for c, k in zip(classes, take)]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def _resolve_path(root: Path, task: GlueTask, split: str) -> Path:
    name = task.file(split)
    for folder in (root, root / task.folder):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"GLUE {task.name} {split}: no {name} in {root} or {root / task.folder}; point at the "
        f"task folder of the official GLUE distribution (glue_data/{task.folder})"
    )


def load_glue(task: str, root: str | Path, split: str = "train") -> GlueDataset:
    """Read one split of a GLUE task from its official TSV file.

    Args:
        task: ``cola``, ``sst2``, ``mrpc``, ``qqp``, ``stsb``, ``mnli``, ``qnli``, ``rte``
            (``SST-2``, ``STS-B`` also accepted).
        root: the task folder (``glue_data/SST-2``) or the ``glue_data`` folder.
        split: ``train``, ``dev``, ``test``; MNLI: ``train``, ``dev_matched``,
            ``dev_mismatched``, ``test_matched``, ``test_mismatched`` (``dev`` means matched).

    Raises:
        FileNotFoundError, GlueFormatError (wrong columns, too many malformed rows).
    """
    t = _task(task)
    if t.name == "mnli" and split in ("dev", "test"):
        split = f"{split}_matched"
    path = _resolve_path(Path(root).expanduser(), t, split)
    rows = read_tsv(path)
    y_col: int | None  # None: the split has no labels
    if t.name == "cola" and not split.startswith("test"):
        header, body, first_line = None, rows, 1
        a_col, b_col, y_col, width = 3, None, 1, _COLA_FIELDS
    else:
        if not rows:
            raise GlueFormatError(f"{path}: empty file, expected a header row")
        header, body, first_line = rows[0], rows[1:], 2
        a_col = _column(header, t.text_a, path, t)
        b_col = None if t.text_b is None else _column(header, t.text_b, path, t)
        y_col = header.index(t.label) if t.label in header else None
        width = len(header)
    text_a: list[str] = []
    text_b: list[str] | None = None if b_col is None else []
    labels: list[Any] = []
    bad: list[int] = []
    for lineno, row in enumerate(body, start=first_line):
        if len(row) != width:
            bad.append(lineno)
            continue
        if y_col is None:
            label: Any = math.nan if t.is_regression else -1
        else:
            label = _label(t, row[y_col])
            if label is None:
                bad.append(lineno)
                continue
        text_a.append(row[a_col])
        if text_b is not None and b_col is not None:
            text_b.append(row[b_col])
        labels.append(label)
    _check_bad(bad, len(body), path, t, header)
    dtype = np.float32 if t.is_regression else np.int64
    return GlueDataset(t, split, path, text_a, text_b, np.asarray(labels, dtype=dtype))


def _column(header: list[str], name: str, path: Path, task: GlueTask) -> int:
    if name not in header:
        raise GlueFormatError(
            f"{path}: no column {name!r} in the header {header}; this is not the official GLUE "
            f"{task.folder} layout (see contrastive.data.glue)"
        )
    return header.index(name)


def _label(task: GlueTask, raw: str) -> Any:
    raw = raw.strip()
    if task.is_regression:
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if math.isfinite(value) else None
    assert task.label_values is not None
    return task.label_values.index(raw) if raw in task.label_values else None


def _check_bad(bad: list[int], total: int, path: Path, task: GlueTask,
               header: list[str] | None) -> None:
    if not bad:
        return
    where = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    if len(bad) > MAX_BAD_FRACTION * total:
        layout = ("4 fields without a header: source, label (0/1), original annotation, "
                  "sentence") if header is None else f"{len(header)} fields as in the header"
        raise GlueFormatError(
            f"{path}: {len(bad)} of {total} rows are malformed (lines {where}); GLUE {task.folder} "
            f"rows have {layout} and labels {task.label_values or 'as numbers'}; is this the "
            "right task's file? It must be read with quoting disabled (contrastive.data.glue.read_tsv)"
        )
    log.warning("%s: skipped %d malformed rows of %d (lines %s)", path, len(bad), total, where)


def glue_metrics(task: str, predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray
                 ) -> dict[str, float]:
    """The official GLUE metrics of a task, computed with scikit-learn and scipy.

    Args:
        task: a GLUE task name.
        predictions: (N,) class ids, or (N, C) logits (arg-max taken); STS-B: (N,) or (N, 1)
            predicted scores.
        labels: (N,) gold class ids / scores (a dev split: test splits have no labels).

    Returns:
        ``{"accuracy"}`` (SST-2, MNLI, QNLI, RTE), ``{"accuracy", "f1"}`` (MRPC, QQP),
        ``{"mcc"}`` (CoLA), ``{"pearson", "spearman"}`` (STS-B), each plus ``"score"``.
    """
    from scipy import stats
    from sklearn import metrics as skm

    t = _task(task)
    pred = np.asarray(predictions)
    gold = np.asarray(labels)
    if pred.ndim == 2:
        pred = pred[:, 0] if t.is_regression and pred.shape[1] == 1 else pred.argmax(axis=1)
    if pred.ndim != 1 or gold.ndim != 1 or len(pred) != len(gold) or len(gold) == 0:
        raise ValueError(
            f"glue_metrics({t.name}): predictions {np.shape(predictions)} and labels "
            f"{np.shape(labels)} must be N >= 1 values each (predictions may be (N, C) logits)"
        )
    out: dict[str, float] = {}
    if t.is_regression:
        pred, gold = pred.astype(np.float64), gold.astype(np.float64)
        if np.isnan(gold).any():
            raise ValueError(f"glue_metrics({t.name}): labels contain NaN (an unlabelled test split?)")
        out["pearson"] = float(stats.pearsonr(pred, gold)[0])
        out["spearman"] = float(stats.spearmanr(pred, gold)[0])
    else:
        gold = gold.astype(np.int64)
        if (gold < 0).any():
            raise ValueError(f"glue_metrics({t.name}): labels contain -1 (an unlabelled test split?)")
        pred = pred.astype(np.int64)
        if "mcc" in t.metrics:
            out["mcc"] = float(skm.matthews_corrcoef(gold, pred))
        else:
            out["accuracy"] = float(skm.accuracy_score(gold, pred))
        if "f1" in t.metrics:
            out["f1"] = float(skm.f1_score(gold, pred, pos_label=1, average="binary", zero_division=0))
    out["score"] = float(np.mean([out[m] for m in t.metrics]))
    return out
