"""A run stopped by ``--max-steps`` and continued with ``--resume auto`` ends bit-identical with
one that ran through, for every kit (sentence pairs, image-text, labelled text with and without a
teacher, images), with the kit's evaluator on and ``--keep-best`` its metric: the end-of-run
evaluation at the stop (its first, so a new best whose artefacts go into ``best/``) must leave
nothing of itself in the checkpoint the resume starts from (SimCSE's ``best/model`` export drew
from the global generator: 1.6e-4 away).

The recipes run in this process on the recipe digests' tiny settings
(:func:`benchmarks.recipe_digests.run_recipe`: fp32, the CPU), ``--steps 20`` stopped at 4."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from recipe_digests import run_recipe  # noqa: E402

#: per recipe: the flags that turn its evaluator on (the digests' settings turn some off) with
#: --keep-best, and the evaluator's name (its records' "<name>_when")
EVALUATED: dict[str, tuple[list[str], str]] = {
    "simcse": (["--eval", "generated", "--n-eval", "32", "--eval-at-start", "false",
                "--keep-best", "sts_spearman"], "sts"),
    "clip": (["--eval-max", "8", "--keep-best", "image_to_text_R@5"], "zeroshot"),
    "bert_finetune": (["--keep-best", "glue_score"], "glue"),
    "lrc_bert": (["--keep-best", "glue_score"], "glue"),
    "moco_cifar": (["--knn-every", "1", "--knn-at-start", "false", "--knn-k", "5",
                    "--keep-best", "knn_top1"], "knn"),
}


@pytest.fixture(scope="module")
def through(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the uninterrupted 4-step runs, bert_finetune's first: lrc_bert's teacher."""
    work = tmp_path_factory.mktemp("through")
    run_recipe("bert_finetune", work, [*EVALUATED["bert_finetune"][0], "--max-steps", "4"])
    return work


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step_{step:08d}" / "model.safetensors"))


@pytest.mark.parametrize("name", list(EVALUATED))
def test_a_run_stopped_by_max_steps_resumes_bit_identically(name: str, through: Path,
                                                            tmp_path: Path) -> None:
    flags, evaluator = EVALUATED[name]
    if name == "lrc_bert":  # the through-run's bert_finetune teaches both lrc_bert runs
        flags = [*flags, "--teacher", str(through / "bert_finetune" / "model")]
    if name != "bert_finetune":  # made by the fixture
        run_recipe(name, through, [*flags, "--max-steps", "4"])
    stopped = run_recipe(name, tmp_path, [*flags, "--max-steps", "2"])
    records = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get(f"{evaluator}_when") == "end"] == [2]
    assert (stopped / "best").is_dir()  # the first evaluation: a new best, kept at the stop
    run_recipe(name, tmp_path, [*flags, "--max-steps", "4", "--resume", "auto"])
    resumed, uninterrupted = _weights(stopped, 4), _weights(through / name, 4)
    assert resumed.keys() == uninterrupted.keys()
    differ = [k for k in sorted(resumed) if not torch.equal(resumed[k], uninterrupted[k])]
    assert not differ, f"{len(differ)} tensors differ: {differ[:3]}"
