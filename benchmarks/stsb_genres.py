"""Why STS-B's held-out score sits above its dev score: the two differ in genre mix.

The study's STS-B held-out rows are 10 % of GLUE's training file (stratified by score quintile),
so they keep the training file's genres (35 % captions, 8 % forum, 57 % news), while the dev
file has 42 % captions, 25 % forums, 33 % news, and its forum pairs come from another source
than the training file's. A predictor weak on the dev forum rows scores lower on dev as a whole
than on held-out rows, with no defect anywhere. This script shows it per predictor: Pearson on
held-out and on dev, dev per genre, and dev resampled (per genre, with replacement) to the
held-out rows' genre shares.

Usage::

    python benchmarks/stsb_genres.py                       # the bag-of-words floor only
    python benchmarks/stsb_genres.py --model RUN/model ...  # and saved STS-B classifiers
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glue_floors import bag_of_words_fit, task_splits  # noqa: E402

from contrastive.data.glue import glue_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GLUE = ROOT.parent / "shared" / "data" / "glue"
RESAMPLES = 200


def genres_of(glue_dir: Path, dataset: Any) -> np.ndarray:
    """Each row's genre (``main-captions``, ``main-forum``, ``main-news``; the dev file's
    ``main-forums`` read as ``main-forum``), matched on its sentence pair in the TSVs."""
    pairs: dict[tuple[str, str], str] = {}
    for split in ("train", "dev"):
        with open(glue_dir / "STS-B" / f"{split}.tsv", newline="", encoding="utf-8") as f:
            rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            head = next(rows)
            g, a, b = head.index("genre"), head.index("sentence1"), head.index("sentence2")
            pairs.update({(r[a], r[b]): r[g].replace("forums", "forum") for r in rows if r})
    return np.array([pairs.get(p, "?") for p in zip(dataset.text_a, dataset.text_b)])


def pearson(pred: np.ndarray, gold: np.ndarray) -> float:
    return float(glue_metrics("stsb", pred, gold)["pearson"])


def resampled_to(pred: np.ndarray, gold: np.ndarray, genres: np.ndarray,
                 shares: dict[str, float], seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of Pearson over ``RESAMPLES`` draws of the rows, each genre
    drawn with replacement to its share in ``shares`` (the same number of rows in all)."""
    rng = np.random.default_rng(seed)
    sizes = {g: round(len(pred) * s) for g, s in shares.items()}
    values = []
    for _ in range(RESAMPLES):
        idx = np.concatenate([rng.choice(np.flatnonzero(genres == g), size=n, replace=True)
                              for g, n in sizes.items() if n])
        values.append(pearson(pred[idx], gold[idx]))
    return float(np.mean(values)), float(np.std(values))


def bag_of_words_predictions(train: Any, held: Any, dev: Any) -> tuple[np.ndarray, np.ndarray]:
    """Held-out and dev predictions of ``glue_floors``' STS-B floor (its bag of words)."""
    predict, _ = bag_of_words_fit(train, held)
    return predict(held), predict(dev)


def model_predictions(model_dir: Path, held: Any, dev: Any) -> tuple[np.ndarray, np.ndarray]:
    """Held-out and dev predictions of a saved classifier folder (an STS-B run's ``model``)."""
    import torch

    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.eval.classifier_folder import load_classifier
    from contrastive.eval.glue import predict_all

    model, _ = load_classifier(model_dir)
    tokenizer = load_tokenizer(model_dir)
    with torch.no_grad():
        held_pred, dev_pred = (predict_all(model, ds, tokenizer)[0].numpy() for ds in (held, dev))
    return held_pred.reshape(len(held_pred), -1)[:, 0], dev_pred.reshape(len(dev_pred), -1)[:, 0]


def report(name: str, held_pred: np.ndarray, dev_pred: np.ndarray, held: Any, dev: Any,
           held_genres: np.ndarray, dev_genres: np.ndarray) -> str:
    """One markdown row (Pearson x 100): held-out, dev, each genre's held-out / dev, and dev
    at the held-out genre mix."""
    gold_h, gold_d = np.asarray(held.labels), np.asarray(dev.labels)
    shares = {g: float((held_genres == g).mean()) for g in sorted(set(held_genres))}
    per = [(pearson(held_pred[held_genres == g], gold_h[held_genres == g]),
            pearson(dev_pred[dev_genres == g], gold_d[dev_genres == g])) for g in shares]
    mean, sd = resampled_to(dev_pred, gold_d, dev_genres, shares)
    return (f"| {name} | {100 * pearson(held_pred, gold_h):.1f} | "
            f"{100 * pearson(dev_pred, gold_d):.1f} | "
            + " | ".join(f"{100 * h:.1f} / {100 * d:.1f}" for h, d in per)
            + f" | {100 * mean:.1f} ({100 * sd:.1f}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, action="append", default=[],
                        help="a saved STS-B classifier folder (repeatable)")
    parser.add_argument("--glue", type=Path, default=GLUE)
    args = parser.parse_args(argv)
    if not (args.glue / "STS-B" / "dev.tsv").is_file():
        print(f"error: no STS-B under {args.glue}: pass --glue DIR (GLUE's TSV folders)")
        return 2
    for m in args.model:
        if not m.is_dir():
            print(f"error: {m} is not a saved classifier folder (a run's model/)")
            return 2
    train, held, dev = task_splits("stsb", args.glue)
    gh, gd = genres_of(args.glue, held), genres_of(args.glue, dev)
    names = sorted(set(gh))
    print("Genre rows, held-out / dev: " + ", ".join(
        f"{g.removeprefix('main-')} {(gh == g).sum()} / {(gd == g).sum()}" for g in names))
    print()
    print("| predictor | held-out | dev | " + " | ".join(
        f"{g.removeprefix('main-')} (held-out / dev)" for g in names)
        + " | dev at the held-out mix (sd) |")
    print("|---" * (4 + len(names)) + "|")
    print(report("bag of words", *bag_of_words_predictions(train, held, dev), held, dev, gh, gd))
    for m in args.model:
        print(report(str(m), *model_predictions(m, held, dev), held, dev, gh, gd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
