"""Resume across versions: a checkpoint written before a config field existed (or under its
old name) resumes; the field counts as its default (contrastive.engine.compat.upgrade_config).

The checkpoint "written before the change" is a real one whose ``meta.json`` config is put back
into the form the code before issue 27 wrote: the same fields minus those issue 27 added
(``steps``, ``warmup_steps``, ``keep_best``; the list below was taken from that code's
``TrainConfig``, commit 12ac714). Before the fix such a resume was refused ("belongs to a run with
other settings: keep_best: None -> ''; steps: None -> 0 ...")."""

from __future__ import annotations

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
