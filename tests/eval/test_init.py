"""``--init`` weights: resolving a source (files, checkpoint dicts, published names) and loading
it into a backbone, bit for bit, with one-line reports and errors."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from contrastive.eval.init import InitError, load_into, resolve_init

LITE0 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "image-models" / "efficientnet_lite0"


class Tiny(nn.Module):
    """A backbone (conv, BatchNorm) and, optionally, a classifier ``fc``."""

    def __init__(self, width: int = 4, head: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, 2) if head else None


def tiny_state(seed: int = 0, width: int = 4) -> dict[str, torch.Tensor]:
    """A Tiny backbone's state with every tensor (running stats too) moved off its init."""
    g = torch.Generator().manual_seed(seed)
    return {k: (v + torch.randn(v.shape, generator=g)) if v.is_floating_point() else v + 3
            for k, v in Tiny(width).state_dict().items()}


def assert_loaded(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    got = module.state_dict()
    for k, v in state.items():
        assert torch.equal(got[k], v), k


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the real pretrained file -------------------------------------------------------------------


def test_real_efficientnet_lite0_loads_bit_for_bit_and_equals_timm(caplog):
    if not (LITE0 / "model.safetensors").is_file():
        pytest.skip(f"the pretrained EfficientNet-Lite0 file is not at {LITE0} (../shared/data)")
    import timm

    from contrastive.nn import create_encoder

    file = LITE0 / "model.safetensors"
    init = resolve_init(str(file), mean=[0.5] * 3, std=[0.5] * 3)
    assert init.sha256 == sha(file) and init.mean == init.std == (0.5, 0.5, 0.5)
    backbone = create_encoder("timm:efficientnet_lite0")
    with caplog.at_level("INFO", logger="contrastive.eval.init"):
        report = load_into(backbone, init)
    on_disk = load_file(str(file))
    heads = [k for k in on_disk if k.startswith("classifier.")]
    assert report.loaded == len(on_disk) - len(heads) and sorted(report.unused) == sorted(heads)
    assert not report.new and [r.message for r in caplog.records] == [report.line()]
    assert_loaded(backbone, {k: v for k, v in on_disk.items() if k not in heads})
    # timm's own loader, from the same file, gives the same features
    reference = timm.create_model("efficientnet_lite0", pretrained=True, num_classes=0,
                                  pretrained_cfg_overlay=dict(file=str(file)))
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(backbone.eval()(x), reference.eval()(x))


# -- where the backbone is in a file ------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["module.", "backbone.", "encoder.", "model.", "_orig_mod.module."])
def test_a_prefix_every_key_carries_is_stripped(tmp_path, wrapper):
    state = tiny_state()
    torch.save({wrapper + k: v for k, v in state.items()}, tmp_path / "w.pt")
    init = resolve_init(tmp_path / "w.pt")
    assert init.stripped == wrapper and set(init.state_dict) == set(state)
    module = Tiny()
    report = load_into(module, init)
    assert report.loaded == len(state) and report.found_under == "" and not report.unused
    assert_loaded(module, state)


class Holder(nn.Module):
    """A module whose own backbone keys start with ``encoder.``, beside a new head."""

    def __init__(self):
        super().__init__()
        self.encoder = Tiny()
        self.fc = nn.Linear(4, 2)


def test_a_stripped_prefix_the_module_itself_uses_still_loads(tmp_path):
    state = tiny_state(seed=7)
    torch.save({f"encoder.{k}": v for k, v in state.items()}, tmp_path / "w.pt")
    init = resolve_init(tmp_path / "w.pt")
    module = Holder()
    report = load_into(module, init)
    assert init.stripped == "encoder." and report.new == ["fc.weight", "fc.bias"]
    assert_loaded(module.encoder, state)
    assert "stripped: every key" not in report.line()
    plain = Tiny()
    assert "'encoder.' stripped: every key carries it" in load_into(plain, init).line()


def test_lightning_checkpoint_finds_the_backbone_by_its_keys(tmp_path):
    state = tiny_state(seed=1)
    nested = {f"backbone.{k}": v for k, v in state.items()}
    nested |= {f"momentum_backbone.{k}": torch.zeros_like(v) for k, v in state.items()}
    nested |= {"projection_head.weight": torch.ones(2, 4)}
    torch.save({"epoch": 3, "global_step": 30, "pytorch-lightning_version": "2.4.0",
                "state_dict": nested, "hyper_parameters": {"lr": 0.1}}, tmp_path / "last.ckpt")
    init = resolve_init(tmp_path / "last.ckpt")
    assert init.stripped == "" and "'state_dict'" in init.origin  # not every key is backbone.*
    module = Tiny()
    report = load_into(module, init)
    assert report.found_under == "backbone." and report.loaded == len(state)
    assert sorted(report.unused) == sorted(k for k in nested if not k.startswith("backbone."))
    assert_loaded(module, state)
    assert "found under 'backbone.'" in report.line()


def test_timm_checkpoint_dict_prefers_its_ema_weights(tmp_path):
    trained, ema = tiny_state(seed=2), tiny_state(seed=3)
    torch.save({"epoch": 9, "arch": "tiny", "state_dict": trained, "state_dict_ema": ema,
                "optimizer": {"state": {}}, "args": argparse.Namespace(lr=0.1, model="tiny")},
               tmp_path / "checkpoint-9.pth.tar")
    module = Tiny()
    load_into(module, resolve_init(tmp_path / "checkpoint-9.pth.tar"))
    assert_loaded(module, ema)  # timm's load_state_dict(use_ema=True) order


def test_torchvision_reference_checkpoint_and_a_new_head(tmp_path):
    state = tiny_state(seed=4)
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 5,
                "lr_scheduler": {}, "args": argparse.Namespace(model="tiny")}, tmp_path / "model_5.pth")
    module = Tiny(head=True)
    fc_before = {k: v.clone() for k, v in module.fc.state_dict().items()}
    report = load_into(module, resolve_init(tmp_path / "model_5.pth"))
    assert sorted(report.new) == ["fc.bias", "fc.weight"] and report.loaded == len(state)
    assert_loaded(module, state)
    assert_loaded(module.fc, fc_before)  # the head keeps its initialisation


def test_run_folder_brings_its_recorded_normalisation(tmp_path, caplog):
    from contrastive.records import EncoderRecord

    state = tiny_state(seed=6)
    source = Tiny()
    source.load_state_dict(state)
    (tmp_path / "run").mkdir()
    EncoderRecord.from_module(source, "tiny", mean=[0.1, 0.2, 0.3], std=[0.4, 0.5, 0.6]).save(
        tmp_path / "run" / "encoder.pt")
    init = resolve_init(tmp_path / "run")
    assert (init.kind, init.encoder, init.path) == ("encoder.pt", "tiny", tmp_path / "run" / "encoder.pt")
    assert init.mean == (0.1, 0.2, 0.3) and init.std == (0.4, 0.5, 0.6)
    assert init.norm_from == "recorded in the checkpoint" and init.sha256 == sha(init.path)
    module = Tiny()
    load_into(module, init)
    assert_loaded(module, state)
    with caplog.at_level("WARNING", logger="contrastive.eval.init"):
        given = resolve_init(tmp_path / "run", mean=[0.5], std=[0.5])
    assert given.mean == (0.5,) and given.norm_from.startswith("given") and "not (0.1, 0.2, 0.3)" in caplog.text
    assert resolve_init(tmp_path / "run" / "encoder.pt", mean=[0.1, 0.2, 0.3],
                        std=[0.4, 0.5, 0.6]).mean == init.mean


# -- one-line errors ----------------------------------------------------------------------------


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.startswith("--init ")
    return text


def test_wrong_shape_names_the_key_and_both_shapes(tmp_path):
    torch.save(tiny_state(width=4), tmp_path / "w.pt")
    with pytest.raises(InitError) as err:
        load_into(Tiny(width=8), resolve_init(tmp_path / "w.pt"))
    assert "conv.weight: checkpoint (4, 3, 3, 3) vs model (8, 3, 3, 3)" in one_line(err)


def test_wrong_key_set_is_one_line(tmp_path):
    torch.save({"layer.weight": torch.zeros(2, 2), "layer.bias": torch.zeros(2)}, tmp_path / "w.pt")
    with pytest.raises(InitError, match="none of its 2 tensors matches") as err:
        load_into(Tiny(), resolve_init(tmp_path / "w.pt"))
    assert "layer.bias" in one_line(err) and "conv.weight" in str(err.value)


def test_wrong_or_missing_file_is_one_line(tmp_path):
    (tmp_path / "notes.pt").write_text("not weights\nat all\n")
    with pytest.raises(InitError, match="not a weights file") as err:
        resolve_init(tmp_path / "notes.pt")
    one_line(err)
    (tmp_path / "broken.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(InitError, match="not a readable safetensors") as err:
        resolve_init(tmp_path / "broken.safetensors")
    one_line(err)
    with pytest.raises(InitError, match="not found") as err:
        resolve_init(tmp_path / "absent.pt")
    one_line(err)
    with pytest.raises(InitError, match="both --init-mean and --init-std"):
        resolve_init(tmp_path / "absent.pt", mean=[0.5] * 3)


class _Planted:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (open, (str(self.sentinel), "w"))  # would create the file if unpickled


def test_planted_pickle_is_refused_unrun(tmp_path):
    sentinel = tmp_path / "ran"
    torch.save({"conv.weight": torch.zeros(1), "x": _Planted(sentinel)}, tmp_path / "evil.pt")
    with pytest.raises(InitError, match="refused to load") as err:
        resolve_init(tmp_path / "evil.pt")
    assert "io.open" in one_line(err) and not sentinel.exists()


# -- published weights of a model name ----------------------------------------------------------


def test_timm_name_downloads_through_the_hub_and_takes_timm_normalisation(tmp_path, monkeypatch):
    import huggingface_hub
    from timm.models import get_pretrained_cfg

    file = tmp_path / "model.safetensors"
    state = tiny_state(seed=5)
    save_file(state, str(file))
    calls = []

    def fake_download(repo, filename, revision=None):
        calls.append((repo, filename))
        return str(file)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    init = resolve_init("timm:efficientnet_lite0")
    cfg = get_pretrained_cfg("efficientnet_lite0")
    assert calls == [(cfg.hf_hub_id, "model.safetensors")]
    assert init.mean == tuple(cfg.mean) and init.std == tuple(cfg.std) and "pretrained_cfg" in init.norm_from
    assert init.sha256 == sha(file) and init.kind == "timm" and init.encoder == "timm:efficientnet_lite0"
    module = Tiny()
    load_into(module, init)
    assert_loaded(module, state)
    described = init.describe()
    assert described["sha256"] == init.sha256 and described["mean"] == list(cfg.mean)


def test_torchvision_name_downloads_into_the_hub_cache_once(tmp_path, monkeypatch):
    import torchvision.models as tvm

    weights = tvm.get_model_weights("resnet18").DEFAULT
    state, calls = tiny_state(seed=8), []

    def fake_download(url, dst, **kwargs):
        calls.append(url)
        torch.save(state, dst)

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", fake_download)
    init = resolve_init("torchvision:resnet18")
    assert calls == [weights.url] and init.path == tmp_path / "hub" / "checkpoints" / Path(weights.url).name
    preset = weights.transforms()
    assert init.mean == tuple(preset.mean) and init.std == tuple(preset.std) and init.sha256 == sha(init.path)
    assert resolve_init("torchvision:resnet18").sha256 == init.sha256 and len(calls) == 1  # cached


def test_offline_names_the_local_file_form_in_one_line(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError
    from timm.models import get_pretrained_cfg

    def offline(*args, **kwargs):
        raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache and\n"
                                      "outgoing traffic has been disabled.")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(InitError) as err:
        resolve_init("timm:efficientnet_lite0")
    mean = ",".join(f"{v:g}" for v in get_pretrained_cfg("efficientnet_lite0").mean)
    assert f"--init FILE --init-mean {mean} --init-std" in one_line(err)
    assert "LocalEntryNotFoundError" in str(err.value)

    def no_network(url, dst, **kwargs):
        raise OSError(f"<urlopen error [Errno -3] Temporary failure in name resolution> {url}")

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    with pytest.raises(InitError, match="--init FILE --init-mean 0.485,0.456,0.406") as err:
        resolve_init("torchvision:resnet18")
    one_line(err)


def test_unknown_names_are_one_line():
    with pytest.raises(InitError, match="timm has no model") as err:
        resolve_init("timm:no_such_net")
    one_line(err)
    with pytest.raises(InitError, match="torchvision has no weights") as err:
        resolve_init("torchvision:no_such_net")
    one_line(err)


def test_one_normalisation_rule_for_every_command():
    """Given > recorded with the weights > a pretrained model's published > ImageNet's; the eval
    CLIs, contrastive-embed and the ONNX export all ask LoadedEncoder.normalisation."""
    from contrastive.augment import IMAGENET_MEAN, IMAGENET_STD
    from contrastive.eval.checkpoint import LoadedEncoder
    from contrastive.eval.init import choose_normalisation, published_normalisation

    given, recorded = ((0.1, 0.2, 0.3), (0.4, 0.5, 0.6)), ((0.7,) * 3, (0.8,) * 3)
    published = tuple(tuple(float(v) for v in t) for t in published_normalisation("timm:tf_efficientnet_lite0"))
    assert published != (tuple(IMAGENET_MEAN), tuple(IMAGENET_STD))  # the case tells them apart
    assert choose_normalisation(*given, recorded=recorded, published="timm:tf_efficientnet_lite0")[:2] == given
    assert choose_normalisation(None, None, recorded=recorded, recorded_from="x")[:2] + ("x",) == (*recorded, "x")
    assert choose_normalisation(None, None, published="timm:tf_efficientnet_lite0")[:2] == published
    assert choose_normalisation(None, None)[:2] == (tuple(IMAGENET_MEAN), tuple(IMAGENET_STD))
    with pytest.raises(ValueError, match="give both --mean and --std"):
        choose_normalisation((0.5, 0.5, 0.5), None)
    net = nn.Linear(2, 2)
    pretrained = LoadedEncoder(net, "timm:tf_efficientnet_lite0", "pretrained", None, "")
    assert pretrained.normalisation()[:2] == published
    trained = LoadedEncoder(net, "timm:tf_efficientnet_lite0", "encoder", None, "",
                            settings={"mean": list(recorded[0]), "std": list(recorded[1])})
    assert trained.normalisation()[:2] == recorded
    assert LoadedEncoder(net, "small_cnn", "state_dict", None, "").normalisation()[2].startswith("not recorded")
