#!/usr/bin/env python
"""LRC-BERT (Fu et al., AAAI 2021, arXiv 2012.07335) through the training engine: distil a
fine-tuned teacher into a small student with COS-NCE on every student layer, the two-stage loss
and gradient perturbation.

    # offline, on the generated task (the teacher from recipes/bert_finetune.py's example)
    python recipes/lrc_bert.py --teacher runs/teacher-gen/model --task generated \\
        --layers 2 --hidden 32 --heads 2 --lr 1e-3 --steps 300 --output-dir runs/lrc-gen
    # the paper's 4 x 312 student from a configuration, on GLUE SST-2, 2 GPUs
    accelerate launch --multi_gpu --num_processes 2 recipes/lrc_bert.py \\
        --teacher runs/teacher-sst2/model --task sst2 --glue-dir /data/glue_data \\
        --steps 20000 --output-dir runs/lrc-sst2
    # a pre-trained small student (e.g. a general-distillation TinyBERT folder you downloaded)
    python recipes/lrc_bert.py --teacher runs/teacher-sst2/model --task sst2 \\
        --glue-dir /data/glue_data --student hf:/models/TinyBERT_General_4L_312D \\
        --output-dir runs/lrc-sst2-tiny

Paper settings (defaults): batch 16 (K = 15 in-batch negatives in one process; with N
processes the teacher features of the whole global batch, K = 15 for a global batch of 16),
uniform layer map, t = 1.1, alpha:beta:gamma = 1:0:0 for the first 80 % of the steps then 1:1:3,
perturbation norm 1; the 4 x 312 student (12 heads, FFN 1200) of its Table 1. Ablations:
``--no-two-stage`` (1:1:3 throughout), ``--no-perturb``, ``--layer-loss mse``. The optimiser
is BERT fine-tuning's (:class:`~contrastive.engine.LabelledTextConfig`: AdamW, 10 % linear
warm-up then linear decay, weight decay 0.01 except biases and LayerNorm, clip 1.0) at lr 5e-5.

Training is the engine's, as ``recipes/bert_finetune.py``'s (every engine flag: ``--steps``,
``--max-steps``, ``--output-dir``, ``--resume auto``, ``--mixed-precision auto``, ``--float64``,
``accelerate launch``). The tokenizer is the teacher's (``tokenizer.json`` in the teacher
folder). Evaluation: the student's official GLUE dev metric (``glue_*`` in ``metrics.jsonl``,
``--eval-every``, ``--keep-best glue_score``). Output: the engine's run folder plus ``model/``
(the student and its prediction layer as a classifier folder, loadable with
:func:`contrastive.eval.classifier_folder.load_classifier`, exportable with
``contrastive-export --format hf``) and ``results.json`` (dev metrics, the teacher's beside).
The paper's pre-training-stage distillation (on Wikipedia, before the task stage) is
``recipes/lrc_bert_pretrain.py``; its ``model/`` is a ``--student hf:`` folder for this one.
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
from contrastive.methods.lrc_bert import REPRESENTATIONS
from contrastive.nn.text_encoders import check_vocabulary, hf_folder, text_encoder

__all__ = ["LRCBertConfig", "cli", "main", "make"]


@dataclass
class LRCBertConfig(LabelledTextConfig):
    """LRC-BERT distillation of a fine-tuned teacher (see the module docstring)."""

    teacher: str = help_field("", "a fine-tuned teacher folder (recipes/bert_finetune.py's "
                              "OUTPUT_DIR/model); required")
    student: str = help_field("bert", "bert (random weights from the sizes) | hf:FOLDER (a "
                              "pre-trained small model)")
    layers: int = override(4, "the student (paper 4)")
    hidden: int = override(312, "the student (paper 312)")
    heads: int = override(12, "the student (paper 12)")
    intermediate_size: int = override(1200, "the student (paper 1200)")
    representation: str = help_field("tokens", "layer representation COS-NCE compares (see "
                                     "contrastive.methods.lrc_bert)", choices=REPRESENTATIONS)
    layer_loss: str = help_field("cosnce", "intermediate-layer loss: cosnce (the paper) | mse "
                                 "(the ablation)", choices=("cosnce", "mse"))
    two_stage: bool = help_field(True, "--stage1-weights for --stage1-fraction of the steps, "
                                 "then --stage2-weights (--no-two-stage: --stage2-weights "
                                 "throughout)")
    stage1_weights: tuple[float, float, float] = help_field(
        (1.0, 0.0, 0.0), "alpha beta gamma of stage 1 (COS-NCE, soft, hard; paper 1 0 0)")
    stage2_weights: tuple[float, float, float] = help_field(
        (1.0, 1.0, 3.0), "alpha beta gamma of stage 2 (paper 1 1 3; plain KD: 0 1 1 with "
        "--no-two-stage --no-perturb)")
    stage1_fraction: float = help_field(0.8, "fraction of the steps in stage 1 (paper 0.8)")
    perturb: bool = help_field(True, "gradient perturbation of the student's embeddings")
    perturb_scale: float = help_field(
        1.0, "norm eps of the perturbation (paper 1, for 312-wide students; see "
        "benchmarks/results/lrc_bert.md for narrower ones)")
    temperature: float = help_field(1.1, "t of the soft loss (paper 1.1)")
    batch_size: int = override(16, "GLOBAL examples per step (paper 16: K = 15 negatives)")
    lr: float = override(5e-5, "peak AdamW learning rate, absolute")
    ddp_find_unused_parameters: bool = override(
        True, "DDP find_unused_parameters: stage 1 leaves the student's prediction layer unused")

    def validate(self) -> None:
        """The labelled-text checks, a teacher folder and a student model name."""
        super().validate()
        hf_folder(self.student)
        if not self.teacher:
            raise ValueError("--teacher is required: a fine-tuned teacher folder "
                             "(recipes/bert_finetune.py's OUTPUT_DIR/model)")


def make() -> tuple[type[LRCBertConfig], Any, LabelledTextAdapter]:
    """(config class, build_method, adapter): what ``run`` needs (tests call it too). The
    tokenizer is the teacher's; the adapter checks the ``--student hf:`` folder's weights, loads
    the teacher and :func:`check_teacher` checks it against the task."""
    return LRCBertConfig, build_method, LabelledTextAdapter(
        teacher_folder, weights_folder=student_folder, teacher_folder=teacher_folder,
        check_teacher=check_teacher)


def student_folder(cfg: LRCBertConfig) -> str | None:
    """The ``--student hf:`` folder (a pretrained start), or None for a BERT from sizes."""
    return hf_folder(cfg.student)


def teacher_folder(cfg: LRCBertConfig) -> str:
    """The teacher's classifier folder (``--teacher``), whose tokenizer the student reads."""
    return cfg.teacher


def build_method(cfg: LRCBertConfig, data: DataInfo) -> Any:
    """The student (``--student``, the teacher's vocabulary) distilled from ``data.teacher``."""
    from contrastive.methods import LRCBert

    vocab = data.tokenizer.vocab_size
    student = text_encoder(cfg.student, vocab_size=vocab,
                           max_position_embeddings=max(512, cfg.max_length),
                           keep_layers=cfg.keep_layers, **cfg.bert_sizes())
    check_vocabulary(student, vocab)
    stages = (cfg.stage1_weights if cfg.two_stage else cfg.stage2_weights, cfg.stage2_weights)
    return LRCBert(data.teacher, student, representation=cfg.representation,
                   intermediate=cfg.layer_loss, stage_weights=stages,
                   stage1_fraction=cfg.stage1_fraction, temperature=cfg.temperature,
                   perturb=cfg.perturb, perturb_scale=cfg.perturb_scale)


def check_teacher(cfg: LRCBertConfig, task: Any, teacher: Any) -> None:
    """Refuse a teacher whose labels are not the task's."""
    if (task.num_labels, task.regression) != (teacher.num_labels, teacher.regression):
        raise ValueError(f"the teacher in {cfg.teacher} predicts {teacher.num_labels} labels "
                         f"(regression={teacher.regression}), task {task.name} has "
                         f"{task.num_labels} (regression={task.regression}): fine-tune a "
                         f"teacher on {task.name} (recipes/bert_finetune.py --task {task.name})")


def main(argv: list[str] | None = None) -> Any:
    """Parse ``argv``, read task, teacher and tokenizer (bad input: one line through
    :func:`~contrastive.engine.cli`) and train; returns the
    :class:`~contrastive.engine.TrainResult`."""
    cls, build_method, adapter = make()
    cfg = parse_config(cls, argv, prog="lrc_bert.py")
    with bad_input():  # the task's name, then the teacher, then the data and the tokenizer
        adapter.prepare(cfg)
    return run(cls, build_method, adapter=adapter, argv=argv, name="lrc_bert")


if __name__ == "__main__":
    sys.exit(cli(main, "lrc_bert.py"))
