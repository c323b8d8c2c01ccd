"""Loading checkpoints into our encoders (contrastive.nn.create_encoder), strictly."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from torch import nn

from contrastive.eval.checkpoint import CheckpointMismatchError, load_encoder
from contrastive.eval.export import export_state_dict

create_encoder = pytest.importorskip("contrastive.nn").create_encoder


def save_encoder_pt(path, name, encoder):
    torch.save({"encoder": name, "state_dict": encoder.state_dict()}, path)
    return path


def perturb(module, seed=0):
    """Move every tensor away from its init so that a missed key shows in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.state_dict().values():
            if t.is_floating_point():
                t.add_(0.01 * torch.randn(t.shape, generator=g))
    return module


def test_encoder_pt_round_trip_same_outputs(tmp_path):
    torch.manual_seed(0)
    enc = perturb(create_encoder("cifar_resnet18")).eval()
    path = save_encoder_pt(tmp_path / "encoder.pt", "cifar_resnet18", enc)
    loaded = load_encoder(path)
    assert loaded.name == "cifar_resnet18" and loaded.kind == "encoder.pt" and len(loaded.sha256) == 64
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.encoder(x), enc(x))


def test_export_of_our_timm_encoder_gives_the_same_outputs(tmp_path):
    torch.manual_seed(0)
    enc = perturb(create_encoder("timm:resnet18")).eval()
    path = save_encoder_pt(tmp_path / "encoder.pt", "timm:resnet18", enc)
    state, model = export_state_dict(path, "timm")
    dst = timm.create_model(model, num_classes=0)
    dst.load_state_dict(state, strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(dst.eval()(x), enc(x), atol=1e-6)


def test_run_folder_with_config_and_no_encoder_pt(tmp_path):
    from safetensors.torch import save_file

    enc = perturb(create_encoder("small_cnn")).eval()
    head = nn.Linear(enc.num_features, 8)
    state = {f"encoder.{k}": v for k, v in enc.state_dict().items()}
    state |= {f"momentum_encoder.{k}": torch.zeros_like(v) for k, v in enc.state_dict().items()}
    state |= {f"head.{k}": v for k, v in head.state_dict().items()}
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000010"
    ckpt.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(ckpt / "model.safetensors"))
    (ckpt / "meta.json").write_text("{}")
    (tmp_path / "run" / "config.json").write_text(json.dumps({"encoder": "small_cnn", "image_size": 32}))
    loaded = load_encoder(tmp_path / "run")
    assert loaded.kind == "accelerate"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.encoder(x), enc(x))
    assert any(k.startswith("momentum_encoder.") for k in loaded.ignored)


def test_other_architecture_is_a_clear_error(tmp_path):
    path = save_encoder_pt(tmp_path / "encoder.pt", "small_cnn", create_encoder("small_cnn"))
    with pytest.raises(CheckpointMismatchError, match="encoder 'cifar_resnet18'") as err:
        load_encoder(path, encoder="cifar_resnet18")
    assert "another architecture" in str(err.value) and "small_cnn" in str(err.value)
    r50 = save_encoder_pt(tmp_path / "r50.pt", "cifar_resnet50", create_encoder("cifar_resnet50"))
    with pytest.raises(CheckpointMismatchError, match="of another shape"):
        load_encoder(r50, encoder="cifar_resnet18")


def test_official_moco_layout_into_our_torchvision_encoder(tmp_path):
    import torchvision

    q = torchvision.models.resnet18()
    q.fc = nn.Sequential(nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 16))
    perturb(q)
    state = {f"module.encoder_q.{k}": v for k, v in q.state_dict().items()}
    state |= {f"module.encoder_k.{k}": torch.zeros_like(v) for k, v in q.state_dict().items()}
    torch.save({"arch": "resnet18", "state_dict": state}, tmp_path / "moco.pth.tar")
    loaded = load_encoder(tmp_path / "moco.pth.tar")
    assert loaded.name == "torchvision:resnet18" and loaded.kind == "moco"
    q.fc = nn.Identity()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(loaded.encoder(x), q.eval()(x), atol=1e-6)


def test_random_baseline_and_missing_name(tmp_path):
    assert load_encoder("random", encoder="small_cnn").kind == "random"
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="--encoder NAME"):
        load_encoder(tmp_path / "plain.pt")
