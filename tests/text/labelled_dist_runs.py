"""The runs of tests/text/test_labelled_distributed.py (not a test module; the
``two_process_runs`` fixture launches it, tests/launch_worker.py): teacher fine-tuning
(``recipes/bert_finetune.py``), LRC-BERT (``recipes/lrc_bert.py``) and its pre-training
distillation (``recipes/lrc_bert_pretrain.py``, the teacher's encoder on the generated
sentences) through their ``main``, one after the other in this process, into
``folder/name/finetune``, ``folder/name/lrc`` and ``folder/name/pretrain``.
LRC-BERT distils the fixed teacher that ``prepare`` fine-tunes into ``folder/teacher``, so
every run distils the same teacher. Float64, dropout off (the masks of 2 x B and 1 x 2B
cannot be the same), no evaluator. The two bugs the comparison must catch
(``mutations``): fine-tuning's loss summed over each process's examples instead of averaged
(so the gradient no longer is the global batch's mean), and LRC-BERT's negatives taken from
the process's own batch only (no gather; both LRC-BERT runs).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from launch_worker import run_recipe_main  # noqa: E402

COMMON = ["--task", "generated", "--n-train", "64", "--n-dev", "16", "--batch-size", "16",
          "--steps", "3", "--float64", "--dropout", "0", "--eval-every", "0", "--log-every", "1",
          "--progress", "false", "--mixed-precision", "no", "--num-workers", "0",
          "--save-every-steps", "0"]
# SGD without clipping: AdamW and a clipped norm are (almost) blind to the scale of the
# gradient, so the summed-loss mutant would train like the mean one under them
FINETUNE = [*COMMON, "--layers", "1", "--hidden", "16", "--heads", "2", "--intermediate-size",
            "32", "--optimizer", "sgd", "--clip-grad-norm", "0", "--weight-decay", "0",
            "--lr", "0.5"]
# the recipe's AdamW, clip and 1:0:0 -> 1:1:3 stages (step 2 of 3 is stage 2), perturbation on
LRC = [*COMMON, "--layers", "1", "--hidden", "8", "--heads", "2", "--intermediate-size", "16",
       "--lr", "1e-3", "--stage1-fraction", "0.5"]
# pre-training distillation: the generated sentences, the teacher's encoder without its head
PRETRAIN = ["--data", "generated", "--n-train", "64", "--batch-size", "16", "--steps", "3",
            "--float64", "--dropout", "0", "--eval", "none", "--log-every", "1", "--progress",
            "false", "--mixed-precision", "no", "--num-workers", "0", "--save-every-steps", "0",
            "--layers", "1", "--hidden", "8", "--heads", "2", "--intermediate-size", "16",
            "--lr", "1e-3"]


def prepare(folder: Path) -> None:
    """The teacher every run distils (2 steps of a 2-layer BERT)."""
    run_recipe_main("bert_finetune", ["--task", "generated", "--n-train", "64", "--n-dev", "16",
                                      "--batch-size", "8", "--layers", "2", "--hidden", "16",
                                      "--heads", "2", "--intermediate-size", "32", "--steps",
                                      "2", "--progress", "false", "--mixed-precision", "no",
                                      "--num-workers", "0"], folder / "teacher")


def run(folder: Path, name: str) -> None:
    teacher = str(folder / "teacher" / "model")
    run_recipe_main("bert_finetune", FINETUNE, folder / name / "finetune")
    run_recipe_main("lrc_bert", [*LRC, "--teacher", teacher], folder / name / "lrc")
    run_recipe_main("lrc_bert_pretrain", [*PRETRAIN, "--teacher", f"hf:{teacher}"],
                    folder / name / "pretrain")


def mutations() -> list[tuple[object, str, object]]:
    import contrastive.methods.text_classifier as tc
    from contrastive.methods.lrc_bert import LRCBert

    def summed(logits, labels, regression):  # the bug: a sum over the process's examples
        return F.cross_entropy(logits, labels.long(), reduction="sum")

    return [(tc, "task_loss", summed),
            (LRCBert, "_negatives", lambda self, reps: [None] * len(reps))]  # local negatives
