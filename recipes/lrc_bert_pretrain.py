#!/usr/bin/env python
"""LRC-BERT's pre-training distillation (Fu et al., AAAI 2021, arXiv 2012.07335) through the
training engine: COS-NCE on every student layer against a general (not fine-tuned) teacher
encoder, on unlabelled sentences; the student is written as a Hugging Face folder that the task
stage (``recipes/lrc_bert.py --student hf:OUT/model``) starts from.

    # offline: the generated tasks' sentences, a tiny teacher folder of your own
    python recipes/lrc_bert_pretrain.py --teacher hf:runs/tiny-bert --data generated \\
        --layers 2 --hidden 32 --heads 2 --lr 1e-3 --steps 200 --output-dir runs/lrc-pre-gen
    # the paper's 4 x 312 student from all-MiniLM-L6-v2 on a sentence file, then the task stage
    python recipes/lrc_bert_pretrain.py --teacher hf:../shared/data/text-models/all-MiniLM-L6-v2 \\
        --data sentences.txt --epochs 1 --steps 0 --output-dir runs/lrc-pre
    python recipes/lrc_bert.py --teacher runs/teacher-sst2/model --task sst2 \\
        --glue-dir ../shared/data/glue --student hf:runs/lrc-pre/model --output-dir runs/lrc-sst2

What the paper's pre-training stage is: LRC-BERT (not LRC-BERT1, which skips it) is distilled
on Wikipedia before the task stage; the texts quoted in issue 51 give neither its losses' weights
nor its optimiser, so this recipe takes the task stage's first-stage loss (alpha:beta:gamma =
1:0:0, COS-NCE alone: a general teacher has no task head, so there are no soft or hard targets)
with the gradient perturbation, the 4 x 312 student (12 heads, FFN 1200) and batch 16 (K = 15
in-batch negatives), and TinyBERT's general distillation for the rest (Jiao et al. 2020;
huawei-noah/Pretrained-Language-Model ``TinyBERT/general_distill.py``: BERT's AdamW, lr 5e-5,
10 % linear warm-up then linear decay, weight decay 0.01 except biases and LayerNorm, 3 epochs,
max length 128; :class:`~contrastive.engine.BertOptimiser`). The uniform layer map, the
``tokens`` representation and the perturbation are :class:`~contrastive.methods.LRCBert`'s.

Data: ``--data FILE.txt`` (one sentence a line, blank lines skipped; a sentence pair as two
lines) or ``generated`` (the generated tasks' sentences, for offline tests). The tokenizer is
the teacher's (its folder's ``tokenizer.json`` or ``vocab.txt``): teacher and student read the
same token ids, so the student gets the teacher's vocabulary. Monitor: ``--eval STS-B`` (a GLUE
STS-B folder: Spearman of the student's pooled-output cosines, as ``recipes/simcse.py``), off by
default (``none``).

Training is the engine's (every engine flag: ``--steps``, ``--epochs``, ``--output-dir``,
``--resume auto``, ``--mixed-precision``, ``accelerate launch``: the teacher features of every
process are the negatives). Output: the engine's run folder plus ``model/``, the student as a
Hugging Face / sentence-transformers folder (``config.json``, ``model.safetensors``, the
teacher's tokenizer) that ``--student hf:OUT/model`` reads.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from contrastive.engine import (
    BertOptimiser,
    BertSizes,
    DataInfo,
    TextAdapter,
    TextConfig,
    bad_input,
    cli,
    help_field,
    override,
    parse_config,
    run,
)
from contrastive.methods.lrc_bert import REPRESENTATIONS
from contrastive.nn.text_encoders import (
    check_safe_weights,
    check_vocabulary,
    hf_folder,
    text_encoder,
)

__all__ = ["LRCPretrainConfig", "cli", "main", "make"]


@dataclass
class LRCPretrainConfig(BertSizes, BertOptimiser, TextConfig):
    """LRC-BERT's pre-training distillation (see the module docstring)."""

    teacher: str = help_field("", "the teacher encoder, hf:FOLDER (a pretrained BERT-like model, "
                              "no task head: e.g. all-MiniLM-L6-v2, BERT-base); required")
    student: str = help_field("bert", "bert (random weights from the sizes) | hf:FOLDER (a "
                              "pretrained small model to continue)")
    data: str = override("generated", "unlabelled text: a .txt, one sentence a line (a pair as "
                         "two lines) | generated (the generated tasks' sentences)")
    n_train: int = help_field(4000, "generated: sentences")
    tokenizer: str = override("", "folder with tokenizer.json or vocab.txt; empty = the "
                              "teacher's (teacher and student read the same token ids)")
    vocab_size: int = override(1000, "not used: the tokenizer is the teacher's (--tokenizer)")
    eval: str = override("none", "STS pairs to monitor the student on (Spearman of its pooled "
                         "output's cosines): a GLUE STS-B folder or TSV | generated | none")
    eval_at_start: bool = override(False, "also evaluate before training")
    layers: int = override(4, "the student (paper 4)")
    hidden: int = override(312, "the student (paper 312)")
    heads: int = override(12, "the student (paper 12)")
    intermediate_size: int = override(1200, "the student (paper 1200)")
    representation: str = help_field("tokens", "layer representation COS-NCE compares (see "
                                     "contrastive.methods.lrc_bert)", choices=REPRESENTATIONS)
    perturb: bool = help_field(True, "gradient perturbation of the student's embeddings (the "
                               "task stage's)")
    perturb_scale: float = help_field(1.0, "norm eps of the perturbation (paper 1)")
    # TinyBERT's general distillation (general_distill.py) on LRC-BERT's task-stage batch
    steps: int = override(0, "optimiser steps (0 = --epochs decide)")
    epochs: int = override(3, "epochs over --data (TinyBERT's general distillation: 3)")
    batch_size: int = override(16, "GLOBAL sentences per step (the task stage's 16: K = 15 "
                               "negatives)")
    lr: float = override(5e-5, "peak AdamW learning rate, absolute (TinyBERT's general "
                         "distillation)")
    num_workers: int = override(0, "loader workers (tokenising is cheap: 0 = in the main "
                                "process)")
    ddp_find_unused_parameters: bool = override(
        True, "DDP find_unused_parameters: COS-NCE leaves the student's pooler unused")
    log_every: int = 50

    derived_fields: ClassVar[tuple[str, ...]] = (*BertOptimiser.derived_fields, "tokenizer")

    def __post_init__(self) -> None:
        """The warm-up from its fraction, and the teacher's tokenizer when none is given."""
        super().__post_init__()
        if not self.tokenizer and self.teacher.startswith("hf:"):
            self.tokenizer = self.teacher[3:]

    def model_info(self) -> dict[str, Any]:
        """``model/``'s metadata records the teacher it was distilled from."""
        return {"teacher": self.teacher, "stage": "pre-training distillation"}

    def validate(self) -> None:
        """The text checks, the sizes, a teacher folder and a student model name."""
        super().validate()
        self.check_bert_sizes()
        if not self.teacher.startswith("hf:") or not hf_folder(self.teacher):
            raise ValueError(f"--teacher must be hf:FOLDER (a pretrained encoder folder), got "
                             f"{self.teacher!r}")
        hf_folder(self.student)


def sentences(cfg: LRCPretrainConfig) -> Any:
    """The training sentences (``--data``), a one-sentence
    :class:`~contrastive.data.text_batches.SentenceGroups`."""
    from contrastive.data.text_batches import SentenceGroups, read_sentence_file

    if cfg.data == "generated":
        from contrastive.data.generated_text import text_corpus

        corpus = itertools.islice(text_corpus(cfg.n_train, cfg.data_seed), cfg.n_train)
        return SentenceGroups([(s,) for s in corpus], names=("sent0",))
    return read_sentence_file(sentence_file(cfg))


def sentence_file(cfg: LRCPretrainConfig) -> Path:
    """``--data``'s .txt file, or a one-line error naming the two forms it takes."""
    path = Path(cfg.data)
    if not path.is_file() or path.suffix.lower() != ".txt":
        raise FileNotFoundError(f"--data {cfg.data!r}: no such .txt file; give a .txt of "
                                "sentences (one a line) or 'generated'")
    return path


def make() -> tuple[type[LRCPretrainConfig], Any, TextAdapter]:
    """(config class, build_method, adapter): what ``run`` needs (tests call it too)."""
    return LRCPretrainConfig, build_method, TextAdapter(sentences)


def build_method(cfg: LRCPretrainConfig, data: DataInfo) -> Any:
    """The student (``--student``, the teacher's vocabulary) distilled from the teacher encoder
    with COS-NCE alone."""
    from contrastive.methods import LRCBert

    teacher = text_encoder(cfg.teacher)
    vocab = data.tokenizer.vocab_size
    student = text_encoder(cfg.student, vocab_size=vocab,
                           max_position_embeddings=max(512, cfg.max_length), **cfg.bert_sizes())
    check_vocabulary(student, vocab)
    cosnce_only = (1.0, 0.0, 0.0)
    return LRCBert(teacher, student, representation=cfg.representation,
                   stage_weights=(cosnce_only, cosnce_only), perturb=cfg.perturb,
                   perturb_scale=cfg.perturb_scale)


def main(argv: list[str] | None = None) -> Any:
    """Parse ``argv``, refuse a missing ``--data`` file and teacher or student folders whose
    weights would run code to load (bad input: one line through :func:`~contrastive.engine.cli`) and train; returns the
    :class:`~contrastive.engine.TrainResult`."""
    cls, build_method, adapter = make()
    cfg = parse_config(cls, argv, prog="lrc_bert_pretrain.py")
    with bad_input():
        if cfg.data != "generated":
            sentence_file(cfg)
        for model in (cfg.teacher, cfg.student):
            folder = hf_folder(model)
            if folder:
                check_safe_weights(folder)
    return run(cls, build_method, adapter=adapter, argv=argv, name="lrc_bert_pretrain")


if __name__ == "__main__":
    sys.exit(cli(main, "lrc_bert_pretrain.py"))
