"""WordPiece tokenizers (Hugging Face ``tokenizers``), trained here or read from a BERT folder.

- :func:`train_wordpiece` trains a BERT-style WordPiece vocabulary on any iterable of strings
  (e.g. :func:`contrastive.data.generated_text.text_corpus`); nothing is downloaded.
- :func:`load_tokenizer` reads a folder: our ``tokenizer.json`` (what :meth:`TextTokenizer.save`
  writes; also what a Hugging Face "fast" tokenizer folder holds) or, failing that, a BERT
  ``vocab.txt`` (lower-casing from ``tokenizer_config.json``'s ``do_lower_case``, default on).
  Both are plain text / JSON: loading runs no code.

The pipeline is BERT's: normalise (clean, optionally lower-case and strip accents), split on
white space and punctuation, WordPiece with ``##`` continuations, ``[CLS] A [SEP]`` and
``[CLS] A [SEP] B [SEP]`` with token type ids 0 / 1.

A :class:`TextTokenizer` call returns the batch the encoders take: ``input_ids``,
``attention_mask`` and ``token_type_ids``, each (B, T) int64, padded with ``[PAD]`` to the
longest sequence of the batch and truncated to ``max_length``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from contrastive.optional_deps import require

__all__ = ["SPECIAL_TOKENS", "TextTokenizer", "load_tokenizer", "train_wordpiece"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"
_FEATURE = "tokenizers"


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with BERT's special tokens, returning torch batches.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` whose vocabulary holds :data:`SPECIAL_TOKENS`
            (its post-processor is set to BERT's template here).
        max_length: longest sequence, special tokens included (truncation beyond).
    """

    def __init__(self, tokenizer: Any, max_length: int = 128) -> None:
        if not isinstance(max_length, int) or max_length < 3:
            raise ValueError(f"TextTokenizer: max_length must be an int >= 3, got {max_length!r}")
        tokenizers = require("tokenizers", "tokenizers")
        missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise ValueError(f"TextTokenizer: the vocabulary lacks the special tokens {missing}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_id: int = tokenizer.token_to_id("[PAD]")
        self.cls_id: int = tokenizer.token_to_id("[CLS]")
        self.sep_id: int = tokenizer.token_to_id("[SEP]")
        self.unk_id: int = tokenizer.token_to_id("[UNK]")
        self.mask_id: int = tokenizer.token_to_id("[MASK]")
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))  # already in the vocabulary: same ids
        tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", self.cls_id), ("[SEP]", self.sep_id)],
        )
        tokenizer.enable_truncation(max_length)
        tokenizer.enable_padding(pad_id=self.pad_id, pad_token="[PAD]")

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary (the ``vocab_size`` of an encoder built for it)."""
        return int(self.tokenizer.get_vocab_size())

    def __call__(self, text_a: str | Sequence[str], text_b: str | Sequence[str] | None = None
                 ) -> dict[str, Tensor]:
        """Tokenise a batch: ``input_ids``, ``attention_mask``, ``token_type_ids``, (B, T) int64."""
        a = [text_a] if isinstance(text_a, str) else list(text_a)
        if text_b is None:
            encodings = self.tokenizer.encode_batch(a)
        else:
            b = [text_b] if isinstance(text_b, str) else list(text_b)
            if len(a) != len(b):
                raise ValueError(f"TextTokenizer: {len(a)} first texts but {len(b)} second texts")
            encodings = self.tokenizer.encode_batch(list(zip(a, b)))
        if not encodings:
            raise ValueError("TextTokenizer: empty batch")
        return {
            "input_ids": torch.tensor([e.ids for e in encodings], dtype=torch.long),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings], dtype=torch.long),
            "token_type_ids": torch.tensor([e.type_ids for e in encodings], dtype=torch.long),
        }

    def collate(self, items: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        """``collate_fn`` for items ``{"text_a", ["text_b"], "label"}`` (GLUE, generated).

        Returns the token tensors plus ``labels``: (B,) int64, or float32 for float labels.
        """
        batch = self([it["text_a"] for it in items],
                     [it["text_b"] for it in items] if "text_b" in items[0] else None)
        labels = [it["label"] for it in items]
        dtype = torch.float32 if any(isinstance(y, float) for y in labels) else torch.long
        batch["labels"] = torch.tensor(labels, dtype=dtype)
        return batch

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids back to text (special tokens dropped, ``##`` pieces joined)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def save(self, folder: str | Path) -> Path:
        """Write ``tokenizer.json`` (plain JSON) into ``folder``; returns its path."""
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(path / TOKENIZER_FILE))
        return path / TOKENIZER_FILE


def _bert_pipeline(model: Any, lowercase: bool) -> Any:
    tokenizers = require("tokenizers", _FEATURE)
    tok = tokenizers.Tokenizer(model)
    tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.decoder = tokenizers.decoders.WordPiece()
    return tok


def train_wordpiece(texts: Iterable[str], vocab_size: int = 1000, min_frequency: int = 1,
                    lowercase: bool = True, max_length: int = 128, deterministic: bool = True
                    ) -> TextTokenizer:
    """Train a BERT-style WordPiece tokenizer on ``texts`` (offline).

    Args:
        texts: the training corpus, one string per sentence.
        vocab_size: target vocabulary size, special tokens and characters included (smaller
            if the corpus has fewer distinct pieces; never fewer than the characters seen).
        min_frequency: pairs seen fewer times are not merged.
        lowercase: lower-case (and strip accents) before splitting, as BERT uncased.
        max_length: see :class:`TextTokenizer`.
        deterministic: learn the merges here, most frequent pair first and ties broken by the
            pair's text, so the same corpus always gives the same vocabulary and ids (the
            ``tokenizers`` trainer breaks ties in hash-map order: its vocabulary changes from
            call to call). ``False`` uses ``tokenizers.trainers.WordPieceTrainer`` (faster on
            large corpora, not reproducible). Either way, normalisation, pre-tokenisation and
            encoding are the ``tokenizers`` library's.
    """
    tokenizers = require("tokenizers", _FEATURE)
    if not deterministic:
        tok = _bert_pipeline(tokenizers.models.WordPiece(unk_token="[UNK]"), lowercase)
        trainer = tokenizers.trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        )
        tok.train_from_iterator(iter(texts), trainer=trainer)
        return TextTokenizer(tok, max_length=max_length)
    splitter = _bert_pipeline(tokenizers.models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"),
                              lowercase)
    words: Counter[str] = Counter()
    for text in texts:
        normal = splitter.normalizer.normalize_str(text)
        words.update(w for w, _ in splitter.pre_tokenizer.pre_tokenize_str(normal))
    vocab = _learn_vocab(words, vocab_size, min_frequency)
    model = tokenizers.models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]")
    return TextTokenizer(_bert_pipeline(model, lowercase), max_length=max_length)


def _learn_vocab(words: Counter[str], vocab_size: int, min_frequency: int) -> list[str]:
    """WordPiece vocabulary by greedy pair merging (as the ``tokenizers`` trainer), ties by text."""
    splits = {w: [w[0]] + ["##" + c for c in w[1:]] for w in sorted(words) if w}
    vocab = list(SPECIAL_TOKENS)
    vocab += sorted({p for pieces in splits.values() for p in pieces} - set(vocab))
    known = set(vocab)
    while len(vocab) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, pieces in splits.items():
            for pair in zip(pieces, pieces[1:]):
                pairs[pair] += words[w]
        if not pairs:
            break
        (a, b), count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < min_frequency:
            break
        merged = a + b[2:]
        for w, pieces in splits.items():
            i, out = 0, []
            while i < len(pieces):
                if i + 1 < len(pieces) and pieces[i] == a and pieces[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(pieces[i])
                    i += 1
            splits[w] = out
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
    return vocab


def load_tokenizer(folder: str | Path, max_length: int = 128) -> TextTokenizer:
    """A tokenizer from a folder: ``tokenizer.json``, else a BERT ``vocab.txt`` (see module)."""
    path = Path(folder).expanduser()
    if path.is_file():
        path = path.parent
    tokenizers = require("tokenizers", _FEATURE)
    if not path.exists():
        raise FileNotFoundError(f"load_tokenizer: {path} does not exist; give a folder holding "
                                f"{TOKENIZER_FILE} or vocab.txt (a BERT checkpoint folder)")
    if (path / TOKENIZER_FILE).is_file():
        return TextTokenizer(tokenizers.Tokenizer.from_file(str(path / TOKENIZER_FILE)), max_length)
    vocab_file = path / "vocab.txt"
    if not vocab_file.is_file():
        raise FileNotFoundError(
            f"load_tokenizer: {path} holds neither {TOKENIZER_FILE} nor vocab.txt; train one with "
            "contrastive.text.train_wordpiece or point at a BERT checkpoint folder"
        )
    vocab: dict[str, int] = {}
    with open(vocab_file, encoding="utf-8") as f:
        for i, line in enumerate(f):  # the id of a token is its line number, as in BERT
            token = line.rstrip("\n")
            if token:
                vocab.setdefault(token, i)
    lowercase = True
    config = path / "tokenizer_config.json"
    if config.is_file():
        lowercase = bool(json.loads(config.read_text(encoding="utf-8")).get("do_lower_case", True))
    model = tokenizers.models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100)
    return TextTokenizer(_bert_pipeline(model, lowercase), max_length)
