"""A planted pickle is refused unread, in one line: ``recipes/simcse.py --encoder hf:FOLDER``
and ``contrastive-sts-eval --model FOLDER`` on a folder whose ``pytorch_model.bin`` would
write a marker file if it were unpickled exit with status 2 and one stderr line
``prog: error: ...``, and the marker never appears."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


class _Payload:
    """Unpickling this calls open(marker, "w"): the file appears if the pickle's code runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """(a BERT folder whose pytorch_model.bin carries the payload, the payload's marker)."""
    import transformers

    folder, marker = tmp_path / "evil", tmp_path / "pwned"
    transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                            num_attention_heads=2, intermediate_size=32).save_pretrained(folder)
    torch.save({"embeddings.word_embeddings.weight": _Payload(marker)},
               folder / "pytorch_model.bin")
    return folder, marker


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.parametrize("program", ["simcse.py", "contrastive-sts-eval"])
def test_a_planted_pickle_is_refused_in_one_line(tmp_path: Path, program: str) -> None:
    folder, marker = _planted(tmp_path)
    if program == "simcse.py":
        args = [str(ROOT / "recipes" / "simcse.py"), "--encoder", f"hf:{folder}", "--steps", "1",
                "--output-dir", str(tmp_path / "run")]
    else:
        args = ["-m", "contrastive.eval.sts", "--model", str(folder)]
    done = _run(args, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"{program}: error: "), done.stderr[-2000:]
    assert "pytorch_model.bin" in lines[0] and "refused" in lines[0]
    assert not marker.exists()
    assert not (tmp_path / "run").exists()  # refused before the run folder


def _recipe(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"unsafe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("recipe, flag", [("bert_finetune", "--model"), ("lrc_bert", "--student")])
def test_a_planted_pickle_as_the_starting_weights_is_refused_before_the_run_folder(
        tmp_path: Path, capsys, recipe: str, flag: str) -> None:
    """The labelled-text kit checks the ``hf:`` folder a run starts from while it prepares (no
    run folder yet): one line through ``cli``, status 2, the pickle never run (in-process: the
    subprocess path of ``cli`` is the simcse case's)."""
    folder, marker = _planted(tmp_path)
    argv = [flag, f"hf:{folder}", "--task", "generated", "--steps", "1", "--output-dir",
            str(tmp_path / "run"), "--teacher", str(tmp_path / "teacher")]
    if recipe == "bert_finetune":
        argv = argv[:-2]
    module = _recipe(recipe)
    code = module.cli(module.main, f"{recipe}.py", argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"{recipe}.py: error: "), lines
    assert "pytorch_model.bin" in lines[0] and "refused" in lines[0]
    assert not marker.exists()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("recipe", ["clip", "siglip"])
def test_a_planted_pickle_as_the_text_tower_is_refused_before_the_run_folder(
        tmp_path: Path, capsys, recipe: str) -> None:
    """The image-text kit checks ``--text-encoder hf:FOLDER`` while it prepares: one line
    through ``run``, status 2, the pickle never run, no run folder."""
    folder, marker = _planted(tmp_path)
    argv = ["--text-encoder", f"hf:{folder}", "--steps", "1", "--warmup-steps", "0", "--output-dir",
            str(tmp_path / "run")]
    with pytest.raises(SystemExit) as exit_:
        _recipe(recipe).main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"{recipe}.py: error: ") and "refused" in lines[0], lines
    assert "pytorch_model.bin" in lines[0] and not marker.exists()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", ["--teacher", "--student"])
def test_a_planted_pickle_in_pre_training_distillation_is_refused_before_the_run_folder(
        tmp_path: Path, capsys, flag: str) -> None:
    """recipes/lrc_bert_pretrain.py checks its teacher and student ``hf:`` folders before
    anything is built: one line through ``cli``, status 2, the pickle never run."""
    import transformers

    folder, marker = _planted(tmp_path)
    safe = tmp_path / "safe"
    transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32)).save_pretrained(safe)
    capsys.readouterr()  # transformers' progress bar
    models = {"--teacher": f"hf:{safe}", "--student": "bert", flag: f"hf:{folder}"}
    argv = [*(x for kv in models.items() for x in kv), "--steps", "1", "--output-dir",
            str(tmp_path / "run")]
    module = _recipe("lrc_bert_pretrain")
    code = module.cli(module.main, "lrc_bert_pretrain.py", argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("lrc_bert_pretrain.py: error: ") and "refused" in lines[0], lines
    assert not marker.exists() and not (tmp_path / "run").exists()
