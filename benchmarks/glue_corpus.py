"""The corpus of issue 51's pre-training distillation (step 5): the pooled GLUE training
sentences the study may show a student without labels, one sentence a line.

The training sentences of SST-2 (all its rows), CoLA, MRPC, RTE, STS-B and WNLI, in that task
order and in file order, a pair's two sentences as two lines; left out: every sentence of a row
the study holds out to choose learning rates on (``glue_floors.task_splits``: 10 % of each
study task's training rows, data seed 0; for SST-2 those of its 10,000-row subset; WNLI is no
study task, none of its rows is held out) and every dev sentence of these six tasks, both by
text (a sentence that is also in a kept MRPC pair goes too: no held-out or dev text reaches the
corpus); empty sentences; exact duplicates after the first. The result is deterministic: the
same GLUE files give the same bytes (``corpus.json`` holds their sha256).

    python benchmarks/lrc_glue.py corpus --root R    # R/general/corpus.txt and corpus.json
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from glue_floors import ALL_TASKS, task_splits

from contrastive.data.glue import load_glue, read_tsv

CORPUS_TASKS = {"sst2": "SST-2", "cola": "CoLA", "mrpc": "MRPC", "rte": "RTE", "stsb": "STS-B",
                "wnli": "WNLI"}  # the order of the corpus


def _columns(task: str, glue_dir: Path, split: str) -> dict[str, list[str]]:
    """A split's sentence columns by name (WNLI, unknown to ``load_glue``, read from its TSV)."""
    if task == "wnli":
        header, *rows = read_tsv(glue_dir / CORPUS_TASKS[task] / f"{split}.tsv")
        return {c: [r[header.index(c)] for r in rows] for c in ("sentence1", "sentence2")}
    ds = load_glue(task, glue_dir / CORPUS_TASKS[task], split)
    cols = {ds.task.text_a: ds.text_a}
    if ds.text_b is not None and ds.task.text_b is not None:
        cols[ds.task.text_b] = ds.text_b
    return cols


def corpus_lines(glue_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """The corpus's sentences in order and its counts (per task and column, and what was left
    out and why)."""
    dev = {s for t in CORPUS_TASKS for col in _columns(t, glue_dir, "dev").values() for s in col}
    held: set[str] = set()
    for task in CORPUS_TASKS:
        if task in ALL_TASKS:
            kept_out = task_splits(task, glue_dir)[1]
            held.update(kept_out.text_a + (kept_out.text_b or []))
    lines: list[str] = []
    seen: set[str] = set()
    counts: dict[str, dict[str, int]] = {}
    left_out = {"dev": 0, "held_out": 0, "duplicate": 0, "empty": 0}
    for task in CORPUS_TASKS:
        cols = _columns(task, glue_dir, "train")
        counts[task] = dict.fromkeys(cols, 0)
        for row in zip(*cols.values()):
            for col, sentence in zip(cols, row):
                why = ("empty" if not sentence.strip() else "dev" if sentence in dev else
                       "held_out" if sentence in held else "duplicate" if sentence in seen
                       else None)
                if why:
                    left_out[why] += 1
                    continue
                seen.add(sentence)
                lines.append(sentence)
                counts[task][col] += 1
    return lines, {"per_task": counts, "left_out": left_out}


def write_corpus(out_dir: Path, glue_dir: Path) -> dict[str, Any]:
    """Write ``out_dir/corpus.txt`` (UTF-8, a sentence a line) and ``out_dir/corpus.json`` (its
    line count, sha256, counts and how it was made); returns the latter."""
    lines, counts = corpus_lines(glue_dir)
    data = "".join(f"{s}\n" for s in lines).encode("utf-8")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "corpus.txt").write_bytes(data)
    info = {"lines": len(lines), "sha256": hashlib.sha256(data).hexdigest(), **counts,
            "how": __doc__.split("\n\n")[1].replace("\n", " "), "glue_dir": str(glue_dir)}
    (out_dir / "corpus.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
