"""Heads match the papers' structures (layer by layer) and shapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from contrastive.nn import HEAD_KINDS, build_head, build_mlp


def _describe(mlp: nn.Sequential) -> list[str]:
    out = []
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            out.append(
                f"L{layer.in_features}-{layer.out_features}{'b' if layer.bias is not None else ''}"
            )
        elif isinstance(layer, nn.BatchNorm1d):
            out.append("BN" if layer.affine else "BN0")
        elif isinstance(layer, nn.ReLU):
            out.append("R")
        else:
            out.append(type(layer).__name__)
    return out


# Written from the papers / official code (see contrastive/nn/heads.py docstring).
EXPECTED = {
    "linear": ["L16-8b"],
    "mocov2": ["L16-32b", "R", "L32-8b"],
    "simclr": ["L16-32", "BN", "R", "L32-8", "BN0"],
    "mocov3_projector": ["L16-32", "BN", "R", "L32-8", "BN0"],
    "mocov3_projector_vit": ["L16-32", "BN", "R", "L32-32", "BN", "R", "L32-8", "BN0"],
    "mocov3_predictor": ["L16-32", "BN", "R", "L32-8"],
    "mocov3_predictor_vit": ["L16-32", "BN", "R", "L32-8", "BN0"],
}


@pytest.mark.parametrize("kind", sorted(HEAD_KINDS))
def test_head_kinds(kind):
    head = build_head(kind, 16, 32, 8)
    assert _describe(head) == EXPECTED[kind]
    assert head(torch.randn(4, 16)).shape == (4, 8)


def test_build_mlp_options():
    mlp = build_mlp(4, 6, 2, 3, hidden_bn=False, last_bn=True, last_bn_affine=True, bias=True)
    assert _describe(mlp) == ["L4-6b", "R", "L6-6b", "R", "L6-2b", "BN"]
    mlp = build_mlp(4, 6, 2, 2, activation=nn.GELU)
    assert isinstance(mlp[2], nn.GELU)


def test_build_mlp_errors():
    with pytest.raises(ValueError, match="num_layers"):
        build_mlp(4, 4, 4, 0)
    with pytest.raises(ValueError, match="dims"):
        build_mlp(0, 4, 4)
    with pytest.raises(KeyError, match="mocov2"):
        build_head("mocov9", 4, 4, 4)
