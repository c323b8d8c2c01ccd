"""Bad input fails with a clear message before any training step."""

from __future__ import annotations

import pytest


def _run(rx, name, argv):
    from contrastive.engine import run

    mod = rx.load_recipe(name)
    cls = next(v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == mod.__name__)
    return run(cls, mod.build_method, mod.build_pipeline, argv=[*rx.TINY, *rx.SMALL[name], *argv],
               name=name)


def test_unknown_field_exits_2_naming_the_closest(rx, capsys):
    with pytest.raises(SystemExit) as exc:
        _run(rx, "moco_cifar", ["--queue-sise", "16"])
    assert exc.value.code == 2
    assert "did you mean --queue-size" in capsys.readouterr().err


def test_missing_data_path(rx, tmp_path, fresh_accelerate):
    out = tmp_path / "run"
    with pytest.raises((FileNotFoundError, ValueError), match="no/such/folder"):
        _run(rx, "moco_cifar", ["--data", str(tmp_path / "no/such/folder"), "--output-dir",
                                str(out)])
    assert not (out / "checkpoints").exists()


def test_non_empty_output_dir_needs_resume(rx, tmp_path, fresh_accelerate):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="--resume auto"):
        _run(rx, "moco_cifar", ["--output-dir", str(tmp_path / "run")])


def test_fp16_on_cpu_is_refused(rx, tmp_path, fresh_accelerate):
    with pytest.raises(ValueError, match="fp16 on the CPU"):
        _run(rx, "moco_cifar", ["--mixed-precision", "fp16", "--output-dir", str(tmp_path)])


def test_batch_not_divisible_by_accumulation(rx, tmp_path, fresh_accelerate):
    with pytest.raises(ValueError, match="grad-accum-steps"):
        _run(rx, "moco_cifar", ["--grad-accum-steps", "3", "--output-dir", str(tmp_path / "r")])


@pytest.fixture(scope="module")
def moco_run(tmp_path_factory, rx):
    out = tmp_path_factory.mktemp("moco") / "run"
    rx.run_recipe("moco_cifar", "--max-steps", "2", "--output-dir", str(out))
    return out


@pytest.mark.parametrize("recipe, argv, words", [
    ("moco_cifar", ["--encoder", "cifar_resnet18"], "different model; checkpoint "
     "encoder='small_cnn', now 'cifar_resnet18'"),
    ("simclr_cifar", [], "method MoCo in the checkpoint, SimCLR now"),
    ("moco_cifar", ["--lr", "0.5"], "lr: 0.03 -> 0.5"),
])
def test_incompatible_checkpoint_before_training(rx, moco_run, recipe, argv, words,
                                                 fresh_accelerate):
    from contrastive.engine import IncompatibleCheckpointError

    before = (moco_run / "metrics.jsonl").read_text()
    with pytest.raises(IncompatibleCheckpointError) as exc:
        _run(rx, recipe, ["--output-dir", str(moco_run), "--resume", "auto", *argv])
    assert words in str(exc.value)
    assert (moco_run / "metrics.jsonl").read_text() == before  # nothing trained, nothing logged
    assert sorted(p.name for p in (moco_run / "checkpoints").iterdir()) == ["step_00000002"]


# -- the labelled-text recipes (recipes/bert_finetune.py, recipes/lrc_bert.py): input read first --

def _sst2(root):
    """A GLUE folder with SST-2's two files in the official layout (tiny)."""
    folder = root / "glue_data" / "SST-2"
    folder.mkdir(parents=True)
    rows = "sentence\tlabel\nthe film was great \t1\nan awful plot \t0\n"
    for split in ("train", "dev"):
        (folder / f"{split}.tsv").write_text(rows)
    return root / "glue_data"


def test_text_recipe_without_tokenizer_is_one_line(rx, tmp_path):
    """The issue's command: a random-init model on GLUE without --tokenizer; one line, exit 2,
    no traceback, nothing written."""
    pytest.importorskip("transformers")
    out = tmp_path / "run"
    proc = rx.run_recipe("bert_finetune", "--task", "sst2", "--glue-dir", str(_sst2(tmp_path)),
                         "--output-dir", str(out), tiny=False, check=False, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("bert_finetune.py: error: ") and "--tokenizer FOLDER" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("recipe, argv, words", [
    ("bert_finetune", ["--task", "sst2", "--glue-dir", "{empty}", "--tokenizer", "{tok}"],
     "no train.tsv in"),
    ("bert_finetune", ["--task", "sst2", "--tokenizer", "{tok}"], "pass --glue-dir"),
    ("bert_finetune", ["--task", "sst3"], "unknown task 'sst3': use a GLUE task"),
    ("bert_finetune", ["--task", "sst2", "--glue-dir", "{glue}", "--model", "roberta"],
     "'bert' or 'hf:FOLDER'"),
    ("bert_finetune", ["--task", "sst2", "--glue-dir", "{glue}", "--model", "hf:{empty}/bert"],
     "empty/bert' is not a folder. Give the path of a local Hugging Face checkpoint folder"),
    ("bert_finetune", ["--task", "sst2", "--glue-dir", "{glue}", "--tokenizer", "{empty}"],
     "holds neither tokenizer.json nor vocab.txt"),
    ("lrc_bert", ["--task", "sst2", "--glue-dir", "{glue}", "--teacher", "{empty}"],
     "lacks classifier.json or model.safetensors; make a teacher with recipes/bert_finetune.py"),
    ("lrc_bert", ["--task", "sst2", "--glue-dir", "{glue}", "--teacher", "{empty}/none"],
     "lacks classifier.json"),
    ("lrc_bert", ["--task", "nli", "--teacher", "{empty}"], "unknown task 'nli'"),
])
def test_text_recipe_bad_input(rx, tmp_path, capsys, recipe, argv, words):
    """Each names the problem and the fix in one line (``prog: error: ...``, exit status 2)
    before anything is trained or written."""
    pytest.importorskip("transformers")
    from contrastive.data.text_tasks import generated_tokenizer

    (tmp_path / "empty").mkdir()
    generated_tokenizer().save(tmp_path / "tok")
    paths = {"empty": tmp_path / "empty", "tok": tmp_path / "tok", "glue": _sst2(tmp_path)}
    argv = [a.format(**paths) for a in argv]
    mod = rx.load_recipe(recipe)
    out = tmp_path / "run"
    capsys.readouterr()
    assert mod.cli(mod.main, f"{recipe}.py", [*argv, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{recipe}.py: error: ") and words in err[0], err
    assert not out.exists()


# -- a ViT recipe's --encoder-kwargs default with another --encoder ---------------------------

def test_vit_encoder_kwargs_with_a_cnn_is_one_line_and_the_folder_is_reusable(
        rx, tmp_path, fresh_accelerate):
    """dino_vit_small's default --encoder-kwargs (dynamic_img_size) with --encoder small_cnn:
    one line naming the encoder, the keyword and the fix, before any step; the folder holds only
    run_state.json (failed, no checkpoint), and the fixed command runs in the same folder."""
    from contrastive.engine import run
    from contrastive.engine.run_state import read_run_state

    mod = rx.load_recipe("dino_vit_small")
    out = tmp_path / "run"
    argv = [*rx.TINY, "--warmup-epochs", "0.5", "--local-crops", "0", "--out-dim", "64",
            "--max-steps", "1", "--output-dir", str(out)]
    with pytest.raises(SystemExit) as exc:
        run(mod.DINOViTSmall, mod.build_method, mod.build_pipeline, argv=argv,
            name="dino_vit_small")
    text = str(exc.value.code)
    assert text.startswith("dino_vit_small: error: encoder 'small_cnn' takes no keyword "
                           "argument 'dynamic_img_size'") and "\n" not in text
    assert "--encoder-kwargs '{}'" in text
    assert [p.name for p in out.iterdir()] == ["run_state.json"]
    state = read_run_state(out)
    assert state["state"] == "failed" and state["checkpoint"] is None
    assert "EncoderArgumentError" in state["error"]
    result = run(mod.DINOViTSmall, mod.build_method, mod.build_pipeline,
                 argv=[*argv, "--encoder-kwargs", "{}"], name="dino_vit_small")
    assert result.step == 1 and read_run_state(out)["state"] == "completed"


def test_a_failed_run_with_a_checkpoint_or_a_log_still_needs_resume(tmp_path):
    """Only the record of a run that failed in its set-up is replaced by a new run."""
    from contrastive.engine.run_state import write_run_state
    from contrastive.engine.setup import check_fresh_output_dir

    out = tmp_path / "run"
    out.mkdir()
    write_run_state(out, "failed", step=None, error="ValueError: x", resumable=False,
                    checkpoint=None)
    check_fresh_output_dir(out, "")  # set-up failure: nothing to lose
    write_run_state(out, "failed", step=4, error="x", resumable=True,
                    checkpoint="checkpoints/step_00000004")
    with pytest.raises(FileExistsError, match="--resume auto"):
        check_fresh_output_dir(out, "")
    for state in ("completed", "stopped", "running"):
        write_run_state(out, state, step=None, checkpoint=None)
        with pytest.raises(FileExistsError, match="--resume auto"):
            check_fresh_output_dir(out, "")
    write_run_state(out, "failed", step=None, error="x", resumable=False, checkpoint=None)
    (out / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="--resume auto"):
        check_fresh_output_dir(out, "")
