"""STS evaluation of sentence embeddings: Spearman correlation of cosine similarities with gold.

The protocol of SimCSE (Gao et al. 2021, arXiv:2104.08821, sec. 5 and App. B; the authors'
``evaluation.py`` / SentEval ``sts.py``): embed both sentences of every pair, score the pair by
the cosine similarity of the two embeddings (nothing is trained on the scores), and report
Spearman's rank correlation with the gold scores (Pearson alongside), computed by scipy, on
the 0-1 scale (the paper multiplies by 100). SimCSE selects checkpoints on the STS-B dev set.

- :func:`sts_correlation`: correlations of (N, D) x (N, D) embeddings with (N,) gold scores.
- :func:`evaluate_sts`: embed the pairs of a data set with a model and a tokenizer, then the above.
- ``contrastive-sts-eval`` (:func:`main`): a saved model folder on the GLUE STS-B TSV or on the
  generated task's graded pairs (:func:`contrastive.data.generated_text.generate_sts`); a
  sentence-transformers folder is embedded with its own pooling (and Dense / Normalize
  modules) unless ``--pooling`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.records import SENTENCE_CONFIG

if TYPE_CHECKING:
    from contrastive.nn.hf_folders import SentencePooling

__all__ = ["SentenceModel", "choose_sentence_pooling", "embed_texts", "evaluate_sts", "load_sentence_model", "load_sts_pairs", "main",
           "sts_correlation"]

log = logging.getLogger(__name__)

EmbedFn = Callable[..., Tensor]


def sts_correlation(emb_a: Tensor, emb_b: Tensor, scores: Sequence[float] | np.ndarray | Tensor
                    ) -> dict[str, float]:
    """Spearman / Pearson correlation of the pairs' cosine similarities with gold ``scores``.

    Args:
        emb_a, emb_b: (N, D) embeddings of the first and second sentences (any scale).
        scores: (N,) gold similarity scores (e.g. STS-B 0-5); N >= 2, not all equal.

    Returns:
        ``{"spearman", "pearson", "n"}``, correlations in [-1, 1].
    """
    from scipy import stats

    gold = np.asarray(scores.cpu() if isinstance(scores, Tensor) else scores, dtype=np.float64)
    if emb_a.dim() != 2 or emb_a.shape != emb_b.shape or gold.shape != (emb_a.shape[0],):
        raise ValueError(f"sts_correlation: embeddings (N, D) x (N, D) and scores (N,) needed, got "
                         f"{tuple(emb_a.shape)}, {tuple(emb_b.shape)} and {gold.shape}")
    if len(gold) < 2 or np.isnan(gold).any() or np.ptp(gold) == 0:
        raise ValueError("sts_correlation: needs N >= 2 labelled pairs with differing gold scores "
                         "(an unlabelled test split has NaN scores; use the dev split)")
    cos = F.cosine_similarity(emb_a.double(), emb_b.double(), dim=1).cpu().numpy()
    return {"spearman": float(stats.spearmanr(cos, gold)[0]),
            "pearson": float(stats.pearsonr(cos, gold)[0]), "n": float(len(gold))}


@torch.no_grad()
def embed_texts(embed: EmbedFn, tokenizer: Any, texts: Sequence[str], batch_size: int = 128,
                device: torch.device | str | None = None) -> Tensor:
    """(N, D) float embeddings of ``texts``, in batches, without gradient.

    ``embed(input_ids, attention_mask, token_type_ids)`` -> (B, D): a
    :class:`~contrastive.nn.text_encoders.TextEncoder` (its pooled output) or ``SimCSE.embed``.
    The caller chooses the mode (eval mode for dropout-free embeddings; :func:`evaluate_sts`
    does it).
    """
    if batch_size < 1:
        raise ValueError(f"embed_texts: batch_size must be >= 1, got {batch_size}")
    out = []
    for i in range(0, len(texts), batch_size):
        batch = tokenizer(list(texts[i:i + batch_size]))
        if device is not None:
            batch = {k: v.to(device) for k, v in batch.items()}
        out.append(embed(batch["input_ids"], batch["attention_mask"],
                         batch.get("token_type_ids")).float().cpu())
    return torch.cat(out)


def evaluate_sts(model: nn.Module, tokenizer: Any, text_a: Sequence[str], text_b: Sequence[str],
                 scores: Sequence[float] | np.ndarray, batch_size: int = 128,
                 embed: EmbedFn | None = None) -> dict[str, float]:
    """Embed both sides of the pairs with ``model`` in eval mode, then :func:`sts_correlation`.

    Args:
        model: the module whose mode (eval during the call, restored after) and device count;
            ``embed`` defaults to ``model`` itself (a TextEncoder), e.g. ``method.embed`` for SimCSE.
        tokenizer: a :class:`~contrastive.data.tokenizer.TextTokenizer`.
        text_a, text_b, scores: N pairs and gold scores (a GLUE STS-B dataset's ``text_a``,
            ``text_b``, ``labels``, or :func:`~contrastive.data.generated_text.generate_sts`'s).
    """
    if len(text_a) != len(text_b):
        raise ValueError(f"evaluate_sts: {len(text_a)} first sentences but {len(text_b)} second")
    fn = embed if embed is not None else model
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        emb_a = embed_texts(fn, tokenizer, text_a, batch_size, device)
        emb_b = embed_texts(fn, tokenizer, text_b, batch_size, device)
    finally:
        model.train(was_training)
    return sts_correlation(emb_a, emb_b, scores)


def load_sts_pairs(data: str, split: str = "dev", n: int = 2000, seed: int = 0
                   ) -> tuple[list[str], list[str], np.ndarray]:
    """(text_a, text_b, gold scores) of ``"generated"`` (``n`` pairs of the test stream, seed
    ``seed``) or of GLUE STS-B (``data`` = its folder or one of its TSV files, ``split``)."""
    if data == "generated":
        from contrastive.data.generated_text import generate_sts

        ds: Any = generate_sts(n, seed=seed, split="test" if split in ("dev", "test") else split)
    else:
        from contrastive.data.glue import load_glue

        path = Path(data)
        if path.is_file():  # a TSV file: its folder, its name as the split
            path, split = path.parent, path.stem
        ds = load_glue("stsb", path, split)
    return list(ds.text_a), list(ds.text_b), np.asarray(ds.labels, dtype=np.float64)


@dataclass
class SentenceModel:
    """A text model ready to embed sentences: ``embed(ids, mask, types)`` -> (B, D)."""

    encoder: nn.Module  # a TextEncoder (its mode and device are the caller's)
    tokenizer: Any
    embed: EmbedFn  # the encoder itself, or a sentence-transformers pipeline over it
    pooling: str  # the pooling applied, in words
    pooling_from: str  # why that pooling
    model_dir: Path  # the Hugging Face folder the weights came from


def choose_sentence_pooling(folder: Path, pooling: str | None) -> tuple[str | None, SentencePooling | None, str]:
    """(pooling, pipeline, why) of a saved text model's sentence embedding, in this order:
    ``pooling``; the folder's ``simcse.json`` (recipes/simcse.py); a sentence-transformers
    folder's own pipeline (``modules.json``); else ``auto``. ``max`` (sentence-transformers'
    max over tokens) is a pipeline, not a :class:`~contrastive.nn.text_encoders.TextEncoder`
    pooling. The one rule of ``contrastive-sts-eval``, ``contrastive-embed`` and the ONNX export.

    Raises:
        ValueError: a sentence-transformers module this reader does not apply.
    """
    from contrastive.nn.hf_folders import SentencePooling, read_sentence_pooling

    why = "--pooling"
    config = folder / SENTENCE_CONFIG
    if pooling is None and config.is_file():
        pooling, why = json.loads(config.read_text(encoding="utf-8")).get("pooling"), SENTENCE_CONFIG
    pipeline: SentencePooling | None = None
    if pooling is None:
        pipeline = read_sentence_pooling(folder)
        if pipeline is not None:
            why = "the folder's sentence-transformers modules.json and 1_Pooling/config.json"
        else:
            pooling, why = "auto", ("no --pooling, no simcse.json, not a sentence-transformers "
                                    "folder: the model's pooler if it has one, else cls")
    if pooling == "max":
        pipeline = SentencePooling(("max",))
    return pooling, pipeline, why


def load_sentence_model(folder: str | Path, *, pooling: str | None = None, tokenizer: str | Path | None = None,
                        max_length: int | None = None, device: str | torch.device = "cpu") -> SentenceModel:
    """A saved text model with its sentence embedding, chosen in this order: ``pooling``; the
    folder's ``simcse.json`` (recipes/simcse.py); a sentence-transformers folder's own pipeline
    (``modules.json``: ``1_Pooling/config.json``, Dense layers, Normalize); else ``auto``.

    Raises:
        ValueError: a sentence-transformers module this reader does not apply.
        FileNotFoundError, UnsafeCheckpointError: from
            :func:`~contrastive.nn.text_encoders.load_text_encoder`.
    """
    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.nn.text_encoders import POOLINGS, load_text_encoder

    folder = Path(folder)
    pooling, pipeline, why = choose_sentence_pooling(folder, pooling)
    model_dir = pipeline.transformer_dir if pipeline and pipeline.transformer_dir else folder
    encoder = load_text_encoder(model_dir, pooling=pooling if pooling in POOLINGS else "auto").to(device)
    max_length = max_length or (pipeline.max_seq_length if pipeline else None) or 128
    tok = load_tokenizer(tokenizer or model_dir, max_length=max_length)
    name = pipeline.describe() if pipeline else encoder.pooling
    log.info("pooling: %s (%s); max length %d", name, why, max_length)
    return SentenceModel(encoder, tok, pipeline.embedder(encoder) if pipeline else encoder, name, why, model_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """``contrastive-sts-eval``: STS Spearman of a saved model folder; prints one JSON line.

    The sentence embedding is, in this order: ``--pooling``; the folder's ``simcse.json``
    (recipes/simcse.py); a sentence-transformers folder's own pipeline (``modules.json``:
    ``1_Pooling/config.json``, Dense layers, Normalize); else ``auto``. The choice and its
    reason are logged and written in the JSON line.
    """
    p = argparse.ArgumentParser(
        prog="contrastive-sts-eval",
        description="Spearman correlation of cosine similarities with STS gold scores (SimCSE's "
                    "protocol) for a local Hugging Face or sentence-transformers model folder "
                    "(e.g. exported by recipes/simcse.py or contrastive-export).")
    p.add_argument("--model", required=True,
                   help="model folder: config.json + model.safetensors (or pytorch_model.bin), "
                        "or a sentence-transformers folder (modules.json)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder (tokenizer.json or vocab.txt); default: the model's")
    p.add_argument("--data", default="generated",
                   help="'generated' (the generated task's graded pairs) or the GLUE STS-B "
                        "folder / a TSV file in its layout (default: generated)")
    p.add_argument("--split", default="dev", help="GLUE split (dev; test has no scores)")
    p.add_argument("--pooling", default=None, choices=("auto", "pooler", "cls", "mean", "max"),
                   help=f"sentence embedding; default: the folder's {SENTENCE_CONFIG}, else a "
                        "sentence-transformers folder's own pooling (1_Pooling/config.json), "
                        "else auto (the model's pooler when it has one, as SimCSE's 'cls' on "
                        "its released checkpoints; use cls for unsupervised SimCSE)")
    p.add_argument("--n", type=int, default=2000, help="generated pairs (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="generated data seed (default 0)")
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens per sentence (default: a sentence-transformers folder's "
                        "max_seq_length, else 128)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stderr)

    from contrastive.nn.text_encoders import UnsafeCheckpointError

    try:
        model = load_sentence_model(args.model, pooling=args.pooling, tokenizer=args.tokenizer,
                                    max_length=args.max_length, device=args.device)
    except (ValueError, UnsafeCheckpointError) as e:  # refused unread: one line, no traceback
        p.exit(2, f"{p.prog}: error: {e}\n")
    encoder, tokenizer, embed, name, why = (model.encoder, model.tokenizer, model.embed, model.pooling,
                                            model.pooling_from)
    a, b, gold = load_sts_pairs(args.data, args.split, args.n, args.seed)
    result = evaluate_sts(encoder, tokenizer, a, b, gold, batch_size=args.batch_size, embed=embed)
    # the command's result on stdout (its output, not a log line: logs go to stderr)
    sys.stdout.write(json.dumps({"data": args.data, "split": args.split, "pooling": name,
                                 "pooling_from": why, **result}) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
