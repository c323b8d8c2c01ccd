"""``--init``: a run starts its backbone, and every copy its method makes of it, from given
weights (issue 49, step 1). The loader itself is tested in tests/eval/test_init.py; here: the
weights reach the backbone and the momentum copy at step 0, ``config.json`` records the source
and its sha256, bad input is one line before the run folder, and a resume is not re-initialised.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contrastive.engine import ImageConfig, run, train
from contrastive.nn import create_encoder
from contrastive.nn.encoders import starting_weights

EFFICIENTNET = Path(__file__).resolve().parents[3] / "shared" / "data" / "image-models" / \
    "efficientnet_lite0" / "model.safetensors"


@dataclasses.dataclass
class _Cfg(ImageConfig):
    data: str = "shapes:n=32,n_test=16,size=16"
    encoder: str = "small_cnn"
    image_size: int = 16
    batch_size: int = 8
    steps: int = 2
    epochs: int = 1
    lr: float = 0.0  # the weights stay those loaded: step 0 can be read after the run
    num_workers: int = 0
    progress: bool = False
    mixed_precision: str = "no"
    save_every_steps: int = 1
    save_every_epochs: int = 0


def _moco(cfg, data):
    from contrastive.methods import MoCo

    return MoCo(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), version=2, dim=16,
                mlp_hidden=32, queue_size=32)


def _pipeline(cfg):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size)


def _weights(tmp_path: Path, name: str = "small_cnn", seed: int = 7) -> Path:
    """A state dict of a fresh ``name`` (another seed than the run's) as a safetensors file."""
    torch.manual_seed(seed)
    net = create_encoder(name)
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return path


def _model_state(result) -> dict[str, torch.Tensor]:
    """The method's tensors in the run's last checkpoint."""
    return load_file(str(result.checkpoint / "model.safetensors"))


def _params_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """The keys of learnt tensors (batch-norm statistics move in train mode even at lr 0)."""
    return [k for k in state if "running" not in k and "num_batches" not in k]


def test_every_backbone_created_inside_the_block_starts_from_the_weights():
    torch.manual_seed(1)
    source = create_encoder("small_cnn").state_dict()
    with starting_weights("small_cnn", lambda net: net.load_state_dict(source)) as start:
        first, other = create_encoder("small_cnn"), create_encoder("cifar_resnet18")
        copied = copy.deepcopy(first)
    outside = create_encoder("small_cnn")
    assert start.loaded == 1  # the other name is not touched
    for net in (first, copied):
        assert all(torch.equal(v, source[k]) for k, v in net.state_dict().items())
    first_key = _params_keys(source)[0]
    assert not torch.equal(outside.state_dict()[first_key], source[first_key])  # block ended
    assert not any(torch.equal(v, source.get(k, v.new_zeros(0)))
                   for k, v in other.state_dict().items() if v.numel() > 1)


def test_the_backbone_and_its_momentum_copy_start_from_the_file(tmp_path, fresh_accelerate):
    path = _weights(tmp_path)
    file = load_file(str(path))
    result = train(_Cfg(output_dir=str(tmp_path / "run"), init=str(path)), _moco, _pipeline,
                   recipe="t")
    state = _model_state(result)
    for prefix in ("encoder.", "key_net.module.0."):
        got = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        assert set(_params_keys(file)) <= set(got), prefix
        for k in _params_keys(file):
            assert torch.equal(got[k], file[k]), (prefix, k)  # lr 0, EMA of equal weights
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["init"] == str(path)
    assert config["resolved"]["init"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("method", ["DINO", "BYOL"])
def test_a_teacher_and_a_target_start_from_the_file(tmp_path, method):
    """DINO's teacher and BYOL's target (momentum copies of the backbone and its head), built
    under --init, start bit for bit equal to the file, as the backbone does (step 0)."""
    from contrastive import methods
    from contrastive.engine.kits.init import BackboneInit

    path = _weights(tmp_path)
    file = load_file(str(path))
    init = BackboneInit()
    init.resolve(_Cfg(init=str(path)))
    small = {"DINO": dict(out_dim=32, hidden_dim=16, bottleneck_dim=8),
             "BYOL": dict(dim=8, mlp_hidden=16)}[method]
    with init.building("small_cnn"):
        built = getattr(methods, method)(encoder="small_cnn", **small)
    state = built.state_dict()
    first = _params_keys(file)[0]
    prefixes = [k[:-len(first)] for k in state if k.endswith("." + first) or k == first]
    copy_of = {"DINO": "teacher.", "BYOL": "target."}[method]
    assert "encoder." in prefixes and any(p.startswith(copy_of) for p in prefixes), prefixes
    for prefix in prefixes:
        assert all(torch.equal(state[prefix + k], file[k]) for k in file), prefix


@pytest.mark.parametrize("what", ["missing", "wrong_keys"])
def test_bad_init_is_one_line_before_the_run_folder(tmp_path, capsys, fresh_accelerate, what):
    path = tmp_path / "nothing.safetensors" if what == "missing" else \
        _weights(tmp_path, "cifar_resnet18")
    argv = ["--init", str(path), "--output-dir", str(tmp_path / "run")]
    if what == "missing":
        with pytest.raises(SystemExit) as stop:
            run(_Cfg, _moco, _pipeline, argv=argv, name="t")
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("t.py: error: --init "), err
        assert not (tmp_path / "run").exists()
    else:  # readable, but nothing fits the backbone: refused when it is built, in one line
        with pytest.raises(SystemExit) as stop:
            run(_Cfg, _moco, _pipeline, argv=argv, name="t")
        assert str(stop.value.code).startswith("t: error: --init "), stop.value.code
        assert "\n" not in str(stop.value.code)


def test_a_resumed_run_is_not_reinitialised(tmp_path, fresh_accelerate):
    """Stopped at step 1 and resumed, a run with --init and a learning rate ends equal to the
    same run without the stop: the resume continues from the checkpoint, not from the file."""
    path = _weights(tmp_path)
    full = train(_Cfg(output_dir=str(tmp_path / "full"), init=str(path), lr=0.05), _moco,
                 _pipeline, recipe="t")
    train(_Cfg(output_dir=str(tmp_path / "cut"), init=str(path), lr=0.05, max_steps=1), _moco,
          _pipeline, recipe="t")
    cut = train(_Cfg(output_dir=str(tmp_path / "cut"), init=str(path), lr=0.05,
                     resume="auto"), _moco, _pipeline, recipe="t")
    a, b = _model_state(full), _model_state(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "pretrained-weights.md"


def _tutorial_command() -> list[str]:
    """The first command of the tutorial "Start from pretrained weights" (its --init command,
    which tests/docs/test_tutorials.py leaves to this test: it downloads timm's weights)."""
    import re
    import shlex

    block = re.search(r"```bash\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert block is not None, f"{TUTORIAL.name} lost its --init command"
    return shlex.split(block.group(1).strip())


@pytest.mark.skipif(not EFFICIENTNET.is_file(), reason=f"{EFFICIENTNET} is absent: the shared "
                    "data's real EfficientNet-Lite0 (../shared/data/README.md)")
def test_the_tutorial_command_with_the_real_efficientnet_file(tmp_path, fresh_accelerate):
    """The tutorial's --init command, run as written but with the local EfficientNet-Lite0 file for
    timm:resnet50 (no download here), tiny data and one step at lr 0: every learnt tensor of
    the file but the classifier is the backbone's, and the views take its normalisation."""
    import importlib.util
    import sys

    from PIL import Image

    from contrastive.records import EncoderRecord

    cmd = _tutorial_command()
    assert cmd[:2] == ["python", "recipes/moco_r50.py"]
    swap = {"/path/to/your/images": str(tmp_path / "images"), "timm:resnet50": None,
            "runs/moco_continued": str(tmp_path / "run")}
    for i in range(4):  # a small image folder: train/<class>/*.png
        folder = tmp_path / "images" / "train" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 40), (60 * i, 100, 200 - 40 * i)).save(folder / f"{i}.png")
    argv: list[str] = []
    for arg in cmd[2:]:
        value = swap.get(arg, arg)
        if value is None:  # the encoder and its weights: the local file
            value = "timm:efficientnet_lite0" if argv[-1] == "--encoder" else str(EFFICIENTNET)
        argv.append(value)
    argv += ["--init-mean", "0.5", "0.5", "0.5", "--init-std", "0.5", "0.5", "0.5",
             "--image-size", "32", "--batch-size", "4", "--steps", "1", "--lr", "0",
             "--num-workers", "0", "--progress", "false", "--mixed-precision", "no",
             "--queue-size", "8"]
    path = Path(__file__).resolve().parents[2] / "recipes" / "moco_r50.py"
    spec = importlib.util.spec_from_file_location("tutorial_moco_r50", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    result = run(mod.MoCoV2R50, mod.build_method, mod.build_pipeline, argv=argv, name="moco_r50")
    file, state = load_file(str(EFFICIENTNET)), _model_state(result)
    loaded = [k for k in _params_keys(file) if f"encoder.{k}" in state]
    backbone = [k for k in _params_keys(file) if not k.startswith("classifier.")]
    assert loaded == backbone and len(loaded) == 147  # every learnt tensor but the classifier
    assert all(torch.equal(state[f"encoder.{k}"], file[k]) for k in loaded)
    record = EncoderRecord.load(tmp_path / "run" / "encoder.pt")
    assert tuple(record.mean) == (0.5, 0.5, 0.5) and tuple(record.std) == (0.5, 0.5, 0.5)


def test_the_views_and_encoder_pt_take_the_init_normalisation(tmp_path, fresh_accelerate):
    """--init-mean/--init-std (or the source's record) normalise the views, the kNN monitor's
    and encoder.pt's (what the eval CLIs read); a file that records none keeps the recipe's."""
    from contrastive.records import EncoderRecord

    path = _weights(tmp_path)
    seen = {}

    def build(cfg, data):
        seen["pipeline"] = data.pipeline
        return _moco(cfg, data)

    half = (0.5, 0.5, 0.5)
    train(_Cfg(output_dir=str(tmp_path / "a"), init=str(path), init_mean=half, init_std=half,
               steps=1), build, _pipeline, recipe="t")
    record = EncoderRecord.load(tmp_path / "a" / "encoder.pt")
    assert tuple(record.mean) == half and tuple(record.std) == half
    assert seen["pipeline"].mean == half and seen["pipeline"].std == half
    train(_Cfg(output_dir=str(tmp_path / "b"), init=str(path), steps=1), build, _pipeline,
          recipe="t")
    recipe_norm = _pipeline(_Cfg())
    record = EncoderRecord.load(tmp_path / "b" / "encoder.pt")
    assert tuple(record.mean) == recipe_norm.mean and tuple(record.std) == recipe_norm.std
