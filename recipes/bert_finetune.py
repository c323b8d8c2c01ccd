#!/usr/bin/env python
"""Fine-tune a text encoder with a prediction layer on a task: the LRC-BERT teacher (or a
cross-entropy-only student baseline).

    # BERT-base on GLUE SST-2 (a downloaded checkpoint folder and the GLUE TSV files)
    python recipes/bert_finetune.py --task sst2 --glue-dir /data/glue_data \\
        --model hf:/models/bert-base-uncased --steps 6000 --output-dir runs/teacher-sst2
    # offline, on the generated task: a small BERT from a configuration, random weights
    python recipes/bert_finetune.py --task generated --layers 6 --hidden 128 --heads 4 \\
        --lr 5e-4 --steps 600 --output-dir runs/teacher-gen

The tokenizer is the model folder's (``tokenizer.json`` or ``vocab.txt``) for ``hf:`` models, the
generated tasks' own WordPiece for ``generated*`` tasks, or ``--tokenizer FOLDER``. The output
folder gets ``model/`` (weights as safetensors, ``classifier.json``, ``tokenizer.json``: what
``recipes/lrc_bert.py --teacher`` reads), ``metrics.jsonl``, ``checkpoint/`` (``--resume``
continues it) and ``results.json`` (the dev metric). Training runs in one process on the CPU or
one GPU (contrastive.text.loop; not the image engine).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from contrastive.data.text_tasks import GENERATED_TASKS, check_task, generated_tokenizer, load_task
from contrastive.methods.text_classifier import TextClassifier, evaluate, save_classifier
from contrastive.nn.text_encoders import build_text_encoder, load_text_encoder
from contrastive.text.loop import TextTrainConfig, train_text


def add_common(p: argparse.ArgumentParser, steps: int, batch: int, lr: float) -> None:
    """Flags shared with recipes/lrc_bert.py: task, data, optimisation, output."""
    p.add_argument("--task", default="generated",
                   help=f"a GLUE task (sst2, mnli, stsb, ...) or one of {sorted(GENERATED_TASKS)}")
    p.add_argument("--glue-dir", default=None, help="folder of the GLUE TSV files (glue_data)")
    p.add_argument("--n-train", type=int, default=4000, help="generated task: training sentences")
    p.add_argument("--n-dev", type=int, default=1000, help="generated task: dev sentences")
    p.add_argument("--max-length", type=int, default=128, help="tokens per example, truncated")
    p.add_argument("--steps", type=int, default=steps, help="optimiser steps")
    p.add_argument("--batch-size", type=int, default=batch)
    p.add_argument("--lr", type=float, default=lr, help="peak AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: end)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--resume", action="store_true", help="continue OUTPUT_DIR/checkpoint")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def add_model(p: argparse.ArgumentParser, prefix: str, layers: int, hidden: int, heads: int,
              intermediate: int | None) -> None:
    """``--{prefix}``: ``bert`` (from the sizes) or ``hf:FOLDER``, and the sizes."""
    p.add_argument(f"--{prefix}", default="bert", help="'bert' (random weights from the sizes) "
                   "or 'hf:/path/to/checkpoint-folder'")
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--intermediate-size", type=int, default=intermediate,
                   help="feed-forward width (default 4 x hidden)")
    p.add_argument("--tokenizer", default=None, help="folder with tokenizer.json or vocab.txt")


@contextmanager
def bad_input() -> Iterator[None]:
    """Mark the errors of the setup (the user's input: missing files, unknown task, a folder that
    is not one) so that :func:`cli` reports them in one line; called in-process (tests), they
    raise as they are. Errors of training itself keep their traceback."""
    try:
        yield
    except (ValueError, OSError) as e:
        e.bad_input = True  # type: ignore[attr-defined]
        raise


def cli(main: Callable[[list[str] | None], Any], prog: str, argv: list[str] | None = None) -> int:
    """Run ``main`` as a script: bad input is one line ``prog: error: ...``, exit status 2."""
    try:
        main(argv)
    except (ValueError, OSError) as e:
        if not getattr(e, "bad_input", False):
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


def tokenizer_for(args: argparse.Namespace, model: str) -> Any:
    from contrastive.data.tokenizer import load_tokenizer

    if model != "bert" and not model.startswith("hf:"):
        raise ValueError(f"model must be 'bert' or 'hf:FOLDER', got {model!r}")
    if args.tokenizer:
        return load_tokenizer(args.tokenizer, args.max_length)
    if model.startswith("hf:"):
        return load_tokenizer(model[3:], args.max_length)
    if args.task.lower() in GENERATED_TASKS:
        return generated_tokenizer(max_length=min(args.max_length, 64))
    raise ValueError(f"a 'bert' model with random weights on GLUE task {args.task!r} has no "
                     "tokenizer: pass --tokenizer FOLDER (a BERT vocab.txt / tokenizer.json) or "
                     "--model hf:FOLDER (a checkpoint folder with its tokenizer)")


def build_encoder(args: argparse.Namespace, model: str, vocab_size: int) -> Any:
    if model.startswith("hf:"):
        return load_text_encoder(model[3:])
    if model != "bert":
        raise ValueError(f"model must be 'bert' or 'hf:FOLDER', got {model!r}")
    return build_text_encoder(num_layers=args.layers, hidden_size=args.hidden,
                              num_heads=args.heads, intermediate_size=args.intermediate_size,
                              vocab_size=vocab_size, max_position_embeddings=max(
                                  512, args.max_length))


def train_config(args: argparse.Namespace) -> TextTrainConfig:
    return TextTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           weight_decay=args.weight_decay, warmup_fraction=args.warmup_fraction,
                           seed=args.seed, log_every=args.log_every, save_every=args.save_every)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, steps=1000, batch=32, lr=2e-5)
    add_model(p, "model", 12, 768, 12, 3072)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with bad_input():  # flags first, then the data and the model
        check_task(args.task, args.glue_dir)
        tok = tokenizer_for(args, args.model)
        task = load_task(args.task, args.glue_dir, n_train=args.n_train, n_dev=args.n_dev,
                         seed=args.seed)
        torch.manual_seed(args.seed)
        model = TextClassifier(build_encoder(args, args.model, tok.vocab_size), task.num_labels,
                               regression=task.regression).to(args.device)
    out = Path(args.output_dir)
    train_text(model, task.train, tok.collate, train_config(args), out, resume=args.resume,
               on_log=lambda r: print(json.dumps(r), flush=True))
    metrics = evaluate(model, task.dev, tok, task.metric_task)
    save_classifier(out / "model", model, tok, task=task.name)
    result = {"task": task.name, "dev": metrics, "steps": args.steps}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(cli(main, "bert_finetune.py"))
