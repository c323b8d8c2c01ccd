"""Export to timm / torchvision key names and reading every checkpoint layout we accept."""

from __future__ import annotations

import json

import pytest
import timm
import torch
import torchvision
from torch import nn

from contrastive.eval.checkpoint import CheckpointMismatchError, align_state_dict, read_checkpoint
from contrastive.eval.export import build_target, export_state_dict, save_export


class Wrapped(nn.Module):
    """A backbone held as ``.model`` (how an encoder registry may wrap a library model)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)


def timm_backbone(name, seed=0):
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, num_classes=0).eval()


def torchvision_backbone(name, seed=0):
    torch.manual_seed(seed)
    net = torchvision.models.get_model(name, weights=None)
    net.fc = nn.Identity()
    return net.eval()


def randomise_bn(module):
    """Non-trivial BN statistics so that a wrong mapping shows in the outputs."""
    g = torch.Generator().manual_seed(123)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def write_encoder_pt(tmp_path, encoder_name, module):
    path = tmp_path / "encoder.pt"
    torch.save({"encoder": encoder_name, "state_dict": module.state_dict()}, path)
    return path


@pytest.mark.parametrize(
    "arch,src_lib", [("resnet18", "timm"), ("resnet18", "torchvision"), ("resnet50", "timm")]
)
@pytest.mark.parametrize("fmt", ["timm", "torchvision"])
def test_resnet_round_trip(tmp_path, arch, src_lib, fmt):
    src = Wrapped(timm_backbone(arch) if src_lib == "timm" else torchvision_backbone(arch))
    randomise_bn(src)
    ckpt = write_encoder_pt(tmp_path, f"{src_lib}:{arch}", src)
    state, model = export_state_dict(ckpt, fmt)
    assert model == arch
    out = save_export(state, tmp_path / "r.pth")
    loaded = torch.load(out, weights_only=True)

    headless = timm_backbone(arch, seed=1) if fmt == "timm" else torchvision_backbone(arch, seed=1)
    headless.load_state_dict(loaded, strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(headless.eval()(x), src.eval()(x), atol=1e-5)

    full = timm.create_model(arch, pretrained=False) if fmt == "timm" else torchvision.models.get_model(arch)
    missing, unexpected = full.load_state_dict(loaded, strict=False)
    assert sorted(missing) == ["fc.bias", "fc.weight"] and unexpected == []


def test_vit_timm_round_trip(tmp_path):
    src = Wrapped(timm_backbone("vit_tiny_patch16_224"))
    ckpt = write_encoder_pt(tmp_path, "timm:vit_tiny_patch16_224", src)
    state, _ = export_state_dict(ckpt, "timm")
    save_export(state, tmp_path / "vit.safetensors")
    from safetensors.torch import load_file

    loaded = load_file(str(tmp_path / "vit.safetensors"))
    dst = timm_backbone("vit_tiny_patch16_224", seed=1)
    dst.load_state_dict(loaded, strict=True)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(dst(x), src(x), atol=1e-5)
    missing, unexpected = timm.create_model("vit_tiny_patch16_224").load_state_dict(loaded, strict=False)
    assert sorted(missing) == ["head.bias", "head.weight"] and unexpected == []


def mlp_head(d):
    return nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 8))


def test_official_moco_v2_checkpoint_picks_the_query_encoder(tmp_path):
    q, k = torchvision_backbone("resnet18", 0), torchvision_backbone("resnet18", 1)
    q.fc, k.fc = mlp_head(512), mlp_head(512)
    state = {f"module.encoder_q.{n}": v for n, v in q.state_dict().items()}
    state |= {f"module.encoder_k.{n}": v for n, v in k.state_dict().items()}
    state |= {"module.queue": torch.randn(8, 16), "module.queue_ptr": torch.zeros(1, dtype=torch.long)}
    path = tmp_path / "checkpoint_0199.pth.tar"
    torch.save({"epoch": 200, "arch": "resnet18", "state_dict": state, "optimizer": {"state": {}}}, path)
    raw = read_checkpoint(path)
    assert (raw.kind, raw.encoder_name) == ("moco", "torchvision:resnet18")
    exported, _ = export_state_dict(path, "torchvision")
    for n, v in exported.items():
        assert torch.equal(v, q.state_dict()[n]), n


def test_official_moco_v3_checkpoint(tmp_path):
    base, mom = torchvision_backbone("resnet18", 0), torchvision_backbone("resnet18", 1)
    base.fc, mom.fc = mlp_head(512), mlp_head(512)
    state = {f"module.base_encoder.{n}": v for n, v in base.state_dict().items()}
    state |= {f"module.momentum_encoder.{n}": v for n, v in mom.state_dict().items()}
    state |= {f"module.predictor.{n}": v for n, v in mlp_head(8).state_dict().items()}
    path = tmp_path / "r-50-100ep.pth.tar"
    torch.save({"arch": "resnet18", "state_dict": state}, path)
    assert read_checkpoint(path).kind == "mocov3"
    exported, _ = export_state_dict(path, "timm")
    for n, v in exported.items():
        assert torch.equal(v, base.state_dict()[n]), n


def test_accelerate_checkpoint_folder_of_a_run(tmp_path):
    from safetensors.torch import save_file

    enc, mom = Wrapped(timm_backbone("resnet18", 0)), Wrapped(timm_backbone("resnet18", 1))
    state = {f"encoder.{n}": v for n, v in enc.state_dict().items()}
    state |= {f"momentum_encoder.{n}": v for n, v in mom.state_dict().items()}
    state |= {f"head.{n}": v for n, v in mlp_head(512).state_dict().items()}
    state["queue.keys"] = torch.randn(16, 8)
    run = tmp_path / "run"
    for step in (5, 12):  # the newest (12) must win
        folder = run / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True)
        s = state if step == 12 else {k: torch.zeros_like(v) for k, v in state.items()}
        save_file({k: v.contiguous() for k, v in s.items()}, str(folder / "model.safetensors"))
        (folder / "meta.json").write_text("{}")  # complete (the engine writes it last)
    partial = run / "checkpoints" / "step_13"  # a save cut short: no meta.json, never read
    partial.mkdir()
    save_file({k: torch.zeros_like(v).contiguous() for k, v in state.items()}, str(partial / "model.safetensors"))
    (run / "config.json").write_text(json.dumps({"method": "moco", "encoder": "timm:resnet18"}))
    raw = read_checkpoint(run)
    assert (raw.kind, raw.encoder_name) == ("accelerate", "timm:resnet18")
    assert raw.path.parent.name == "step_12"
    exported, _ = export_state_dict(run, "torchvision")
    for n, v in exported.items():
        assert torch.equal(v, enc.model.state_dict()[n]), n


def test_other_architecture_is_a_clear_error(tmp_path):
    cifar_like = timm_backbone("resnet18")
    cifar_like.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)  # the CIFAR 3x3 stem
    ckpt = write_encoder_pt(tmp_path, "timm:resnet18", Wrapped(cifar_like))
    with pytest.raises(CheckpointMismatchError, match=r"conv1.weight: checkpoint \(64, 3, 3, 3\)"):
        export_state_dict(ckpt, "torchvision")
    r50 = write_encoder_pt(tmp_path, "timm:resnet50", timm_backbone("resnet50"))
    with pytest.raises(CheckpointMismatchError, match="another architecture"):
        export_state_dict(r50, "timm", model="resnet18")
    ours = write_encoder_pt(tmp_path, "cifar_resnet18", cifar_like)
    with pytest.raises(ValueError, match="--model NAME"):
        export_state_dict(ours, "timm")


def test_unsafe_or_unknown_input_is_a_clear_error(tmp_path):
    pickled = tmp_path / "module.pt"
    torch.save(nn.Linear(2, 2), pickled)  # a pickled object, not tensors: refused
    with pytest.raises(ValueError, match="weights_only=True"):
        read_checkpoint(pickled)
    with pytest.raises(FileNotFoundError, match="not found"):
        read_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match="encoder.pt"):
        read_checkpoint(tmp_path / "empty_run")
    with pytest.raises(ValueError, match="--encoder"):
        read_checkpoint("random")
    with pytest.raises(ValueError, match="format"):
        build_target("onnx", "resnet18")


def test_align_ignores_heads_but_not_extra_backbone_layers():
    target = {"conv.weight": torch.zeros(2, 2), "bn.bias": torch.zeros(2)}
    source = {"module.encoder_q.conv.weight": torch.ones(2, 2), "module.encoder_q.bn.bias": torch.ones(2),
              "module.encoder_q.fc.0.weight": torch.ones(3, 2), "module.encoder_k.conv.weight": torch.zeros(2, 2),
              "module.encoder_k.bn.bias": torch.zeros(2)}
    res = align_state_dict(source, target)
    assert res.source_prefix == "module.encoder_q."
    assert res.unused_heads == ["module.encoder_q.fc.0.weight"] and not res.unused_backbone
    assert torch.equal(res.state_dict["conv.weight"], torch.ones(2, 2))
    res = align_state_dict({**source, "module.encoder_q.layer5.weight": torch.ones(1)}, target)
    assert res.unused_backbone == ["module.encoder_q.layer5.weight"]
