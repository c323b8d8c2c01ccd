"""The LRC-BERT learning check on the generated task, through the recipes and the engine
(benchmarks/bench_lrc_bert.py and tests/text/test_lrc_bert_learning.py use it).

:func:`learning_check` runs, for one seed, ``recipes/bert_finetune.py`` and
``recipes/lrc_bert.py`` in this process (their ``main``, as on the command line) on the
generated sentiment task:

1. a teacher (encoder + classifier, cross-entropy) of ``TEACHER`` size;
2. a student of ``STUDENT`` size with cross-entropy alone (the baseline);
3. students distilled from the teacher by LRC-BERT, one per variant: ``lrc`` (the paper's
   method), ``no_two_stage`` (1:1:3 from the first step), ``no_perturb`` and ``mse`` (MSE
   instead of COS-NCE on the intermediate layers): the paper's ablations (its Table 4), and
   ``perturb_width_scaled`` (not in the paper: eps = sqrt(32 / 312), the size the paper's eps = 1
   has relative to a 312-wide embedding, for our 32-wide student);

every student with the same optimiser steps, batch, learning rate and initial encoder weights
(``--seed``), in fp32 (``--mixed-precision no``), and returns each model's dev accuracy (%).
The sizes are small CPU stand-ins for the paper's 12 x 768 teacher and 4 x 312 student (3 : 1
in layers, 4 : 1 in width here).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["STUDENT", "TEACHER", "VARIANTS", "learning_check", "recipe"]

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]

TEACHER = ["--layers", "6", "--hidden", "128", "--heads", "4"]
STUDENT = ["--layers", "2", "--hidden", "32", "--heads", "2"]
VARIANTS: dict[str, list[str]] = {
    "lrc": [],
    "no_two_stage": ["--no-two-stage"],
    "no_perturb": ["--no-perturb"],
    "mse": ["--layer-loss", "mse"],
    # not in the paper: eps scaled to this student's width, sqrt(32 / 312) = 0.32, so that the
    # perturbation has the size relative to the embeddings that eps = 1 has for a 312-wide one
    "perturb_width_scaled": ["--perturb-scale", str((32 / 312) ** 0.5)],
}


def recipe(name: str) -> Any:
    """``recipes/<name>.py`` as a module (recipes are scripts, not a package)."""
    key = f"recipe_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "recipes" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def run_recipe(name: str, argv: list[str], out: Path) -> dict[str, Any]:
    """One recipe run in this process (accelerate's process-wide state reset around it);
    returns its ``results.json``."""
    from contrastive.engine import reset_accelerate_state as reset

    reset()
    try:
        recipe(name).main([*argv, "--output-dir", str(out)])
    finally:
        reset()
    return json.loads((out / "results.json").read_text())


def learning_check(seed: int = 0, *, variants: tuple[str, ...] = ("lrc",), teacher_steps: int = 600,
                   student_steps: int = 300, n_train: int = 4000, n_dev: int = 1000,
                   teacher_lr: float = 5e-4, student_lr: float = 1e-3, batch_size: int = 32,
                   teacher: list[str] | None = None, student: list[str] | None = None,
                   workdir: str | Path | None = None) -> dict[str, Any]:
    """Dev accuracies (%) of the teacher, the CE-only student and each LRC-BERT variant."""
    import torch

    torch.set_num_threads(1)
    common = ["--task", "generated", "--n-train", str(n_train), "--n-dev", str(n_dev),
              "--seed", str(seed), "--data-seed", str(seed), "--batch-size", str(batch_size),
              "--max-length", "64", "--intermediate-size", "0", "--mixed-precision", "no",
              "--progress", "false", "--num-workers", "0", "--save-every-steps", "0"]
    result: dict[str, Any] = {"seed": seed, "seconds": {}}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        def fit(name: str, script: str, argv: list[str], steps: int, lr: float) -> None:
            t0 = time.perf_counter()
            res = run_recipe(script, [*common, *argv, "--steps", str(steps), "--lr", str(lr),
                                      "--log-every", str(max(1, steps // 4))], Path(tmp) / name)
            acc = 100.0 * res["dev"]["glue_accuracy"]
            result[name] = round(acc, 2)
            result["seconds"][name] = round(time.perf_counter() - t0, 1)
            log.info("seed %d %s: dev accuracy %.2f %%", seed, name, acc)

        fit("teacher", "bert_finetune", teacher or TEACHER, teacher_steps, teacher_lr)
        fit("ce_student", "bert_finetune", student or STUDENT, student_steps, student_lr)
        model = str(Path(tmp) / "teacher" / "model")
        for v in variants:
            fit(v, "lrc_bert", [*(student or STUDENT), "--teacher", model, *VARIANTS[v]],
                student_steps, student_lr)
    return result
