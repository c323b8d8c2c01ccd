"""Deep InfoMax's encoders: ``dcgan32`` / ``dcgan64`` (DCGAN discriminator) and ``alexnet64``.

Hjelm et al., "Learning deep representations by mutual information estimation and
maximization", ICLR 2019 (arXiv 1808.06670), appendix A: a DCGAN-discriminator encoder for
CIFAR-10/100 with one 1024-unit hidden layer after the last convolution, an AlexNet-like one
with two 4096-unit hidden layers for the other data sets (STL-10, Tiny ImageNet), BN and ReLU on
every hidden layer, a 64-d output. The authors' code (rdevon/DIM) fixes the details:
``cortex_DIM/configs/convnets.py`` (``basic32x32``, "used in Table 1 CIFAR10 and CIFAR100
results"; ``basic64x64``; ``alex64x64``, "used for STL10 and tiny Imagenet results"),
``nn_modules/convnet.py`` (a conv with batch norm has no bias) and ``models/controller.py``
(``output_units=64``: a final plain linear layer, the global feature)::

    dcgan32:   [Conv4x4/2(64), Conv4x4/2(128), Conv4x4/2(256)] each -BN-ReLU
               -> flatten (256 x 4 x 4) -> Linear(1024)-BN-ReLU -> Linear(64)
    dcgan64:   the same with a fourth conv (512), flatten 512 x 4 x 4
    alexnet64: Conv3x3(96)-BN-ReLU-MaxPool3/2, Conv3x3(192)-BN-ReLU-MaxPool3/2,
               Conv3x3(384), Conv3x3(384), Conv3x3(192)-BN-ReLU-MaxPool3/2 (all stride 1, pad 1)
               -> flatten (192 x 7 x 7) -> 2 x [Linear(4096)-BN-ReLU] -> Linear(64)

Local features for DIM (the code's ``local_task_idx``): conv block 1 for 32 x 32 (128 x 8 x 8),
block 2 for ``basic64x64`` (256 x 8 x 8) and for ``alex64x64`` (384 x 15 x 15): each encoder's
``local_stage``, which :class:`~contrastive.methods.DeepInfoMax` uses by default.

Other input sizes: the last map is average-pooled to the paper's size (4 x 4, or 7 x 7 for the
AlexNet) before the flatten: the identity at 32 / 64 px, so that the encoders also run on the
16-px test data.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["DCGANEncoder", "AlexNetEncoder"]


def _conv(c_in: int, c_out: int, k: int, stride: int, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, k, stride=stride, padding=1, bias=False),
                               nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(3, 2))
    return nn.Sequential(*layers)


def _fc(c_in: int, hidden: Sequence[int]) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for h in hidden:
        layers.append(nn.Sequential(nn.Linear(c_in, int(h)), nn.BatchNorm1d(int(h)),
                                    nn.ReLU(inplace=True)))
        c_in = int(h)
    return nn.Sequential(*layers), c_in


class _StagedEncoder(nn.Module):
    """Conv blocks, adaptive pool to ``grid`` x ``grid``, fc blocks, a linear output."""

    def __init__(self, convs: list[nn.Sequential], c_last: int, grid: int,
                 hidden: Sequence[int], out_dim: int, local_stage: int) -> None:
        super().__init__()
        if out_dim < 1 or any(int(h) < 1 for h in hidden):
            raise ValueError(f"{type(self).__name__}: out_dim and hidden widths must be positive; "
                             f"got out_dim={out_dim}, hidden={tuple(hidden)}")
        if not 0 <= local_stage < len(convs):
            raise ValueError(f"{type(self).__name__}: local_stage {local_stage} must index a conv "
                             f"block (0..{len(convs) - 1})")
        self.blocks = nn.ModuleList(convs)
        self.pool = nn.AdaptiveAvgPool2d(grid)
        self.fc, width = _fc(c_last * grid * grid, hidden)
        self.out = nn.Linear(width, out_dim)
        self.num_features = int(out_dim)
        self.local_stage = int(local_stage)

    def forward_stages(self, x: Tensor) -> list[Tensor]:
        """Every conv block's map (N, C_i, H_i, W_i), every hidden fc output (N, hidden_j),
        then the output (N, out_dim), the global feature."""
        out = []
        for block in self.blocks:
            x = block(x)
            out.append(x)
        h = self.pool(x).flatten(1)
        for layer in self.fc:
            h = layer(h)
            out.append(h)
        out.append(self.out(h))
        return out

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_stages(x)[-1]


class DCGANEncoder(_StagedEncoder):
    """Strided 4x4 convolutions (stride 2, padding 1, no bias) with BN and ReLU, fc layers with
    BN and ReLU, a linear output.

    Args:
        widths: output channels of the conv blocks; (64, 128, 256) is ``dcgan32``.
        hidden: widths of the fc layers after the convolutions ((1024,) in the paper).
        out_dim: the output (global feature) width, ``num_features`` (64).
        local_stage: index of the conv block whose map DIM uses as local features.
        in_chans: input channels.

    Shape: (N, in_chans, H, W) -> (N, out_dim); the paper's H = W = 4 x 2^len(widths).
    """

    def __init__(self, widths: Sequence[int] = (64, 128, 256), hidden: Sequence[int] = (1024,),
                 out_dim: int = 64, local_stage: int = 1, in_chans: int = 3) -> None:
        if not widths or any(int(w) < 1 for w in widths):
            raise ValueError(f"DCGANEncoder: widths must be positive ints; got {tuple(widths)}")
        chans = [in_chans, *map(int, widths)]
        convs = [_conv(a, b, 4, 2, pool=False) for a, b in zip(chans, chans[1:])]
        super().__init__(convs, chans[-1], 4, hidden, out_dim, local_stage)


class AlexNetEncoder(_StagedEncoder):
    """The code's ``alex64x64``: five 3x3 convolutions (stride 1, no bias) with BN and ReLU,
    3x3/2 max-pooling after the 1st, 2nd and 5th, two 4096-unit fc layers, a linear output.

    Args:
        widths: the five conv widths ((96, 192, 384, 384, 192)).
        hidden: the fc widths ((4096, 4096)).
        out_dim: the output width (64).
        local_stage: the conv block of the local features (2: 384 x 15 x 15 at 64 px).
        in_chans: input channels.

    Shape: (N, in_chans, H, W) -> (N, out_dim); the paper's H = W = 64.
    """

    def __init__(self, widths: Sequence[int] = (96, 192, 384, 384, 192),
                 hidden: Sequence[int] = (4096, 4096), out_dim: int = 64, local_stage: int = 2,
                 in_chans: int = 3) -> None:
        if len(widths) != 5 or any(int(w) < 1 for w in widths):
            raise ValueError(f"AlexNetEncoder: widths must be 5 positive ints; got {tuple(widths)}")
        chans = [in_chans, *map(int, widths)]
        convs = [_conv(a, b, 3, 1, pool=i in (0, 1, 4))
                 for i, (a, b) in enumerate(zip(chans, chans[1:]))]
        super().__init__(convs, chans[-1], 7, hidden, out_dim, local_stage)
