"""LRC-BERT's pre-training distillation (recipes/lrc_bert_pretrain.py; a teacher encoder without
a prediction layer in contrastive.methods.lrc_bert): the loss is the task stage's COS-NCE, the
student folder it writes is what the task stage starts from, bad input gives one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from contrastive.methods.lrc_bert import LRCBert  # noqa: E402
from contrastive.methods.text_classifier import TextClassifier  # noqa: E402
from contrastive.nn.text_encoders import build_text_encoder, text_encoder  # noqa: E402
from tests.text.test_lrc_bert import _batch, _enc  # noqa: E402
from tests.text.test_lrc_bert_recipe import COMMON, ENGINE, STUDENT, TEACHER, records, run  # noqa: E402


def _pair(**kw) -> tuple[LRCBert, LRCBert]:
    """The same teacher encoder with and without a prediction layer, the same student and
    projections (both built from seed 3)."""
    encoder, student = _enc(4, 16, 0), _enc(2, 8, 1)
    classifier = TextClassifier(encoder, 3, dropout=0.0)
    torch.manual_seed(3)
    task = LRCBert(classifier, student, **kw).double()
    torch.manual_seed(3)
    general = LRCBert(encoder, student, **kw).double()
    return task, general


@pytest.mark.parametrize("perturb", [False, True])
def test_a_teacher_without_a_head_trains_the_task_stages_cosnce(perturb: bool) -> None:
    """COS-NCE alone against the bare encoder is the task stage's stage-1 loss (1:0:0) against
    that encoder's classifier, value and gradients; no labels are read, none are needed."""
    stages = ((1.0, 0.0, 0.0), (1.0, 0.0, 0.0))
    task, general = _pair(stage_weights=stages, perturb=perturb)
    batch = {**_batch(), "stage": 1}
    unlabelled = {k: v for k, v in batch.items() if k != "labels"}
    assert general.head is None and "labels" not in general.needs
    a, b = task.train()(batch), general.train()(unlabelled)
    assert torch.equal(a["loss"], b["loss"]) and b["loss"] > 0
    ga = torch.autograd.grad(a["loss"], list(task.encoder.parameters()), allow_unused=True)
    gb = torch.autograd.grad(b["loss"], list(general.encoder.parameters()), allow_unused=True)
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(ga, gb))
    assert "loss_soft" not in b and "loss_hard" not in b and "accuracy" not in b


def test_one_sentence_examples_read_as_a_token_batch() -> None:
    """The sentences kit's (B, 1, T) batch gives the loss of the (B, T) one."""
    _, general = _pair(stage_weights=((1.0, 0.0, 0.0),) * 2, perturb=False)
    batch = {k: v for k, v in _batch().items() if k != "labels"}
    grouped = {k: v[:, None] for k, v in batch.items()}
    assert torch.equal(general({**batch, "stage": 1})["loss"],
                       general({**grouped, "stage": 1})["loss"])


def test_a_teacher_without_a_head_refuses_soft_and_hard_losses() -> None:
    with pytest.raises(ValueError, match=r"\(alpha, 0, 0\)"):
        LRCBert(_enc(4, 16, 0), _enc(2, 8, 1))  # the task stage's default 1:1:3
    general = LRCBert(_enc(4, 16, 0), _enc(2, 8, 1), stage_weights=((1.0, 0.0, 0.0),) * 2)
    with pytest.raises(TypeError, match="prediction layer"):
        general.predict(_batch())


@pytest.fixture(scope="module")
def general_teacher(tmp_path_factory) -> Path:
    """A tiny BERT folder (random weights) with the generated tasks' tokenizer: a stand-in for
    an un-fine-tuned pretrained encoder."""
    from contrastive.data.text_tasks import generated_tokenizer

    folder = tmp_path_factory.mktemp("general") / "bert"
    tok = generated_tokenizer()
    torch.manual_seed(0)
    build_text_encoder(num_layers=2, hidden_size=16, num_heads=2, vocab_size=tok.vocab_size,
                       max_position_embeddings=64).model.save_pretrained(folder)
    tok.save(folder)
    return folder


def test_the_student_folder_is_what_the_task_stage_starts_from(general_teacher: Path,
                                                                tmp_path: Path) -> None:
    """Pre-training distillation writes model/, an hf: folder holding the trained student
    (equal weights), which recipes/lrc_bert.py --student hf:OUT/model then distils on a task."""
    out = tmp_path / "pre"
    res = run("lrc_bert_pretrain", [
        "--teacher", f"hf:{general_teacher}", "--data", "generated", "--n-train", "64",
        "--batch-size", "8", "--steps", "4", "--eval", "none", *ENGINE, *STUDENT], out)
    logged = [r for r in records(out) if "loss" in r]
    assert logged and all("loss_intermediate" in r and "loss_soft" not in r for r in logged)
    from safetensors.torch import load_file

    assert res.status == "completed"
    saved = load_file(str(out / "checkpoints" / "step_00000004" / "model.safetensors"))
    trained = {k.removeprefix("encoder."): v for k, v in saved.items() if k.startswith("encoder.")}
    student = text_encoder(f"hf:{out / 'model'}").state_dict()
    assert len(student) > 10 and all(torch.equal(v, trained[k]) for k, v in student.items())
    assert json.loads((out / "config.json").read_text())["tokenizer"] == str(
        general_teacher)
    teacher = tmp_path / "teacher"
    run("bert_finetune", [*COMMON, *TEACHER, "--steps", "2"], teacher)
    task = tmp_path / "task"
    run("lrc_bert", [*COMMON, "--teacher", str(teacher / "model"), "--student",
                     f"hf:{out / 'model'}", "--steps", "2", "--lr", "1e-3"], task)
    assert (task / "model").is_dir() and (task / "results.json").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--teacher", "bert"], "--teacher must be hf:FOLDER"),
    (["--data", "missing.txt"], "no such .txt file"),
])
def test_bad_input_is_one_line(argv: list[str], message: str, general_teacher: Path,
                               tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.text.test_lrc_bert_recipe import recipe

    full = ["--teacher", f"hf:{general_teacher}", *argv, "--output-dir", str(tmp_path / "x"),
            *ENGINE]
    module = recipe("lrc_bert_pretrain")
    try:  # a field's check exits from the parser, a data error returns from cli: both status 2
        status = module.cli(module.main, "x", full)
    except SystemExit as e:
        status = e.code
    assert status == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse's usage may come first
    assert "error:" in last and message in last and "Traceback" not in last


def test_a_student_with_a_smaller_vocabulary_is_one_line(general_teacher: Path,
                                                         tmp_path: Path) -> None:
    """Teacher and student read the same token ids: a student folder whose embedding table is
    smaller than the teacher's tokenizer is refused before training (both recipes share the
    check, contrastive.nn.text_encoders.check_vocabulary)."""
    from contrastive.data.text_tasks import generated_tokenizer
    from tests.text.test_lrc_bert_recipe import recipe

    small = tmp_path / "small"
    build_text_encoder(num_layers=1, hidden_size=8, num_heads=2,
                       vocab_size=generated_tokenizer().vocab_size - 1,
                       max_position_embeddings=64).model.save_pretrained(small)
    module = recipe("lrc_bert_pretrain")
    with pytest.raises(SystemExit) as exit_:  # the engine's one line for a refused option
        module.cli(module.main, "x", ["--teacher", f"hf:{general_teacher}", "--student",
                                      f"hf:{small}", "--output-dir", str(tmp_path / "x"), *ENGINE])
    line = str(exit_.value.code)
    assert "\n" not in line and line.startswith("lrc_bert_pretrain: error: the student's vocabulary")
    assert f"({generated_tokenizer().vocab_size - 1}) is smaller than the teacher's tokenizer" in line
    assert not (tmp_path / "x" / "checkpoints").exists()
