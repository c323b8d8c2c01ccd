"""Resume across versions: a checkpoint written before a config field existed (or under its
old name) resumes; the field counts as its default (contrastive.engine.compat.upgrade_config).

The checkpoint "written before the change" is a real one whose ``meta.json`` config is put back
into the form the code before issue 27 wrote: the same fields minus those issue 27 added
(``steps``, ``warmup_steps``, ``keep_best``; the list below was taken from that code's
``ImageConfig``, commit 12ac714). Before the fix such a resume was refused ("belongs to a run with
other settings: keep_best: None -> ''; steps: None -> 0 ...")."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from contrastive.engine import compat
from contrastive.engine.compat import IncompatibleCheckpointError, check_compatible, upgrade_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_safe_resume import MOCO, _run  # noqa: E402

ADDED_BY_ISSUE_27 = ("steps", "warmup_steps", "keep_best")


def test_absent_fields_take_their_default_renamed_are_mapped_removed_dropped(monkeypatch):
    defaults = {"recipe": "r", "lr": 0.1, "steps": 0, "new_name": 3}
    monkeypatch.setitem(compat.RENAMED_FIELDS, "old_name", "new_name")
    old = {"recipe": "r", "lr": 0.2, "old_name": 5, "gone": True}
    assert upgrade_config(old, defaults) == {"recipe": "r", "lr": 0.2, "steps": 0, "new_name": 5}


def test_a_non_default_new_field_is_still_a_change():
    sig = {"method": "M", "digest": "d", "tensors": {}}
    meta = {"format": compat.FORMAT_VERSION, "signature": sig, "config": {"lr": 0.1}}
    defaults = {"lr": 0.1, "steps": 0}
    assert check_compatible(meta, sig, {"lr": 0.1, "steps": 0}, world_size=1,
                            defaults=defaults) == []
    with pytest.raises(IncompatibleCheckpointError, match="steps: 0 -> 100"):
        check_compatible(meta, sig, {"lr": 0.1, "steps": 100}, world_size=1, defaults=defaults)
    with pytest.raises(IncompatibleCheckpointError, match="steps: None -> 0"):  # without defaults
        check_compatible(meta, sig, {"lr": 0.1, "steps": 0}, world_size=1)


def test_a_checkpoint_written_before_the_new_fields_resumes(tmp_path):
    args = [*MOCO, "--save-every-steps", "0", "--keep-last", "1"]
    ref = tmp_path / "ref"
    _run("moco_cifar", [*args, "--output-dir", str(ref)])
    out = tmp_path / "old"
    _run("moco_cifar", [*args, "--max-steps", "4", "--output-dir", str(out)])
    meta_path = out / "checkpoints" / "step_00000004" / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert set(ADDED_BY_ISSUE_27) <= set(meta["config"])
    for name in ADDED_BY_ISSUE_27:  # as the code before issue 27 wrote it
        del meta["config"][name]
    meta_path.write_text(json.dumps(meta, indent=1))
    result = _run("moco_cifar", [*args, "--output-dir", str(out), "--resume", "auto"])
    assert result.step == 8 and result.steps_trained == 4
    from safetensors.torch import load_file

    a, b = (load_file(str(d / "checkpoints" / "step_00000008" / "model.safetensors"))
            for d in (ref, out))
    assert all(a[k].equal(b[k]) for k in a)


def test_a_run_written_under_the_old_momentum_names_resumes(tmp_path):
    """Issue 29 renamed the EMA momentum fields (moco_momentum, tau_base, momentum_teacher) to
    ``momentum``. A run folder written before (its checkpoint's and config.json's config under
    ``moco_momentum``, resumed with the command line of then) resumes, with a FutureWarning, and
    ends bit-identical to a run that never stopped. At a non-default momentum, so that reading
    the old key as absent (the default 0.99) would refuse the resume."""
    args = [*MOCO, "--save-every-steps", "0", "--keep-last", "1"]
    ref = tmp_path / "ref"
    _run("moco_cifar", [*args, "--momentum", "0.95", "--output-dir", str(ref)])
    out = tmp_path / "old"
    _run("moco_cifar", [*args, "--momentum", "0.95", "--max-steps", "4", "--output-dir",
                        str(out)])
    for path in (out / "checkpoints" / "step_00000004" / "meta.json", out / "config.json"):
        record = json.loads(path.read_text())
        config = record["config"] if "config" in record else record
        assert config.pop("momentum") == 0.95
        config["moco_momentum"] = 0.95  # as the code before issue 29 wrote it
        path.write_text(json.dumps(record, indent=1))
    with pytest.warns(FutureWarning, match="--moco-momentum is renamed --momentum"):
        result = _run("moco_cifar", [*args, "--moco-momentum", "0.95", "--output-dir",
                                     str(out), "--resume", "auto"])
    assert result.step == 8 and result.steps_trained == 4
    from safetensors.torch import load_file

    a, b = (load_file(str(d / "checkpoints" / "step_00000008" / "model.safetensors"))
            for d in (ref, out))
    assert all(a[k].equal(b[k]) for k in a)


def test_old_field_names_in_a_config_file_and_on_the_command_line(tmp_path):
    """``--config`` of an older run's config.json and the old flags fill the renamed field; the
    old flags stay out of --help; an old name is never read for a recipe's own field of that
    name."""
    from contrastive.engine import ImageConfig, RunConfig, parse_config
    from contrastive.engine.config import config_from_dict

    @dataclasses.dataclass
    class Recipe(ImageConfig):
        momentum: float = 0.99

    old = tmp_path / "config.json"
    old.write_text(json.dumps({"tau_base": 0.9, "lr": 0.5}))
    with pytest.warns(FutureWarning, match="'tau_base' is renamed 'momentum'"):
        cfg = parse_config(Recipe, ["--data", "shapes", "--config", str(old)])
    assert (cfg.momentum, cfg.lr) == (0.9, 0.5)
    for flag in ("--momentum-teacher", "--momentum_teacher", "--tau-base"):
        with pytest.warns(FutureWarning, match="is renamed --momentum"):
            assert parse_config(Recipe, ["--data", "shapes", flag, "0.8"]).momentum == 0.8

    @dataclasses.dataclass
    class Distil(ImageConfig):  # distill_cosnce's KD temperature, once kd_temperature
        temperature: float = 1.1

    with pytest.warns(FutureWarning, match="is renamed --temperature"):
        assert parse_config(Distil, ["--data", "shapes", "--kd-temperature", "2"]).temperature == 2
    with pytest.raises(KeyError, match="moco_momentum"):  # a config without the new field
        config_from_dict(RunConfig, {"moco_momentum": 0.9})

    @dataclasses.dataclass
    class Keeps(ImageConfig):  # a recipe whose own field has an old name keeps it
        momentum: float = 0.99
        tau_base: float = 0.5

    assert parse_config(Keeps, ["--data", "shapes", "--tau-base", "0.7"]).tau_base == 0.7
