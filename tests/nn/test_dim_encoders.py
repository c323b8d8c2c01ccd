"""Deep InfoMax's encoders (``dcgan32``, ``dcgan64``, ``alexnet64``): the stage shapes at the
paper's 32 and 64 px, the layer details of the authors' code, the local stage DeepInfoMax picks,
and the size adapter being the identity at the paper's sizes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from contrastive.nn import create_encoder, stage_features

STAGES = {  # (name, px) -> stage shapes without N: conv maps, hidden fc outputs, the output
    ("dcgan32", 32): [(64, 16, 16), (128, 8, 8), (256, 4, 4), (1024,), (64,)],
    ("dcgan64", 64): [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4), (1024,), (64,)],
    ("alexnet64", 64): [(96, 31, 31), (192, 15, 15), (384, 15, 15), (384, 15, 15), (192, 7, 7),
                        (4096,), (4096,), (64,)],
}
LOCAL = {"dcgan32": (1, (128, 8, 8)), "dcgan64": (2, (256, 8, 8)),
         "alexnet64": (2, (384, 15, 15))}  # the code's local_task_idx and the map it names


@pytest.fixture(scope="module")
def encoders():
    torch.manual_seed(0)
    return {name: create_encoder(name).eval() for name, _ in STAGES}


@pytest.mark.parametrize("name, px", sorted(STAGES))
def test_stage_shapes_at_the_papers_size(name, px, encoders):
    enc = encoders[name]
    x = torch.randn(2, 3, px, px)
    with torch.no_grad():
        stages = stage_features(enc, x)
        out = enc(x)
    assert [tuple(s.shape[1:]) for s in stages] == STAGES[name, px]
    assert enc.num_features == 64 and out.shape == (2, 64)
    torch.testing.assert_close(stages[-1], out, rtol=0, atol=0)
    stage, shape = LOCAL[name]
    assert enc.local_stage == stage and tuple(stages[stage].shape[1:]) == shape


@pytest.mark.parametrize("name, px", sorted(STAGES))
def test_size_adapter_is_the_identity_at_the_papers_size(name, px, encoders):
    """Flatten the last conv map straight into the fc layers, as the code does: same output."""
    enc = encoders[name]
    x = torch.randn(2, 3, px, px)
    with torch.no_grad():
        h = x
        for block in enc.blocks:
            h = block(h)
        h = h.flatten(1)
        for layer in enc.fc:
            h = layer(h)
        assert torch.equal(enc.out(h), enc(x))


@pytest.mark.parametrize("name", ["dcgan32", "dcgan64"])
def test_dcgan_layers_are_the_codes(name, encoders):
    enc = encoders[name]
    convs = [m for m in enc.modules() if isinstance(m, nn.Conv2d)]
    assert all((c.kernel_size, c.stride, c.padding, c.bias) == ((4, 4), (2, 2), (1, 1), None)
               for c in convs)
    assert all(isinstance(b[1], nn.BatchNorm2d) and isinstance(b[2], nn.ReLU) for b in enc.blocks)
    fc = enc.fc[0]
    assert (fc[0].out_features, type(fc[1]), type(fc[2])) == (1024, nn.BatchNorm1d, nn.ReLU)
    assert enc.out.out_features == 64 and enc.out.bias is not None  # a plain linear output


def test_alexnet_layers_are_the_codes(encoders):
    enc = encoders["alexnet64"]
    convs = [m for m in enc.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [96, 192, 384, 384, 192]
    assert all((c.kernel_size, c.stride, c.padding, c.bias) == ((3, 3), (1, 1), (1, 1), None)
               for c in convs)
    pooled = [any(isinstance(m, nn.MaxPool2d) for m in b) for b in enc.blocks]
    assert pooled == [True, True, False, False, True]
    assert [layer[0].out_features for layer in enc.fc] == [4096, 4096]


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_deep_infomax_uses_the_encoders_local_stage(name, encoders):
    from contrastive.methods import DeepInfoMax

    method = DeepInfoMax(name, mi_units=8)
    stage, shape = LOCAL[name]
    assert method.local_stage == stage and method.mi_local.block[0].in_channels == shape[0]
    assert method.mi_global.block[0].in_channels == 64  # the global side gets the 64-d output
    if name == "dcgan32":
        x = torch.randn(3, 3, 32, 32)
        local, glob = method.eval().features(x)
        assert local.shape == (3, *shape)
        torch.testing.assert_close(glob, method.encoder(x), rtol=0, atol=0)
        explicit = DeepInfoMax(name, local_stage=0, mi_units=8)
        assert explicit.mi_local.block[0].in_channels == 64  # an explicit stage wins


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="local_stage 3 must index a conv block"):
        create_encoder("dcgan32", local_stage=3)
    with pytest.raises(ValueError, match="widths must be positive"):
        create_encoder("dcgan32", widths=())
    with pytest.raises(ValueError, match="5 positive ints"):
        create_encoder("alexnet64", widths=(8, 8))
    with pytest.raises(ValueError, match="pretrained"):
        create_encoder("dcgan64", pretrained=True)
