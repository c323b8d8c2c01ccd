"""The small CNN of the learning checks and the demo, in torch alone (building it imports no
torchvision: see :mod:`contrastive.augment.per_image`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    """Four conv blocks (32-64-128-256 channels), about 0.39M parameters.

    Block i: Conv3x3(no bias)-BN-ReLU, then 2x2 max-pool after blocks 1-3 and global average
    pooling after block 4. Made for CPU-minute learning checks and the demo (see
    BENCHMARKS.md: it learns 32 px shapes in minutes where a ResNet-18 does not).

    Shape: (N, 3, H, W) -> (N, 256).
    """

    def __init__(self, in_chans: int = 3, widths: tuple[int, ...] = (32, 64, 128, 256)):
        super().__init__()
        blocks = []
        c_in = in_chans
        for c_out in widths:
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                    nn.BatchNorm2d(c_out),
                    nn.ReLU(inplace=True),
                )
            )
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.MaxPool2d(2)
        self.num_features = widths[-1]

    def forward_stages(self, x: Tensor) -> list[Tensor]:
        """Output of every block (before its pooling): (N, C_i, H / 2^i, W / 2^i)."""
        out = []
        for i, block in enumerate(self.blocks):
            if i > 0:
                x = self.pool(x)
            x = block(x)
            out.append(x)
        return out

    def forward(self, x: Tensor) -> Tensor:
        return torch.flatten(self.forward_stages(x)[-1].mean(dim=(2, 3)), 1)
