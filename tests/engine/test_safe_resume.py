"""Nothing a resume reads can run code (issue 12, section 1).

For each file of a real run folder of ``moco_cifar`` and of ``distill_cosnce`` (its checkpoint
and the files beside it), a pickle whose loading creates a marker file replaces the file --
with ``meta.json``'s size/SHA-256 entry updated to match, as a careful attacker would -- and the
run is resumed with ``--resume auto``: the marker never appears; a file the resume reads is
refused with one line naming it. Positive control in the same test: the same bytes DO create
the marker under a plain ``pickle.loads``, so the test can fail.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch

from contrastive.engine import reset_accelerate_state

ROOT = Path(__file__).resolve().parents[2]
MOCO = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder",
        "small_cnn", "--batch-size", "16", "--epochs", "2", "--num-workers", "0", "--progress",
        "false", "--log-every", "1", "--mixed-precision", "no", "--seed", "0", "--queue-size",
        "32", "--split-bn", "2", "--knn-every", "0"]
# the same budget for CLIP through recipes/clip.py (the image-text adapter): 64 pairs of 16 px
CLIP = ["--data", "shapes-captions:n=64,n_test=16,size=16,max_length=12", "--image-size", "16",
        "--batch-size", "16", "--steps", "0", "--epochs", "2", "--warmup-steps", "2",
        "--num-workers", "0", "--progress", "false", "--log-every", "1", "--mixed-precision",
        "no", "--seed", "0", "--dim", "8", "--layers", "1", "--hidden", "16",
        "--eval-max", "0"]
# and for SimCSE through recipes/simcse.py (the text adapter): 32 generated NLI triples, a
# 1-layer BERT 16 wide, the STS evaluator every 4 steps with keep-best (both in the checkpoint)
SIMCSE = ["--n-train", "32", "--batch-size", "8", "--steps", "0", "--epochs", "2", "--layers",
          "1", "--hidden", "16", "--heads", "2", "--intermediate-size", "32", "--vocab-size", "100",
          "--num-workers", "0", "--progress", "false", "--log-every", "1", "--mixed-precision",
          "no", "--seed", "0", "--eval-every", "4", "--n-eval", "40"]
# and for labelled text through recipes/bert_finetune.py (the labelled-text adapter): 32 generated
# sentences, a 1-layer BERT 16 wide with dropout, the GLUE evaluator every 4 steps with keep-best
LABELLED = ["--task", "generated", "--n-train", "32", "--n-dev", "16", "--batch-size", "8",
            "--steps", "0", "--epochs", "2", "--layers", "1", "--hidden", "16", "--heads", "2",
            "--intermediate-size", "32", "--num-workers", "0", "--progress", "false",
            "--log-every", "1", "--mixed-precision", "no", "--seed", "0", "--eval-every", "4",
            "--keep-best", "glue_score", "--lr", "1e-3"]
DISTILL = ["--data", "shapes:n=96,size=16", "--image-size", "16", "--batch-size", "16",
           "--num-workers", "0", "--no-progress", "--student", "small_cnn", "--student-kwargs",
           '{"widths": [8, 8, 16, 16]}', "--epochs", "1", "--log-every", "1"]
CHECKPOINT_FILES = {"meta.json", "model.safetensors", "optimizer.bin", "random_states_0.pt"}


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe12_{name}", ROOT / "recipes" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(name: str, argv: list[str]):
    """The recipe as a program, in this process (``run`` parses ``argv``)."""
    from contrastive.engine import run

    mod = _recipe(name)
    reset_accelerate_state()
    try:
        if not hasattr(mod, "build_pipeline"):  # a recipe with its own adapter (clip)
            return mod.main(argv)
        cls = next(v for v in vars(mod).values()
                   if isinstance(v, type) and v.__module__ == mod.__name__ and hasattr(v, "lr"))
        return run(cls, mod.build_method, mod.build_pipeline, argv=argv, name=name)
    finally:
        reset_accelerate_state()


def _teacher(folder: Path) -> Path:
    from contrastive.nn import create_encoder

    torch.manual_seed(0)
    enc = create_encoder("small_cnn", widths=(8, 16, 16, 32))
    path = folder / "teacher.pt"
    torch.save({"encoder": "small_cnn", "state_dict": enc.state_dict(),
                "encoder_kwargs": {"widths": [8, 16, 16, 32]}}, path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 2-step run per recipe (a checkpoint at step 2) and the arguments that resume it."""
    base = tmp_path_factory.mktemp("safe_resume")
    runs = {}
    out = base / "moco"
    _run("moco_cifar", [*MOCO, "--max-steps", "2", "--output-dir", str(out)])
    runs["moco_cifar"] = (out, MOCO)
    argv = [*DISTILL, "--teacher-checkpoint", str(_teacher(base))]
    out = base / "distill"
    _run("distill_cosnce", [*argv, "--max-steps", "2", "--output-dir", str(out)])
    runs["distill_cosnce"] = (out, argv)
    return runs


class _Plant:
    """Unpickling this creates ``path`` (a stand-in for any code an attacker would run)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').close()",))


def _payload(marker: Path) -> bytes:
    payload = pickle.dumps({"state": _Plant(marker), "step": 2}, protocol=2)
    pickle.loads(payload)  # positive control: a plain unpickler runs it
    assert marker.exists(), "the planted payload does not run under pickle: the test cannot fail"
    marker.unlink()
    return payload


def _plant(run_dir: Path, rel: str, payload: bytes) -> None:
    target = run_dir / rel
    target.write_bytes(payload)
    meta_path = target.parent / "meta.json"
    if target.name != "meta.json" and meta_path.is_file():  # a checkpoint file: fix its entry
        meta = json.loads(meta_path.read_text())
        files = meta.get("files", {})
        if target.name in files:
            files[target.name] = {"bytes": len(payload),
                                  "sha256": hashlib.sha256(payload).hexdigest()}
            meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize("recipe", ["moco_cifar", "distill_cosnce"])
def test_planted_pickle_in_any_file_never_runs(recipe, trained, tmp_path):
    src, argv = trained[recipe]
    files = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    ckpt = [p for p in (src / "checkpoints").iterdir()]
    assert [p.name for p in ckpt] == ["step_00000002"]
    in_ckpt = {f for f in files if f.startswith("checkpoints/")}
    marker = tmp_path / "marker"
    payload = _payload(marker)
    for rel in files:
        out = tmp_path / rel.replace("/", "_")
        shutil.copytree(src, out)
        _plant(out, rel, payload)
        refusal = error = None
        try:  # one more step to train: everything a resume reads is read
            _run(recipe, [*argv, "--max-steps", "3", "--output-dir", str(out), "--resume", "auto"])
        except SystemExit as e:
            refusal = str(e.code)
        except Exception as e:  # noqa: BLE001 - reported below, after the marker check
            error = e
        assert not marker.exists(), f"a pickle planted in {rel} ran when resuming"
        assert error is None, f"{rel}: the resume failed with a traceback: {error!r}"
        if rel in in_ckpt:  # read by the resume: refused, in one line naming it
            assert refusal is not None, f"{rel} holds a pickle and the resume accepted it"
            assert "\n" not in refusal and str(out / rel) in refusal, refusal
        elif refusal is not None:
            assert "\n" not in refusal and rel in refusal, refusal
    # the loop covered the whole checkpoint (a file added later is covered without a change here)
    assert CHECKPOINT_FILES <= {Path(f).name for f in in_ckpt}, in_ckpt


def test_planted_pickle_in_the_teacher_never_runs(trained, tmp_path):
    """distill_cosnce's resume also reads --teacher-checkpoint (torch.load weights_only=True)."""
    src, argv = trained["distill_cosnce"]
    out = tmp_path / "run"
    shutil.copytree(src, out)
    marker = tmp_path / "marker"
    teacher = tmp_path / "teacher.pt"
    teacher.write_bytes(_payload(marker))
    argv = [a if not a.endswith("teacher.pt") else str(teacher) for a in argv]
    with pytest.raises(SystemExit, match="weights_only") as e:  # the method's refusal: one line
        _run("distill_cosnce", [*argv, "--max-steps", "3", "--output-dir", str(out),
                                "--resume", "auto"])
    assert str(teacher) in str(e.value) and not marker.exists()
