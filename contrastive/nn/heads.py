"""MLP heads: one builder for every projector and predictor of the methods.

Heads of the papers, as :func:`build_head` kinds (in -> hidden -> out, BN = BatchNorm1d):

============================  ======  =============================================================
kind                          layers  structure
============================  ======  =============================================================
``linear``                    1       Linear (MoCo v1, He et al. 2020; MoCo CIFAR demo)
``mocov2``                    2       Linear-ReLU-Linear, biases, no BN (Chen et al. 2020)
``simclr``                    2       Linear-BN-ReLU-Linear-BN (Chen et al. 2020, official TF code
                                      puts BN on every layer; ours has no affine on the last BN,
                                      the TF code keeps its scale)
``mocov3_projector``          2       Linear-BN-ReLU-Linear-BN(no affine), no biases (MoCo v3
                                      ResNet code; the paper's text says 3 layers, its code 2)
``mocov3_projector_vit``      3       same with 3 layers (MoCo v3 ViT)
``mocov3_predictor``          2       Linear-BN-ReLU-Linear, no biases (MoCo v3 ResNet)
``mocov3_predictor_vit``      2       Linear-BN-ReLU-Linear-BN(no affine), no biases (MoCo v3 ViT)
============================  ======  =============================================================
"""

from __future__ import annotations

from torch import nn

__all__ = ["build_mlp", "build_head", "HEAD_KINDS"]


def build_mlp(
    in_dim: int,
    hidden_dim: int,
    out_dim: int,
    num_layers: int = 2,
    *,
    hidden_bn: bool = True,
    last_bn: bool = False,
    last_bn_affine: bool = False,
    bias: bool | None = None,
    activation: type[nn.Module] = nn.ReLU,
) -> nn.Sequential:
    """Build ``num_layers`` Linear layers with BN + activation between them.

    Shape: (N, in_dim) -> (N, out_dim).

    Args:
        in_dim, hidden_dim, out_dim: widths; hidden layers are ``hidden_dim`` wide.
        num_layers: number of Linear layers (1 = a single Linear ``in_dim -> out_dim``).
        hidden_bn: BatchNorm1d after every hidden Linear (before the activation).
        last_bn: BatchNorm1d after the last Linear (SimCLR, MoCo v3 projector).
        last_bn_affine: whether that last BN has a learnable scale and shift.
        bias: Linear biases; None = a bias only where no BN follows (a bias before BN is
            cancelled by the mean subtraction).
        activation: activation class for hidden layers (instantiated with no arguments).
    """
    if num_layers < 1:
        raise ValueError(f"build_mlp: num_layers must be >= 1, got {num_layers}")
    if min(in_dim, out_dim) < 1 or (num_layers > 1 and hidden_dim < 1):
        raise ValueError(
            f"build_mlp: dims must be >= 1, got in={in_dim} hidden={hidden_dim} out={out_dim}"
        )
    layers: list[nn.Module] = []
    for i in range(num_layers):
        last = i == num_layers - 1
        d_in = in_dim if i == 0 else hidden_dim
        d_out = out_dim if last else hidden_dim
        bn_follows = last_bn if last else hidden_bn
        layers.append(nn.Linear(d_in, d_out, bias=(not bn_follows) if bias is None else bias))
        if last:
            if last_bn:
                layers.append(nn.BatchNorm1d(d_out, affine=last_bn_affine))
        else:
            if hidden_bn:
                layers.append(nn.BatchNorm1d(d_out))
            layers.append(activation())
    return nn.Sequential(*layers)


HEAD_KINDS: dict[str, dict] = {
    "linear": dict(num_layers=1, bias=True),
    "mocov2": dict(num_layers=2, hidden_bn=False, bias=True),
    "simclr": dict(num_layers=2, hidden_bn=True, last_bn=True),
    "mocov3_projector": dict(num_layers=2, last_bn=True, bias=False),
    "mocov3_projector_vit": dict(num_layers=3, last_bn=True, bias=False),
    "mocov3_predictor": dict(num_layers=2, last_bn=False, bias=False),
    "mocov3_predictor_vit": dict(num_layers=2, last_bn=True, bias=False),
}


def build_head(kind: str, in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    """Build a head of the papers by name (see the module docstring); e.g.
    ``build_head("mocov2", 2048, 2048, 128)``."""
    if kind not in HEAD_KINDS:
        raise KeyError(f"build_head: unknown kind {kind!r}; known: {sorted(HEAD_KINDS)}")
    return build_mlp(in_dim, hidden_dim, out_dim, **HEAD_KINDS[kind])
