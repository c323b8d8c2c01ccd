#!/usr/bin/env python
"""LRC-BERT (Fu et al., AAAI 2021, arXiv 2012.07335): distil a fine-tuned teacher into a small
student with COS-NCE on every student layer, the two-stage loss and gradient perturbation.

    # teacher from recipes/bert_finetune.py, the paper's 4 x 312 student from a configuration
    python recipes/lrc_bert.py --teacher runs/teacher-sst2/model --task sst2 \\
        --glue-dir /data/glue_data --steps 20000 --output-dir runs/lrc-sst2
    # a pre-trained small student (e.g. a general-distillation TinyBERT folder you downloaded)
    python recipes/lrc_bert.py --teacher runs/teacher-sst2/model --task sst2 \\
        --glue-dir /data/glue_data --student hf:/models/TinyBERT_General_4L_312D ...
    # offline, on the generated task
    python recipes/lrc_bert.py --teacher runs/teacher-gen/model --task generated \\
        --layers 2 --hidden 32 --heads 2 --lr 1e-3 --steps 300 --output-dir runs/lrc-gen

Paper settings (defaults): batch 16 (K = 15 in-batch negatives), uniform layer map, t = 1.1,
alpha:beta:gamma = 1:0:0 for the first 80 % of the steps then 1:1:3, perturbation norm 1.
Ablations: ``--no-two-stage`` (1:1:3 throughout), ``--no-perturb``, ``--intermediate mse``.
The tokenizer is the teacher's (``tokenizer.json`` in the teacher folder). Output: ``model/``
(the student and its prediction layer, loadable with contrastive.methods.text_classifier.load_classifier),
``metrics.jsonl``, ``checkpoint/`` (``--resume``), ``results.json`` (dev metric).
Not included: the paper's pre-training-stage distillation and its augmented training data.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bert_finetune import (  # noqa: E402
    add_common,
    add_model,
    bad_input,
    build_encoder,
    cli,
    train_config,
)

from contrastive.data.text_tasks import check_task, load_task  # noqa: E402
from contrastive.data.tokenizer import load_tokenizer  # noqa: E402
from contrastive.methods.lrc_bert import REPRESENTATIONS, LRCBert  # noqa: E402
from contrastive.methods.text_classifier import (  # noqa: E402
    TextClassifier,
    evaluate,
    load_classifier,
    save_classifier,
)
from contrastive.text.loop import train_text  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", required=True, help="a fine-tuned teacher folder "
                   "(recipes/bert_finetune.py's OUTPUT_DIR/model)")
    add_common(p, steps=1000, batch=16, lr=5e-5)
    add_model(p, "student", 4, 312, 12, 1200)
    p.add_argument("--representation", default="tokens", choices=REPRESENTATIONS)
    p.add_argument("--intermediate", default="cosnce", choices=("cosnce", "mse"))
    p.add_argument("--stage1-fraction", type=float, default=0.8)
    p.add_argument("--no-two-stage", action="store_true", help="alpha:beta:gamma = 1:1:3 always")
    p.add_argument("--no-perturb", action="store_true", help="no gradient perturbation")
    p.add_argument("--perturb-scale", type=float, default=1.0,
                   help="norm eps of the perturbation (paper: 1, for 312-wide students; see "
                   "benchmarks/RESULTS.md for narrower ones)")
    p.add_argument("--temperature", type=float, default=1.1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with bad_input():  # the user's input: one line when run as a script
        check_task(args.task, args.glue_dir)
        teacher, meta = load_classifier(args.teacher)
        task = load_task(args.task, args.glue_dir, n_train=args.n_train, n_dev=args.n_dev,
                         seed=args.seed)
        if (task.num_labels, task.regression) != (teacher.num_labels, teacher.regression):
            raise ValueError(f"the teacher in {args.teacher} predicts {teacher.num_labels} labels "
                             f"(regression={teacher.regression}), task {task.name} has "
                             f"{task.num_labels} (regression={task.regression}): fine-tune a "
                             f"teacher on {task.name} (recipes/bert_finetune.py --task "
                             f"{task.name})")
        tok = load_tokenizer(args.tokenizer or args.teacher, args.max_length)
        torch.manual_seed(args.seed)
        student = build_encoder(args, args.student, tok.vocab_size)
        if student.config.vocab_size < tok.vocab_size:
            raise ValueError(f"the student's vocabulary ({student.config.vocab_size}) is smaller "
                             f"than the teacher's tokenizer ({tok.vocab_size}): teacher and "
                             "student read the same token ids; use a student with the teacher's "
                             "vocabulary")
    stages = ((1.0, 1.0, 3.0),) * 2 if args.no_two_stage else ((1.0, 0.0, 0.0), (1.0, 1.0, 3.0))
    method = LRCBert(teacher, student, representation=args.representation,
                     intermediate=args.intermediate, stage_weights=stages,
                     stage1_fraction=args.stage1_fraction, temperature=args.temperature,
                     perturb=not args.no_perturb, perturb_scale=args.perturb_scale
                     ).to(args.device)
    out = Path(args.output_dir)
    train_text(method, task.train, tok.collate, train_config(args), out, resume=args.resume,
               on_log=lambda r: print(json.dumps(r), flush=True))
    metrics = evaluate(method, task.dev, tok, task.metric_task)
    final = TextClassifier(method.encoder, teacher.num_labels, regression=teacher.regression,
                           dropout=0.0)
    final.head.load_state_dict(method.head.state_dict())
    save_classifier(out / "model", final, tok, task=task.name, distilled_from=str(args.teacher))
    result = {"task": task.name, "dev": metrics, "steps": args.steps,
              "teacher_dev": meta.get("dev")}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(cli(main, "lrc_bert.py"))
