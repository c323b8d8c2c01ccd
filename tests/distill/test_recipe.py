"""recipes/distill_cosnce.py end to end on tiny shapes data, and its teacher loading."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from contrastive.data import get_dataset
from contrastive.engine import data_info, parse_config
from contrastive.eval.teacher import labelled_classes, single_linear_head
from contrastive.nn import create_encoder

ROOT = Path(__file__).resolve().parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("distill_cosnce", ROOT / "recipes" / "distill_cosnce.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


TINY = ["--data", "shapes:n=96,size=16", "--image-size", "16", "--batch-size", "16",
        "--num-workers", "0", "--no-progress"]


def _teacher_file(tmp_path: Path, head_out: int | None = 10, mlp: bool = False) -> tuple[Path, dict]:
    torch.manual_seed(0)
    enc = create_encoder("small_cnn", widths=(8, 16, 16, 32))
    state = dict(enc.state_dict())
    if head_out:
        state["fc.weight"], state["fc.bias"] = torch.randn(head_out, 32), torch.randn(head_out)
    if mlp:
        state["fc.2.weight"] = torch.randn(8, head_out or 32)
    path = tmp_path / "teacher.pt"
    torch.save({"encoder": "small_cnn", "state_dict": state,
                "encoder_kwargs": {"widths": [8, 16, 16, 32]}}, path)
    return path, state


def _build(recipe, argv):
    cfg = parse_config(recipe.DistillCosNCE, TINY + argv)
    train = get_dataset(cfg.data, "train")
    return recipe.build_method(cfg, data_info(cfg, len(train), kit={"num_classes": labelled_classes(train)}))


def test_recipe_end_to_end(tmp_path: Path) -> None:
    recipe = _recipe()
    teacher, state = _teacher_file(tmp_path)
    out = tmp_path / "run"
    result = recipe.main(TINY + ["--teacher-checkpoint", str(teacher),  # name + kwargs recorded
                                 "--student", "small_cnn", "--student-kwargs",
                                 '{"widths": [8, 8, 16, 16]}', "--epochs", "1", "--log-every", "1",
                                 "--stage1-fraction", "0.5",
                                 "--output-dir", str(out)])
    assert result.status == "completed" and result.step == 6
    saved = torch.load(out / "encoder.pt", weights_only=True)
    assert saved["encoder"] == "small_cnn"  # the student backbone, loadable by create_encoder
    assert saved["encoder_kwargs"] == {"widths": [8, 8, 16, 16]}
    create_encoder("small_cnn", **saved["encoder_kwargs"]).load_state_dict(saved["state_dict"])
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(r["loss"] is not None for r in records)
    # the "stage" schedule, logged per step: stage 2 from optimiser step 3 (0-based) of 6
    assert [r["stage"] for r in records] == [1, 1, 1, 2, 2, 2]
    config = json.loads((out / "config.json").read_text())
    assert config["encoder"] == "small_cnn" and config["teacher_checkpoint"] == str(teacher)

    from safetensors.torch import load_file

    ckpt = load_file(str(result.checkpoint / "model.safetensors"))
    assert not any("steps_done" in k for k in ckpt)  # a schedule is a function of the step
    for k, v in state.items():  # the frozen teacher did not move
        if not k.startswith("fc."):
            assert torch.equal(ckpt[f"teacher.{k}"], v), k
    assert torch.equal(ckpt["teacher_head.weight"], state["fc.weight"])  # KD was on


def test_recipe_help_says_two_passes(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        _recipe().main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "TWO" in text and "--teacher-checkpoint" in text and "--student" in text
    with pytest.raises(SystemExit) as e:  # a bad value fails before anything is built
        _recipe().main(TINY + ["--student-kwargs", "[1, 2]"])
    assert e.value.code == 2 and "--student-kwargs must be a JSON object" in capsys.readouterr().err


def test_teacher_head_rules(tmp_path: Path) -> None:
    recipe = _recipe()
    teacher, _ = _teacher_file(tmp_path, head_out=10)
    base = ["--teacher", "small_cnn", "--teacher-checkpoint", str(teacher)]
    m = _build(recipe, base)
    assert m.needs == ("views", "labels") and m.teacher_head.out_features == 10
    assert m.head.out_features == 10 and m.switch_at(6 * 20) == round(0.8 * 6 * 20)
    out = m(m.make_batch([torch.randn(4, 3, 16, 16)], step=6 * 20 - 1, total_steps=6 * 20,
                         labels=torch.tensor([0, 1, 2, 3])))
    assert torch.isfinite(out["loss"]) and "loss_hard" in out
    # --no-use-labels: the method does not ask for labels, the head stays for KD only
    m = _build(recipe, base + ["--no-use-labels"])
    assert m.needs == ("views",) and m.teacher_head is not None
    # --teacher-head none: representation-only distillation, no student head at all
    m = _build(recipe, base + ["--no-use-labels", "--teacher-head", "none"])
    assert m.teacher_head is None and m.head is None
    # a head whose classes differ from the data's is dropped by auto, kept by use
    teacher5, _ = _teacher_file(tmp_path, head_out=5)
    base5 = ["--teacher", "small_cnn", "--teacher-checkpoint", str(teacher5), "--no-use-labels"]
    assert _build(recipe, base5).teacher_head is None
    assert _build(recipe, base5 + ["--teacher-head", "use"]).teacher_head.out_features == 5


def test_single_linear_head_only() -> None:
    w, b = torch.randn(3, 4), torch.randn(3)
    head = single_linear_head({"fc.weight": w, "fc.bias": b}, ["fc.weight", "fc.bias"], 4)
    assert isinstance(head, nn.Linear) and torch.equal(head.weight, w) and torch.equal(head.bias, b)
    mlp = {"fc.0.weight": torch.randn(4, 4), "fc.2.weight": torch.randn(3, 4)}
    assert single_linear_head(mlp, list(mlp), 4) is None  # a projector, not a classifier
    assert single_linear_head({"fc.weight": w}, ["fc.weight"], 5) is None
