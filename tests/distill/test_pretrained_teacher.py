"""recipes/distill_cosnce.py with a pretrained teacher (issue 49 step 5): the teacher sees its
own normalisation, the student the pipeline's; ``--init`` starts the student, not the teacher."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch

from contrastive.methods.distill import Distiller
from contrastive.methods.distill_layers import Renormalise
from contrastive.nn import create_encoder

ROOT = Path(__file__).resolve().parents[2]
LITE0 = ROOT.parent / "shared" / "data" / "image-models" / "efficientnet_lite0" / "model.safetensors"
STUDENT = ["--student", "small_cnn", "--student-kwargs", '{"widths": [8, 8, 16, 16]}']
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def _recipe():
    spec = importlib.util.spec_from_file_location("distill_cosnce", ROOT / "recipes" / "distill_cosnce.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _normalised(u: torch.Tensor, norm) -> torch.Tensor:
    mean, std = (torch.tensor(t, dtype=u.dtype).view(1, 3, 1, 1) for t in norm)
    return (u - mean) / std


def test_teacher_sees_its_own_normalisation_the_student_the_pipelines() -> None:
    torch.manual_seed(0)
    teacher = create_encoder("small_cnn", widths=(8, 8, 16, 16)).eval()  # made float64 below
    u = torch.rand(4, 3, 16, 16, dtype=torch.float64)  # the images, in [0, 1]
    x_student, x_teacher = _normalised(u, IMAGENET), _normalised(u, HALF)
    renorm = Renormalise(*IMAGENET, *HALF).double()
    torch.testing.assert_close(renorm(x_student), x_teacher, rtol=0, atol=1e-14)
    assert renorm(x_student.float()).dtype == torch.float32  # applied in the input's dtype
    torch.testing.assert_close(renorm(x_student.float()), x_teacher.float(), rtol=0, atol=2e-6)

    method = Distiller(teacher, "small_cnn", perturb=False, input_norm=IMAGENET, teacher_norm=HALF)
    plain = Distiller(teacher, "small_cnn", perturb=False)  # the same teacher, no renorm
    method, plain = method.double(), plain.double()
    assert not any("mean_" in k or "std_" in k for k in method.state_dict())  # not checkpointed
    got, _ = method._teacher_forward(x_student)
    want, _ = plain._teacher_forward(x_teacher)  # run on the images normalised its own way
    assert plain.teacher_input is None
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    unfixed, _ = plain._teacher_forward(x_student)  # what the teacher saw before: far off
    assert (unfixed[-1] - want[-1]).abs().max() > 1e-3
    # the same statistics on both sides: no re-normalisation at all (bit-exact as before)
    assert Distiller("small_cnn", "small_cnn", perturb=False, input_norm=HALF,
                     teacher_norm=[list(t) for t in HALF]).teacher_input is None


def test_teacher_normalisation_flags_and_records(tmp_path: Path, capsys) -> None:
    from contrastive.engine import parse_config

    recipe = _recipe()
    torch.manual_seed(0)
    enc = create_encoder("small_cnn", widths=(8, 8, 16, 16))
    path = tmp_path / "encoder.pt"  # our encoder.pt records the normalisation it was trained with
    torch.save({"encoder": "small_cnn", "state_dict": enc.state_dict(), "mean": list(HALF[0]),
                "std": list(HALF[1]), "encoder_kwargs": {"widths": [8, 8, 16, 16]}}, path)
    cfg = parse_config(recipe.DistillCosNCE, ["--teacher-checkpoint", str(path)])
    assert (recipe.build_teacher(cfg, None).mean, recipe.build_teacher(cfg, None).std) == HALF
    cfg = parse_config(recipe.DistillCosNCE, ["--teacher-checkpoint", str(path),
                                              "--teacher-mean", "0.1", "--teacher-std", "0.2"])
    teacher = recipe.build_teacher(cfg, None)
    assert (teacher.mean, teacher.std) == ((0.1,), (0.2,))
    with pytest.raises(SystemExit) as e:
        recipe.main(["--teacher-mean", "0.5", "0.5", "0.5"])
    assert e.value.code == 2 and "give both --teacher-mean and --teacher-std" in capsys.readouterr().err


def test_a_published_teacher_brings_its_normalisation(monkeypatch) -> None:
    """--teacher-checkpoint timm:NAME (the download replaced): timm's record of the published
    weights' normalisation (its TF-ported EfficientNet-Lite0 was trained at mean = std = 0.5;
    timm's own efficientnet_lite0 weights, unlike the EfficientNet-PyTorch port in
    ../shared/data, at ImageNet's)."""
    import contrastive.nn as nn_module
    from contrastive.eval.init import published_normalisation
    from contrastive.eval.teacher import load_teacher

    real = nn_module.create_encoder
    monkeypatch.setattr(nn_module, "create_encoder",
                        lambda name, pretrained=False, **kwargs: real(name, **kwargs))
    teacher = load_teacher("", "timm:tf_efficientnet_lite0")
    assert (teacher.mean, teacher.std) == HALF
    assert published_normalisation("timm:efficientnet_lite0") == IMAGENET
    mean, std = published_normalisation("torchvision:resnet18")
    assert (tuple(mean), tuple(std)) == IMAGENET  # torchvision's ImageNet weights


def _efficientnet_lite0() -> Path:
    if not LITE0.is_file():
        pytest.skip(f"the pretrained EfficientNet-Lite0 file is not at {LITE0} (../shared/data)")
    return LITE0


def test_efficientnet_teacher_equals_timm_on_its_own_normalisation() -> None:
    import timm
    from safetensors.torch import load_file

    from contrastive.data import get_dataset
    from contrastive.engine import data_info, parse_config

    file = _efficientnet_lite0()
    recipe = _recipe()
    cfg = parse_config(recipe.DistillCosNCE, [
        "--data", "shapes:n=16,size=32", "--batch-size", "8", "--teacher", "timm:efficientnet_lite0",
        "--teacher-checkpoint", str(file), "--teacher-mean", "0.5", "0.5", "0.5",
        "--teacher-std", "0.5", "0.5", "0.5", *STUDENT])
    train = get_dataset(cfg.data, "train")
    method = recipe.build_method(cfg, data_info(cfg, len(train), kit={"num_classes": None}))
    reference = timm.create_model("efficientnet_lite0", num_classes=0).eval()
    missing = reference.load_state_dict(load_file(str(file)), strict=False)
    assert not missing.missing_keys  # only the classifier is left over
    u = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = method.teacher(method.teacher_input(_normalised(u, IMAGENET)))
        want = reference(_normalised(u, HALF))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_efficientnet_teacher_into_a_student_from_init(tmp_path: Path, caplog) -> None:
    """2 steps at lr 0: the student's parameters are the --init file's, the teacher's tensors
    the EfficientNet file's (the init reached the student only); the run records both."""
    import json

    from safetensors.torch import load_file

    file = _efficientnet_lite0()
    torch.manual_seed(1)
    student = create_encoder("small_cnn", widths=(8, 8, 16, 16)).state_dict()
    torch.save(student, tmp_path / "student.pt")
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        result = _recipe().main([
            "--data", "shapes:n=16,size=32", "--image-size", "32", "--batch-size", "8",
            "--num-workers", "0", "--no-progress", "--steps", "2", "--lr", "0",
            "--teacher", "timm:efficientnet_lite0", "--teacher-checkpoint", str(file),
            "--teacher-mean", "0.5", "0.5", "0.5", "--teacher-std", "0.5", "0.5", "0.5",
            *STUDENT, "--init", str(tmp_path / "student.pt"), "--output-dir", str(out)])
    assert result.status == "completed" and result.step == 2
    assert "the teacher's input is re-normalised" in caplog.text
    saved = load_file(str(result.checkpoint / "model.safetensors"))
    params = dict(create_encoder("small_cnn", widths=(8, 8, 16, 16)).named_parameters())
    for k in params:  # lr 0: the parameters are still the --init file's (BN statistics moved)
        assert torch.equal(saved[f"encoder.{k}"], student[k]), k
    for k, v in load_file(str(file)).items():
        if not k.startswith("classifier."):
            assert torch.equal(saved[f"teacher.{k}"], v), k
    config = json.loads((out / "config.json").read_text())
    assert config["teacher_mean"] == [0.5] * 3 and config["init"] == str(tmp_path / "student.pt")


def test_init_reaches_the_student_not_a_teacher_of_the_same_architecture(tmp_path: Path) -> None:
    """Teacher and student both small_cnn [8, 8, 16, 16]: --init loads into every such backbone
    built, the teacher too, but the teacher's own file then replaces it whole."""
    from safetensors.torch import load_file

    files = {}
    for seed, name in ((1, "student"), (2, "teacher")):
        torch.manual_seed(seed)
        files[name] = create_encoder("small_cnn", widths=(8, 8, 16, 16)).state_dict()
        torch.save({"encoder": "small_cnn", "encoder_kwargs": {"widths": [8, 8, 16, 16]},
                    "state_dict": files[name]}, tmp_path / f"{name}.pt")
    result = _recipe().main([
        "--data", "shapes:n=16,size=16", "--image-size", "16", "--batch-size", "8",
        "--num-workers", "0", "--no-progress", "--steps", "1", "--lr", "0",
        "--teacher-checkpoint", str(tmp_path / "teacher.pt"), *STUDENT,
        "--init", str(tmp_path / "student.pt"), "--output-dir", str(tmp_path / "run")])
    saved = load_file(str(result.checkpoint / "model.safetensors"))
    for k, _ in create_encoder("small_cnn", widths=(8, 8, 16, 16)).named_parameters():
        assert torch.equal(saved[f"encoder.{k}"], files["student"][k]), k
    for k, v in files["teacher"].items():
        assert torch.equal(saved[f"teacher.{k}"], v), k


# ---- 2 processes == 1 process, through the recipe, in float64 ---------------------------------

RUNS = Path(__file__).with_name("distill_dist_runs.py")  # the runs, their settings and the bug


@pytest.mark.distributed
def test_two_processes_equal_one_with_the_efficientnet_teacher(two_process_runs) -> None:
    from safetensors.torch import load_file

    _efficientnet_lite0()  # before the launch: without the file its runs do nothing
    folder = two_process_runs(RUNS)  # 2 processes, and 2 with the bug: the session's launch
    two_process_runs.module(RUNS).run(folder, "one")  # 1 process, in this one
    one, two, mutant = (load_file(str(folder / name / "checkpoints" / "step_00000003" /
                                      "model.safetensors")) for name in ("one", "two", "mutant"))
    init = torch.load(folder / "student_init.pt", weights_only=True)
    assert one["encoder.pos_embed"].dtype == torch.float64
    assert not torch.equal(one["encoder.pos_embed"], init["pos_embed"].double())  # it trained

    def gap(a: dict, b: dict) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in a if k.startswith(("encoder.", "head.", "projections.")))

    # float64: only rounding of sums taken in another order; negatives from one process only,
    # a wrong rank offset or gradient average move the weights by far more at once
    assert gap(one, two) < 1e-9
    assert gap(one, mutant) > 1e-6
    print(f"2 vs 1 process: max |weight difference| {gap(one, two):.2e}; local negatives only: "
          f"{gap(one, mutant):.2e}")
