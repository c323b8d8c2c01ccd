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
