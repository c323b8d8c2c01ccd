#!/usr/bin/env python
"""Fine-tune a text encoder with a prediction layer on a task, through the training engine: the
LRC-BERT teacher (or the cross-entropy-only student baseline).

    # offline, on the generated task: a small BERT from a configuration, random weights
    python recipes/bert_finetune.py --task generated --layers 6 --hidden 128 --heads 4 \\
        --lr 5e-4 --steps 600 --output-dir runs/teacher-gen
    # BERT-base on GLUE SST-2 (a downloaded checkpoint folder and the GLUE TSV files), 2 GPUs
    accelerate launch --multi_gpu --num_processes 2 recipes/bert_finetune.py --task sst2 \\
        --glue-dir /data/glue_data --model hf:/models/bert-base-uncased --steps 6000 \\
        --output-dir runs/teacher-sst2

Training is the engine's (:mod:`contrastive.engine`, the labelled-text adapter
:class:`~contrastive.engine.LabelledTextAdapter`): every engine flag works (``--steps``,
``--max-steps``, ``--output-dir``, ``--resume auto``, ``--mixed-precision`` (``auto``: bf16
on CPUs with native bf16 and on GPUs), ``--float64``, checkpoints, SIGTERM -> exit 75, several
processes with ``accelerate launch``: the loss is the mean over each process's examples and
DDP averages the gradients, so N processes train as one with the whole batch).

Defaults: BERT's fine-tuning (Devlin et al. 2019, sec. A.3; the authors' google-research/bert
``run_classifier.py``; the Hugging Face Trainer of ``run_glue.py``): AdamW (betas 0.9 / 0.999,
eps 1e-8: torch's, the authors' TensorFlow code 1e-6), lr 2e-5, batch 32, linear warm-up over
10 % of the steps (``--warmup-fraction``) then linear decay to 0, weight decay 0.01 except
biases and LayerNorm, gradient norm clipped to 1.0, dropout 0.1. The model is ``--model bert``
(random init, ``--layers`` / ``--hidden`` / ``--heads``: BERT-base's 12 x 768 by default) or
``hf:FOLDER`` (a checkpoint folder). The tokenizer is ``--tokenizer FOLDER``, else the ``hf:``
folder's (``tokenizer.json`` or ``vocab.txt``), else the generated tasks' own WordPiece.

Evaluation: the task's official GLUE dev metric(s) (``glue_accuracy``, ``glue_f1``,
``glue_mcc``, ``glue_pearson`` / ``glue_spearman`` and their mean ``glue_score``) every
``--eval-every`` steps and at the end, into ``metrics.jsonl``; ``--keep-best glue_score``
keeps the best evaluated model in ``best/``. Run folder: the engine's (``config.json``,
``metrics.jsonl``, ``checkpoints/``, ``run_state.json``) plus ``model/`` (``model.safetensors``,
``classifier.json``, ``tokenizer.json``: what ``recipes/lrc_bert.py --teacher`` reads and
``contrastive-export --format hf`` turns into a Hugging Face folder) and ``results.json`` (the
dev metrics). Every field is a flag: ``python recipes/bert_finetune.py --help``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from contrastive.engine import (
    DataInfo,
    LabelledTextAdapter,
    LabelledTextConfig,
    bad_input,
    cli,
    help_field,
    override,
    parse_config,
    run,
)
from contrastive.nn.text_encoders import hf_folder, text_encoder

__all__ = ["FinetuneConfig", "cli", "main", "make"]


@dataclass
class FinetuneConfig(LabelledTextConfig):
    """BERT fine-tuning on a labelled task (see the module docstring for the sources)."""

    model: str = help_field("bert", "bert (random weights from the sizes) | hf:FOLDER (a "
                            "checkpoint folder)")
    intermediate_size: int = override(3072, "BERT-base's")


def make() -> tuple[type[FinetuneConfig], Any, LabelledTextAdapter]:
    """(config class, build_method, adapter): what ``run`` needs (tests call it too)."""
    return FinetuneConfig, build_method, LabelledTextAdapter(model_folder,
                                                             weights_folder=model_folder)


def model_folder(cfg: FinetuneConfig) -> str | None:
    """The ``hf:`` model's folder (its tokenizer and the starting weights), or None for a BERT
    from sizes."""
    return hf_folder(cfg.model)


def build_method(cfg: FinetuneConfig, data: DataInfo) -> Any:
    """A classifier for the task's labels over the run's tokenizer."""
    from contrastive.methods import TextClassifier

    encoder = text_encoder(cfg.model, vocab_size=data.tokenizer.vocab_size,
                           max_position_embeddings=max(512, cfg.max_length),
                           keep_layers=cfg.keep_layers, **cfg.bert_sizes())
    return TextClassifier(encoder, data.task.num_labels, regression=data.task.regression,
                          dropout=cfg.dropout)


def main(argv: list[str] | None = None) -> Any:
    """Parse ``argv``, read task and tokenizer (bad input: :func:`~contrastive.engine.cli`'s
    one line) and train; returns the :class:`~contrastive.engine.TrainResult`."""
    cls, build_method, adapter = make()
    cfg = parse_config(cls, argv, prog="bert_finetune.py")
    with bad_input():
        adapter.prepare(cfg)
    return run(cls, build_method, adapter=adapter, argv=argv, name="bert_finetune")


if __name__ == "__main__":
    sys.exit(cli(main, "bert_finetune.py"))
