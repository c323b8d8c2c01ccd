"""The GPU options' CPU-side logic: how ``--channels-last`` resolves when unset and what
``--compile`` compiles. Their effect on a GPU is checked in ``tests/gpu/test_cuda.py``."""

from __future__ import annotations

import dataclasses
import json

import torch
from torch import nn

from contrastive.engine import ImageConfig, train
from contrastive.engine.kits.image import default_channels_last
from contrastive.engine.setup import compile_encoders


@dataclasses.dataclass
class _Cfg(ImageConfig):
    data: str = "synthetic:n=32,size=16"
    encoder: str = "small_cnn"
    image_size: int = 16
    batch_size: int = 16
    epochs: int = 1
    num_workers: int = 0
    progress: bool = False
    mixed_precision: str = "no"
    save_every_steps: int = 0
    save_every_epochs: int = 0


def _moco(cfg=None, data=None, *, split_bn: int = 0):
    from contrastive.methods import MoCo

    return MoCo(encoder="small_cnn", version=2, dim=16, mlp_hidden=32, queue_size=64,
                split_bn=split_bn)


def test_channels_last_defaults_to_on_for_cuda_without_split_bn():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert default_channels_last(_moco(), cuda) is True
    assert default_channels_last(_moco(), cpu) is False
    assert default_channels_last(_moco(split_bn=8), cuda) is False
    assert default_channels_last(_moco(split_bn=1), cuda) is True


def test_unset_channels_last_is_resolved_and_recorded(tmp_path, fresh_accelerate):
    from contrastive.augment import get_pipeline

    train(_Cfg(output_dir=str(tmp_path / "run")), _moco,
          lambda c: get_pipeline("mocov2", image_size=c.image_size), recipe="t")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["channels_last"] is False  # CPU: resolved, not null


def test_compile_covers_the_backbone_and_its_momentum_copy(monkeypatch):
    compiled = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, *a, **k: compiled.append(self))
    method = _moco()
    names = compile_encoders(method)
    assert names == ["encoder", "key_net.module"]
    assert compiled[0] is method.encoder and compiled[1] is method.key_net.module
    assert compiled[1][0] is not method.encoder  # the key path's own copy
