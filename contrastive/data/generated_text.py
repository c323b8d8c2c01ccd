"""A generated text task, like ``shapes`` for images: offline, seeded, with a real rule to learn.

Sentences are short film reviews built from a small grammar. Each clause says something about a
*subject* (8 concepts, 2 synonyms each: "movie" / "film") with an *adjective* (12 concepts, 6
positive and 6 negative, 2 synonyms each: "great" / "excellent"), optionally intensified
("very") and optionally negated ("not" / "never")::

    clause   := SUBJECT "was" [NEGATOR] [INTENSIFIER] ADJECTIVE
    sentence := [FILLER] clause [SUFFIX]                          label: the clause
              | clause "and" clause          (same polarity)      label: either
              | clause ", but" clause                             label: the SECOND clause
              | "although" clause "," clause                      label: the SECOND clause
              | clause ", although" clause                        label: the FIRST clause

The label of :func:`generate_sentiment` is the polarity of the main clause: the adjective's
polarity, flipped by a negator. Word identity alone does not give it (a negator flips an
adjective; "but" and "although" decide which clause counts, by position), so a bag-of-words
model is well above chance but far from perfect, while a model that reads word order can learn
the rule exactly. Measured (tests/text/test_generated.py, 3,000 train / 2,000 test, seed 0):
bag-of-words logistic regression on unigram counts 0.70 test accuracy, on word 1-3-grams 0.90.

:func:`generate_nli` gives (premise, entailment, neutral, contradiction) quadruples for NLI and
supervised SimCSE: the entailment is a paraphrase (every subject / adjective / negator replaced
by its synonym, filler and suffix redrawn), the contradiction a hard negative that keeps the
premise's words but flips its main clause (toggle the negator or swap the adjective for its
antonym), the neutral a sentence about a different subject.

:func:`generate_sts` gives sentence pairs with a graded similarity in [0, 5], as STS-B: the second
sentence is a synonym paraphrase of the first with independent meaning edits, each lowering the
score by a fixed amount: another subject (-1.5), another adjective of the same polarity (-1),
the opposite polarity (-2.5).

Determinism: everything depends only on (seed, split); examples are drawn in order from one
stream, so a smaller set is a prefix of a larger one; train and test are independent streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from contrastive.data.text_batches import LabelledSentences

__all__ = [
    "NLI_LABELS",
    "SENTIMENT_LABELS",
    "GeneratedNLI",
    "GeneratedTextDataset",
    "generate_nli",
    "generate_sentiment",
    "generate_sts",
    "text_corpus",
]

SENTIMENT_LABELS = ("negative", "positive")
NLI_LABELS = ("entailment", "neutral", "contradiction")  # GLUE MNLI's label ids

SUBJECTS = (("movie", "film"), ("plot", "storyline"), ("acting", "performance"),
            ("music", "soundtrack"), ("ending", "finale"), ("story", "narrative"),
            ("script", "dialogue"), ("direction", "staging"))
# adjective concept k and k + 6 are antonyms; 0-5 positive, 6-11 negative
ADJECTIVES = (("great", "excellent"), ("charming", "delightful"), ("clever", "smart"),
              ("moving", "touching"), ("funny", "hilarious"), ("beautiful", "gorgeous"),
              ("awful", "terrible"), ("annoying", "irritating"), ("stupid", "dumb"),
              ("dull", "boring"), ("unfunny", "humorless"), ("ugly", "hideous"))
_N_POS = 6
NEGATORS = ("not", "never")
INTENSIFIERS = ("", "very", "really", "quite", "rather")
FILLERS = ("", "honestly ,", "i think", "overall ,", "to be fair ,", "in my view ,")
SUFFIXES = ("", "in the end", "at times", "for me", "to be honest")
_FORMS = ("single", "and", "but", "although_first", "although_second")
_FORM_P = (0.5, 0.15, 0.15, 0.1, 0.1)
P_NEGATED = 0.25
_SPLITS = {"train": 0, "test": 1}


def _stream(seed: int, split: str, salt: int) -> np.random.Generator:
    if split not in _SPLITS:
        raise ValueError(f"split must be 'train' or 'test' for a generated data set; got {split!r}")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), _SPLITS[split], salt])))


@dataclass
class Clause:
    """A clause's meaning and surface choices; polarity = adjective polarity, flipped if negated."""

    subject: int
    adjective: int
    negated: bool
    negator: int
    intensifier: int
    synonym_s: int
    synonym_a: int

    @property
    def polarity(self) -> int:
        positive = self.adjective < _N_POS
        return int(positive != self.negated)

    def text(self) -> str:
        words = [SUBJECTS[self.subject][self.synonym_s], "was"]
        if self.negated:
            words.append(NEGATORS[self.negator])
        if INTENSIFIERS[self.intensifier]:
            words.append(INTENSIFIERS[self.intensifier])
        words.append(ADJECTIVES[self.adjective][self.synonym_a])
        return "the " + " ".join(words)


@dataclass
class Sentence:
    """A generated sentence: its form, clauses (main clause index) and filler / suffix."""

    form: str
    clauses: list[Clause]
    main: int
    filler: int
    suffix: int

    @property
    def label(self) -> int:
        return self.clauses[self.main].polarity

    def text(self) -> str:
        c = [cl.text() for cl in self.clauses]
        if self.form == "single":
            body = c[0]
        elif self.form == "and":
            body = f"{c[0]} and {c[1]}"
        elif self.form == "but":
            body = f"{c[0]} , but {c[1]}"
        elif self.form == "although_first":  # "although A , B": B is the main clause
            body = f"although {c[0]} , {c[1]}"
        else:  # "A , although B": A is the main clause
            body = f"{c[0]} , although {c[1]}"
        parts = [FILLERS[self.filler], body, SUFFIXES[self.suffix]]
        return " ".join(p for p in parts if p)


def _clause(rng: np.random.Generator, polarity: int, subject: int | None = None) -> Clause:
    negated = bool(rng.random() < P_NEGATED)
    positive_adj = bool(polarity) != negated
    adjective = int(rng.integers(_N_POS)) + (0 if positive_adj else _N_POS)
    return Clause(
        subject=int(rng.integers(len(SUBJECTS))) if subject is None else subject,
        adjective=adjective,
        negated=negated,
        negator=int(rng.integers(len(NEGATORS))),
        intensifier=int(rng.integers(len(INTENSIFIERS))),
        synonym_s=int(rng.integers(2)),
        synonym_a=int(rng.integers(2)),
    )


def _sentence(rng: np.random.Generator, label: int, subject: int | None = None) -> Sentence:
    form = _FORMS[int(rng.choice(len(_FORMS), p=_FORM_P))]
    main_clause = _clause(rng, label, subject)
    if form == "single":
        clauses, main = [main_clause], 0
    else:
        other_pol = label if form == "and" else int(rng.integers(2))
        other = _clause(rng, other_pol)
        # the main clause is the second one except in "A , although B"
        clauses, main = ([main_clause, other], 0) if form == "although_second" else ([other, main_clause], 1)
    filler = int(rng.integers(len(FILLERS))) if form == "single" else 0
    suffix = int(rng.integers(len(SUFFIXES))) if form == "single" else 0
    return Sentence(form, clauses, main, filler, suffix)


class GeneratedTextDataset(LabelledSentences):
    """Sentences (or sentence pairs) with labels; items ``{"text_a", ["text_b"], "label"}``.

    Same attributes as a :class:`contrastive.data.glue.GlueDataset`: ``text_a``, ``text_b``
    (None for single sentences), ``labels`` (N,) int64 class ids (float32 scores for a
    regression task, whose ``label_names`` is empty), plus ``label_names``.
    """

    def __init__(self, text_a: list[str], labels: np.ndarray, label_names: tuple[str, ...],
                 text_b: list[str] | None = None) -> None:
        self.text_a, self.text_b, self.labels, self.label_names = text_a, text_b, labels, label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1



def _check_n(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")


def generate_sentiment(n: int = 5000, seed: int = 0, split: str = "train") -> GeneratedTextDataset:
    """``n`` labelled review sentences (binary sentiment of the main clause; see the module)."""
    _check_n(n)
    rng = _stream(seed, split, salt=11)
    sentences = [_sentence(rng, int(rng.integers(2))) for _ in range(n)]
    return GeneratedTextDataset([s.text() for s in sentences],
                                np.array([s.label for s in sentences], dtype=np.int64),
                                SENTIMENT_LABELS)


def _paraphrase(rng: np.random.Generator, s: Sentence) -> Sentence:
    clauses = [Clause(c.subject, c.adjective, c.negated, 1 - c.negator, c.intensifier,
                      1 - c.synonym_s, 1 - c.synonym_a) for c in s.clauses]
    filler = int(rng.integers(len(FILLERS))) if s.form == "single" else 0
    suffix = int(rng.integers(len(SUFFIXES))) if s.form == "single" else 0
    return Sentence(s.form, clauses, s.main, filler, suffix)


def _contradiction(rng: np.random.Generator, s: Sentence) -> Sentence:
    clauses = [Clause(**vars(c)) for c in s.clauses]
    toggle_negator = bool(rng.random() < 0.5)
    # "A and B" says both: flip both, the same way; otherwise flip the main clause only
    for c in clauses if s.form == "and" else [clauses[s.main]]:
        if toggle_negator:
            c.negated = not c.negated
        else:
            c.adjective = (c.adjective + _N_POS) % (2 * _N_POS)
    return Sentence(s.form, clauses, s.main, s.filler, s.suffix)


@dataclass
class GeneratedNLI:
    """Aligned lists of N premises, entailments (paraphrases), neutrals and contradictions."""

    premise: list[str]
    entailment: list[str]
    neutral: list[str]
    contradiction: list[str]

    def __len__(self) -> int:
        return len(self.premise)

    def pairs(self) -> GeneratedTextDataset:
        """3N (premise, hypothesis) pairs labelled as MNLI (entailment, neutral, contradiction)."""
        a, b, y = [], [], []
        for i, p in enumerate(self.premise):
            for label, h in enumerate((self.entailment[i], self.neutral[i], self.contradiction[i])):
                a.append(p)
                b.append(h)
                y.append(label)
        return GeneratedTextDataset(a, np.array(y, dtype=np.int64), NLI_LABELS, text_b=b)


def generate_nli(n: int = 5000, seed: int = 0, split: str = "train") -> GeneratedNLI:
    """``n`` (premise, entailment, neutral, contradiction) quadruples (see the module)."""
    _check_n(n)
    rng = _stream(seed, split, salt=23)
    out = GeneratedNLI([], [], [], [])
    for _ in range(n):
        s = _sentence(rng, int(rng.integers(2)))
        main_subject = s.clauses[s.main].subject
        other = (main_subject + 1 + int(rng.integers(len(SUBJECTS) - 1))) % len(SUBJECTS)
        out.premise.append(s.text())
        out.entailment.append(_paraphrase(rng, s).text())
        out.contradiction.append(_contradiction(rng, s).text())
        out.neutral.append(_sentence(rng, int(rng.integers(2)), subject=other).text())
    return out


def text_corpus(n: int = 5000, seed: int = 0) -> Iterator[str]:
    """Every sentence of the generated train sets (sentiment + NLI), to train a tokenizer on."""
    yield from generate_sentiment(n, seed, "train").text_a
    nli = generate_nli(n, seed, "train")
    for i in range(len(nli)):
        yield nli.premise[i]
        yield nli.entailment[i]
        yield nli.neutral[i]
        yield nli.contradiction[i]


STS_SUBJECT, STS_ADJECTIVE, STS_POLARITY = 1.5, 1.0, 2.5  # score lost per meaning edit


def generate_sts(n: int = 2000, seed: int = 0, split: str = "train") -> GeneratedTextDataset:
    """``n`` single-clause sentence pairs scored 0-5 by meaning (see the module), as STS-B."""
    _check_n(n)
    rng = _stream(seed, split, salt=37)
    a, b, scores = [], [], []
    for _ in range(n):
        first = _sentence(rng, int(rng.integers(2)))
        while first.form != "single":
            first = _sentence(rng, int(rng.integers(2)))
        second = _paraphrase(rng, first)
        c = second.clauses[0]
        score = 5.0
        if rng.random() < 0.4:
            c.subject = (c.subject + 1 + int(rng.integers(len(SUBJECTS) - 1))) % len(SUBJECTS)
            score -= STS_SUBJECT
        if rng.random() < 0.4:  # another adjective concept of the same polarity
            base = 0 if c.adjective < _N_POS else _N_POS
            c.adjective = base + (c.adjective - base + 1 + int(rng.integers(_N_POS - 1))) % _N_POS
            score -= STS_ADJECTIVE
        if rng.random() < 0.4:
            if rng.random() < 0.5:
                c.negated = not c.negated
            else:
                c.adjective = (c.adjective + _N_POS) % (2 * _N_POS)
            score -= STS_POLARITY
        a.append(first.text())
        b.append(second.text())
        scores.append(score)
    return GeneratedTextDataset(a, np.array(scores, dtype=np.float32), (), text_b=b)
