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


@pytest.mark.skipif(not EFFICIENTNET.is_file(), reason=f"{EFFICIENTNET} is absent: the shared "
                    "data's real EfficientNet-Lite0 (../shared/data/README.md)")
def test_the_real_efficientnet_file_reaches_the_backbone(tmp_path, fresh_accelerate):
    file = load_file(str(EFFICIENTNET))
    result = train(_Cfg(output_dir=str(tmp_path / "run"), encoder="timm:efficientnet_lite0",
                        image_size=32, data="shapes:n=16,n_test=8,size=32", steps=1,
                        init=str(EFFICIENTNET), init_mean=(0.5, 0.5, 0.5),
                        init_std=(0.5, 0.5, 0.5)), _moco, _pipeline, recipe="t")
    state = _model_state(result)
    loaded = [k for k in _params_keys(file) if f"encoder.{k}" in state]
    backbone = [k for k in _params_keys(file) if not k.startswith("classifier.")]
    assert loaded == backbone and len(loaded) == 147  # every learnt tensor but the classifier
    assert all(torch.equal(state[f"encoder.{k}"], file[k]) for k in loaded)
