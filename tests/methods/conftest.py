"""Tiny encoders so that method tests run in milliseconds."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class TinyEncoder(nn.Module):
    """Two strided convs (+ optional BN), global average pool; num_features = 2 * width."""

    def __init__(self, width: int = 4, bn: bool = True):
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.Identity())
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1),
            norm(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            norm(2 * width),
            nn.ReLU(),
        )
        self.num_features = 2 * width

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


class TinyPatchEncoder(nn.Module):
    """ViT-like: has a ``patch_embed`` (MoCo v3 detects it); num_features = width."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, width, 4, stride=4)
        self.mix = nn.Linear(width, width)
        self.num_features = width

    def forward(self, x):
        return self.mix(self.patch_embed(x).flatten(2).mean(-1))


@pytest.fixture
def tiny():
    """Factory: tiny(bn=True, width=4) -> a fresh TinyEncoder."""
    return lambda **kw: TinyEncoder(**kw)


@pytest.fixture
def tiny_patch():
    return lambda **kw: TinyPatchEncoder(**kw)


@pytest.fixture
def views():
    """Factory: views(n, size=16, seed=0) -> [x1, x2]."""

    def make(n: int = 6, size: int = 16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(n, 3, size, size, generator=g) for _ in range(2)]

    return make
