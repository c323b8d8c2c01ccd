"""Encoder registry: every registered encoder builds and trains, names fail helpfully,
external (timm / torchvision) encoders lose only their classifier, stage features."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import contrastive
from contrastive.nn import (
    EncoderArgumentError,
    UnknownEncoderError,
    create_encoder,
    list_encoders,
    register_encoder,
    split_classifier,
    stage_features,
)
from contrastive.nn.encoders import _REGISTRY

# A few small external models (keep the suite fast); kwargs make them cheap at 32 px.
EXTERNAL = {
    "timm:resnet18": {},
    "torchvision:resnet18": {},
    "timm:vit_tiny_patch16_224": {"img_size": 32},
}


def _forward_backward(enc: nn.Module, size: int = 16) -> torch.Tensor:
    x = torch.randn(2, 3, size, size)
    y = enc(x)
    assert y.shape == (2, enc.num_features)
    y.square().mean().backward()
    grads = [p.grad for p in enc.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    return y


TEXT_ENCODERS = {"bert"}  # take token ids, not images: tests/text/test_encoders.py


@pytest.mark.parametrize("name", sorted(set(list_encoders(external=False)) - TEXT_ENCODERS))
def test_every_registered_encoder_builds_and_trains(name):
    torch.manual_seed(0)
    _forward_backward(create_encoder(name))


@pytest.mark.parametrize("name", sorted(EXTERNAL))
def test_external_encoders_build_and_train(name):
    torch.manual_seed(0)
    _forward_backward(create_encoder(name, **EXTERNAL[name]), size=32)


def test_feature_widths():
    assert create_encoder("cifar_resnet18").num_features == 512
    assert create_encoder("cifar_resnet50").num_features == 2048
    assert create_encoder("torchvision:resnet50").num_features == 2048
    assert create_encoder("small_cnn").num_features == 256


def test_small_cnn_size_and_cifar_stem():
    n = sum(p.numel() for p in create_encoder("small_cnn").parameters())
    assert 350_000 < n < 450_000
    net = create_encoder("cifar_resnet18")
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, nn.Identity)


def test_top_level_lazy_names():
    assert contrastive.create_encoder is create_encoder
    assert contrastive.list_encoders is list_encoders
    assert contrastive.register_encoder is register_encoder


def test_torchvision_keys_are_torchvision_minus_classifier():
    import torchvision

    ours = set(create_encoder("torchvision:resnet18").state_dict())
    ref = set(torchvision.models.resnet18().state_dict())
    assert ref - ours == {"fc.weight", "fc.bias"} and ours <= ref
    ours = set(create_encoder("cifar_resnet18").state_dict())
    assert ref - ours == {"fc.weight", "fc.bias"} and ours <= ref


def test_torchvision_nested_classifier_is_removed():
    enc = create_encoder("torchvision:mobilenet_v3_small")
    assert enc.num_features == 1024  # input of the last Linear (1024 -> 1000)
    assert enc(torch.randn(2, 3, 64, 64)).shape == (2, 1024)


@pytest.mark.parametrize(
    "bad, suggestion",
    [
        ("cifar_resnet19", "cifar_resnet18"),
        ("resnet50", "torchvision:resnet50"),
        ("timm:resnet5", "timm:resnet50"),
        ("torchvision:resnt18", "torchvision:resnet18"),
    ],
)
def test_unknown_names_list_close_matches(bad, suggestion):
    with pytest.raises(KeyError) as info:
        create_encoder(bad)
    assert isinstance(info.value, UnknownEncoderError)
    assert bad in str(info.value) and suggestion in str(info.value)


def test_list_encoders_pattern():
    names = list_encoders("*resnet18")
    assert {"cifar_resnet18", "timm:resnet18", "torchvision:resnet18"} <= set(names)
    assert all(n.endswith("resnet18") for n in names)
    assert list_encoders(external=False) == sorted(_REGISTRY)


def test_register_encoder_user_module():
    @register_encoder("_test_tiny")
    class Tiny(nn.Module):
        def __init__(self, width: int = 4):
            super().__init__()
            self.conv = nn.Conv2d(3, width, 3)
            self.num_features = width

        def forward(self, x):
            return self.conv(x).mean(dim=(2, 3))

    try:
        enc = create_encoder("_test_tiny", width=6)
        assert isinstance(enc, Tiny) and enc.num_features == 6
        _forward_backward(enc)
        with pytest.raises(ValueError, match="already registered"):
            register_encoder("_test_tiny")(Tiny)
        with pytest.raises(ValueError, match=":"):
            register_encoder("timm:mine")
    finally:
        _REGISTRY.pop("_test_tiny", None)


def test_encoder_without_num_features_is_rejected():
    register_encoder("_test_bad")(lambda: nn.Linear(3, 3))
    try:
        with pytest.raises(TypeError, match="num_features"):
            create_encoder("_test_bad")
    finally:
        _REGISTRY.pop("_test_bad", None)


@pytest.mark.parametrize("name", ["small_cnn", "cifar_resnet18", "timm:resnet18",
                                  "torchvision:resnet18"])
def test_a_vit_keyword_for_another_encoder_is_one_line(name):
    """A ViT recipe's --encoder-kwargs default with another --encoder: the encoder, the keyword
    it does not take and the fix, in one line (was a raw TypeError from the factory)."""
    with pytest.raises(EncoderArgumentError) as info:
        create_encoder(name, dynamic_img_size=True)
    text = str(info.value)
    assert isinstance(info.value, TypeError) and "\n" not in text
    assert f"encoder {name!r} takes no keyword argument 'dynamic_img_size'" in text
    assert "--encoder-kwargs '{}'" in text
    assert isinstance(info.value.__cause__, TypeError)  # the factory's own error, kept


def test_another_type_error_of_a_factory_keeps_its_traceback():
    """Only a keyword the caller gave becomes EncoderArgumentError: a factory's own bug (here an
    unexpected keyword it passes on itself) is not blamed on the user's arguments."""
    def buggy(width: int = 4) -> nn.Module:
        return nn.Conv2d(3, width, 3, stride_typo=2)

    register_encoder("_test_buggy")(buggy)
    try:
        with pytest.raises(TypeError, match="stride_typo") as info:
            create_encoder("_test_buggy", width=6)
        assert not isinstance(info.value, EncoderArgumentError)
        with pytest.raises(EncoderArgumentError, match="'_test_buggy' takes no keyword argument "
                                                       "'depth'"):
            create_encoder("_test_buggy", depth=2)
    finally:
        _REGISTRY.pop("_test_buggy", None)


def test_own_backbones_have_no_pretrained_weights():
    with pytest.raises(ValueError, match="pretrained"):
        create_encoder("small_cnn", pretrained=True)


@pytest.mark.parametrize("name", ["cifar_resnet18", "small_cnn", "torchvision:resnet18"])
def test_stage_features_last_stage_pools_to_output(name):
    torch.manual_seed(0)
    enc = create_encoder(name).eval()
    x = torch.randn(2, 3, 32, 32)
    stages = stage_features(enc, x)
    assert len(stages) == 4
    assert [s.shape[1] for s in stages][-1] == enc.num_features
    # spatial size halves (or stays) from one stage to the next
    assert all(a.shape[-1] >= b.shape[-1] for a, b in zip(stages, stages[1:]))
    torch.testing.assert_close(stages[-1].mean(dim=(2, 3)), enc(x))


def test_stage_features_timm_uses_forward_intermediates():
    enc = create_encoder("timm:resnet18").eval()
    stages = stage_features(enc, torch.randn(1, 3, 64, 64))
    assert [s.shape[1] for s in stages] == [64, 64, 128, 256, 512]  # stem + 4 stages


def test_stage_features_unknown_model():
    with pytest.raises(TypeError, match="forward_stages"):
        stage_features(nn.Linear(3, 3), torch.randn(1, 3))


def test_split_classifier_keeps_logits() -> None:
    """timm (get/reset_classifier) and torchvision (last nn.Linear): backbone + head = model."""
    import timm
    import torchvision

    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    for model in (torchvision.models.resnet18(num_classes=5), timm.create_model("resnet18", num_classes=5)):
        model.eval()
        full = copy.deepcopy(model)
        backbone, head = split_classifier(model)
        assert head is not None
        with torch.no_grad():
            feats = backbone(x)
            assert feats.shape == (2, 512) and backbone.num_features == 512
            torch.testing.assert_close(head(feats), full(x))
    no_linear = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    assert split_classifier(no_linear)[1] is None


def test_split_classifier_old_import_path() -> None:
    """``contrastive.methods.distill.split_classifier`` (public before it moved) still works."""
    from contrastive.methods.distill import split_classifier as old

    assert old is split_classifier


def test_drop_path_uniform_gives_every_vit_block_the_rate():
    """DINOv2's drop_path_uniform: both drop paths of every block at drop_path_rate (timm's
    default grows linearly from 0 in the first block); refused by a model without ViT blocks."""
    from timm.layers import DropPath

    from contrastive.nn.encoders import EncoderArgumentError, set_uniform_drop_path

    kw = dict(img_size=16, patch_size=4, embed_dim=16, depth=4, num_heads=2, drop_path_rate=0.3)
    vit = create_encoder("timm:vit_tiny_patch16_224", drop_path_uniform=True, **kw)
    paths = [getattr(b, f"drop_path{i}") for b in vit.blocks for i in (1, 2)]
    assert len(paths) == 8 and all(type(d) is DropPath and d.drop_prob == 0.3 for d in paths)
    linear = create_encoder("timm:vit_tiny_patch16_224", **kw)
    assert type(linear.blocks[0].drop_path1) is not DropPath  # timm's: 0 in the first block
    assert linear.blocks[1].drop_path1.drop_prob == pytest.approx(0.1)
    torch.manual_seed(0)
    x = torch.randn(8, 3, 16, 16)
    vit.train()
    assert vit(x).shape == (8, 16)
    vit.eval()
    torch.testing.assert_close(vit(x), vit(x))  # no drop in eval
    plain = create_encoder("timm:vit_tiny_patch16_224", drop_path_uniform=True,
                           **{**kw, "drop_path_rate": 0.0})
    assert all(type(b.drop_path1) is torch.nn.Identity for b in plain.blocks)
    with pytest.raises(EncoderArgumentError, match="drop_path_uniform needs a timm ViT"):
        create_encoder("timm:resnet18", drop_path_uniform=True, drop_path_rate=0.1)
    with pytest.raises(EncoderArgumentError, match="takes no keyword argument"):
        create_encoder("small_cnn", drop_path_uniform=True)
    with pytest.raises(EncoderArgumentError, match="in \\[0, 1\\)"):
        set_uniform_drop_path(vit, 1.0)


def test_strip_drop_path_replaces_timm_and_torchvision_stochastic_depth():
    """Both kinds become nn.Identity (the count returned); other modules and the state dict's
    keys stay."""
    from timm.layers import DropPath
    from torchvision.ops import StochasticDepth

    from contrastive.nn.encoders import strip_drop_path

    net = nn.Sequential(nn.Linear(2, 2), DropPath(0.5),
                        nn.Sequential(StochasticDepth(0.5, "row"), nn.Dropout(0.1)))
    keys = list(net.state_dict())
    assert strip_drop_path(net) == 2
    assert isinstance(net[1], nn.Identity) and isinstance(net[2][0], nn.Identity)
    assert isinstance(net[2][1], nn.Dropout) and list(net.state_dict()) == keys
    assert strip_drop_path(net) == 0
