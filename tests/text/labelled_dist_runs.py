"""Runs for tests/text/test_labelled_distributed.py (not a test module): teacher fine-tuning
(``recipes/bert_finetune.py``) then LRC-BERT (``recipes/lrc_bert.py``) through their ``main``,
one after the other in this process, as ``accelerate launch`` or plain python starts it.

    python labelled_dist_runs.py OUT TEACHER [mutant]

writes ``OUT/finetune`` and ``OUT/lrc`` (LRC-BERT distils the fixed ``TEACHER`` folder, so
every launch distils the same teacher). Float64, dropout off (the masks of 2 x B and 1 x 2B
cannot be the same), no evaluator. ``mutant`` plants the two bugs the comparison must catch:
fine-tuning's loss summed over each process's examples instead of averaged (so the gradient
no longer is the global batch's mean), and LRC-BERT's negatives taken from the process's own
batch only (no gather).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from lrc_check import recipe  # noqa: E402

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


def plant_mutations() -> None:
    import contrastive.methods.text_classifier as tc
    from contrastive.methods.lrc_bert import LRCBert

    def summed(logits, labels, regression):  # the bug: a sum over the process's examples
        return F.cross_entropy(logits, labels.long(), reduction="sum")

    tc.task_loss = summed
    LRCBert._negatives = lambda self, reps: [None] * len(reps)  # the bug: local negatives


def main(out: Path, teacher: str, mutant: bool) -> None:
    """Both runs, sharing one process group: the engine closes it after a run, and gloo's second
    rendezvous on the launcher's store is not reliable (seen: "connectFullMesh failed"), so it
    stays open until both have run."""
    import importlib

    import torch.distributed as dist

    from contrastive.engine import reset_accelerate_state

    engine_run = importlib.import_module("contrastive.engine.run")  # the module, not run()

    if mutant:
        plant_mutations()
    close = engine_run.close_process_group
    engine_run.close_process_group = lambda: None
    try:
        for name, argv in (("bert_finetune", [*FINETUNE, "--output-dir", str(out / "finetune")]),
                           ("lrc_bert", [*LRC, "--teacher", teacher, "--output-dir",
                                         str(out / "lrc")])):
            reset_accelerate_state()
            recipe(name).main(argv)
    finally:
        engine_run.close_process_group = close
    if dist.is_available() and dist.is_initialized():
        close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "mutant")
