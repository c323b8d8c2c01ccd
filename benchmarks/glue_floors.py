"""The floors of the LRC-BERT GLUE table (issues 30, 51): majority class and bag-of-words logistic
regression per task, on the real GLUE files, in seconds.

Tasks and data, as the distillation runs use them: MRPC, CoLA, RTE and STS-B whole (RTE and
STS-B since issue 51: ``TASKS2``), SST-2 a stratified subset of 10,000 of its 67,349 training
rows (:func:`~contrastive.data.glue.stratified_indices`, seed 0); from each training set 10 %
are held out (stratified, seed 0; STS-B's scores stratified by quintile) to choose
hyper-parameters on; the dev sets are whole and only reported. The splits are the recipes'
(``--train-rows``, ``--held-out``, ``--data-seed``: :func:`split_sizes` gives the numbers).

- majority: the most frequent training label predicted for every dev example. STS-B
  (regression): the training rows' mean score predicted everywhere; a constant has no
  correlation (Pearson and Spearman are undefined), given as 0.
- bag of words: binary unigram + bigram counts (lower-cased, the words of the training rows
  seen at least twice) and an L2 logistic regression (scikit-learn, lbfgs); pair tasks (MRPC,
  RTE, STS-B) get the counts of each sentence and their product (the words both share). C is
  chosen from {0.03, 0.1, 0.3, 1, 3, 10} on the held-out rows by the task's GLUE score, then
  reported on dev. STS-B: a ridge regression on the same features, its alpha chosen from
  {0.1, 0.3, 1, 3, 10, 30} the same way.

    python benchmarks/glue_floors.py [--glue-dir ../shared/data/glue] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contrastive.data.glue import GlueDataset, glue_metrics, load_glue  # noqa: E402
from contrastive.data.text_tasks import load_task  # noqa: E402
from contrastive.hardware import cpu_kind_line  # noqa: E402

TASKS = {"mrpc": "MRPC", "cola": "CoLA", "sst2": "SST-2"}  # issue 30's table
TASKS2 = {"rte": "RTE", "stsb": "STS-B"}  # issue 51, step 4: phases of their own
ALL_TASKS = {**TASKS, **TASKS2}
SST2_TRAIN_ROWS = 10_000
HELD_OUT_FRACTION = 0.1
C_GRID = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
RIDGE_ALPHAS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)  # STS-B's bag of words (regression)


def train_size(task: str, glue_dir: Path) -> int:
    """The training rows a task's runs draw from: SST-2's subset, else the whole file."""
    return SST2_TRAIN_ROWS if task == "sst2" else len(load_glue(task, glue_dir / ALL_TASKS[task],
                                                                "train"))


def split_sizes(task: str, glue_dir: Path) -> tuple[int, int]:
    """``(train_rows, held_out)`` of a task for the recipes' ``--train-rows`` / ``--held-out``:
    SST-2's subset (0 = all rows), and 10 % of the rows kept held out."""
    rows = SST2_TRAIN_ROWS if task == "sst2" else 0
    return rows, round(HELD_OUT_FRACTION * train_size(task, glue_dir))


def task_splits(task: str, glue_dir: Path, seed: int = 0) -> tuple[GlueDataset, GlueDataset,
                                                                   GlueDataset]:
    """``(train, held_out, dev)`` of one task, drawn as the recipes draw them
    (:func:`~contrastive.data.text_tasks.load_task` with ``--train-rows``, ``--held-out``,
    ``--data-seed``)."""
    rows, held = split_sizes(task, glue_dir)
    kept = load_task(task, glue_dir, train_rows=rows, held_out=held, seed=seed, eval_on="held_out")
    dev = load_task(task, glue_dir, train_rows=rows, held_out=held, seed=seed).dev
    return kept.train, kept.dev, dev


def majority(train: GlueDataset, dev: GlueDataset) -> dict[str, float]:
    """GLUE metrics of predicting the most frequent training label everywhere; for a regression
    task (STS-B) the training mean everywhere, whose correlations are undefined: 0."""
    if train.task.is_regression:
        return {m: 0.0 for m in (*train.task.metrics, "score")}
    label = int(np.bincount(train.labels).argmax())
    return glue_metrics(train.task.name, np.full(len(dev), label), dev.labels)


def bag_of_words_fit(train: GlueDataset, held_out: GlueDataset
                     ) -> tuple[Callable[[GlueDataset], np.ndarray], float]:
    """The logistic regression on binary uni- and bigrams (a pair: both sentences and their
    product) whose C scored best on ``held_out``, as a predictor of a dataset, and that C (a
    regression task: the ridge regression whose alpha scored best, and that alpha)."""
    from scipy import sparse
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression, Ridge

    vec = CountVectorizer(ngram_range=(1, 2), min_df=2, binary=True, lowercase=True)
    vec.fit(train.text_a + (train.text_b or []))

    def features(ds: GlueDataset) -> Any:
        a = vec.transform(ds.text_a)
        if ds.text_b is None:
            return a
        b = vec.transform(ds.text_b)
        return sparse.hstack([a, b, a.multiply(b)]).tocsr()

    x_train, x_held = features(train), features(held_out)
    best: tuple[float, float, Any] | None = None
    regression = train.task.is_regression
    for c in RIDGE_ALPHAS if regression else C_GRID:
        model = (Ridge(alpha=c) if regression else LogisticRegression(C=c, max_iter=2000)).fit(
            x_train, train.labels)
        score = glue_metrics(train.task.name, model.predict(x_held), held_out.labels)["score"]
        if best is None or score > best[0]:
            best = (score, c, model)
    assert best is not None
    chosen = best[2]
    return (lambda ds: chosen.predict(features(ds))), best[1]


def bag_of_words(train: GlueDataset, held_out: GlueDataset, dev: GlueDataset
                 ) -> tuple[dict[str, float], float]:
    """Dev metrics of ``bag_of_words_fit``'s predictor, and its C (or alpha)."""
    predict, c = bag_of_words_fit(train, held_out)
    return glue_metrics(train.task.name, predict(dev), dev.labels), c


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--glue-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "glue_floors.json"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    glue_dir = Path(args.glue_dir)
    if not glue_dir.is_dir():
        raise SystemExit(f"glue_floors.py: error: no GLUE folder {glue_dir}; pass --glue-dir")
    print(cpu_kind_line())
    rows: dict[str, Any] = {}
    for task in ALL_TASKS:
        start = time.perf_counter()
        train, held_out, dev = task_splits(task, glue_dir, args.seed)
        bow, c = bag_of_words(train, held_out, dev)
        rows[task] = {"train_rows": len(train), "held_out_rows": len(held_out),
                      "dev_rows": len(dev), "majority": majority(train, dev),
                      "bag_of_words": bow,
                      "bag_of_words_alpha" if train.task.is_regression else "bag_of_words_C": c,
                      "seconds": round(time.perf_counter() - start, 2)}
        if train.task.is_regression:
            rows[task]["majority_predictor"] = ("the training mean everywhere: a constant has no "
                                                "correlation (undefined), given as 0")
        print(f"{task}: majority {rows[task]['majority']}, bag of words "
              f"({'alpha' if train.task.is_regression else 'C'}={c}) {bow}, "
              f"{rows[task]['seconds']} s")
    result = {"cpu_kind": cpu_kind_line(), "seed": args.seed, "tasks": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
