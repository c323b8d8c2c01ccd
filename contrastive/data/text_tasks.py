"""Text tasks for the fine-tuning and distillation recipes: the generated task or a GLUE task.

:func:`load_task` returns a :class:`TextTask`: train and dev sets (items ``{"text_a",
["text_b"], "label"}``), the GLUE task whose official metric scores it, the number of labels
and whether it is a regression. The generated tasks (:mod:`contrastive.data.generated_text`) are
``generated`` (binary sentiment, scored like SST-2), ``generated-nli`` (premise / hypothesis,
three classes, like MNLI) and ``generated-sts`` (scores 0-5, like STS-B); their dev set is the
generated ``test`` split (an independent stream). GLUE tasks read the official TSV files from
``glue_dir`` (MNLI's dev set is ``dev_matched``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GENERATED_TASKS", "TextTask", "check_task", "load_task", "generated_tokenizer"]

GENERATED_TASKS = {"generated": "sst2", "generated-nli": "mnli", "generated-sts": "stsb"}


@dataclass
class TextTask:
    """A task's data and how it is scored (see the module docstring)."""

    name: str
    train: Any
    dev: Any
    metric_task: str
    num_labels: int
    regression: bool
    eval_split: str = "dev"  # what ``dev`` holds: "dev", or "held_out" (rows of the training split)


def check_task(name: str, glue_dir: str | Path | None = None) -> str:
    """The canonical name of task ``name`` (generated or GLUE), before any data is read: an
    unknown name fails listing both kinds, a GLUE task without ``glue_dir`` names the flag."""
    from contrastive.data.glue import GLUE_TASKS, _task

    key = name.lower()
    if key in GENERATED_TASKS:
        return key
    try:
        task = _task(key)
    except ValueError:
        raise ValueError(f"unknown task {name!r}: use a GLUE task {sorted(GLUE_TASKS)} (with "
                         f"--glue-dir) or a generated one {sorted(GENERATED_TASKS)}") from None
    if glue_dir is None:
        raise ValueError(f"task {name!r} is a GLUE task: pass --glue-dir /path/to/glue_data "
                         f"(the folder holding {task.folder}/), or use one of "
                         f"{sorted(GENERATED_TASKS)}")
    return task.name


def load_task(name: str, glue_dir: str | Path | None = None, *, n_train: int = 4000,
              n_dev: int = 1000, seed: int = 0, train_rows: int = 0, held_out: int = 0,
              eval_on: str = "dev") -> TextTask:
    """The task ``name`` (a generated task, or a GLUE task read from ``glue_dir``).

    ``n_train`` / ``n_dev``: sizes of a generated task (ignored for GLUE); ``seed``: its stream,
    and for GLUE the draws below. GLUE only: ``train_rows`` > 0 trains on a stratified subset of
    that many training rows (:func:`~contrastive.data.glue.stratified_indices`); ``held_out``
    > 0 holds that many of the (remaining) training rows out, stratified
    (:meth:`~contrastive.data.glue.GlueDataset.split_off`), and ``eval_on="held_out"`` scores
    them instead of the dev set: hyper-parameters chosen there leave the reported dev set unseen.
    """
    if eval_on not in ("dev", "held_out") or (eval_on == "held_out" and held_out <= 0):
        raise ValueError(f"eval_on must be 'dev', or 'held_out' with held_out > 0 rows; got "
                         f"eval_on={eval_on!r}, held_out={held_out}")
    from contrastive.data import generated_text as gen

    key = check_task(name, glue_dir)
    if key in GENERATED_TASKS and (train_rows or held_out):
        raise ValueError(f"train_rows / held_out subset GLUE training files; the generated task "
                         f"{key!r} sets its sizes with n_train / n_dev")
    if key in GENERATED_TASKS:
        if key == "generated":
            train, dev = (gen.generate_sentiment(n, seed, s) for n, s in ((n_train, "train"),
                                                                          (n_dev, "test")))
        elif key == "generated-nli":  # 3 pairs per quadruple
            train = gen.generate_nli(max(1, n_train // 3), seed, "train").pairs()
            dev = gen.generate_nli(max(1, n_dev // 3), seed, "test").pairs()
        else:
            train, dev = gen.generate_sts(n_train, seed, "train"), gen.generate_sts(n_dev, seed, "test")
        return TextTask(key, train, dev, GENERATED_TASKS[key], train.num_labels,
                        not train.label_names)
    from contrastive.data.glue import _task, load_glue, stratified_indices

    assert glue_dir is not None  # check_task
    task = _task(name)
    dev_split = "dev_matched" if task.name == "mnli" else "dev"
    rows = load_glue(task.name, glue_dir, "train")
    scored = load_glue(task.name, glue_dir, dev_split)
    if not 0 <= train_rows <= len(rows) or not 0 <= held_out < (train_rows or len(rows)):
        raise ValueError(f"{task.name} has {len(rows)} training rows: train_rows ({train_rows}) "
                         f"must be at most that, held_out ({held_out}) fewer than the rows kept")
    if train_rows:
        rows = rows.subset(stratified_indices(rows.labels, train_rows, seed,
                                              regression=task.is_regression))
    if held_out:
        rows, kept_out = rows.split_off(held_out, seed)
        if eval_on == "held_out":
            scored = kept_out
    return TextTask(task.name, rows, scored, task.name, task.num_labels, task.is_regression,
                    eval_on)


def generated_tokenizer(vocab_size: int = 400, max_length: int = 64, n: int = 2000,
                        seed: int = 0) -> Any:
    """The deterministic WordPiece tokenizer of the generated tasks (trained on their corpus)."""
    from contrastive.data.generated_text import text_corpus
    from contrastive.data.tokenizer import train_wordpiece

    return train_wordpiece(text_corpus(n, seed), vocab_size=vocab_size, max_length=max_length)
