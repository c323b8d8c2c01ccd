"""Fixed 2-D sin-cos position embeddings for ViTs (MoCo v3).

MoCo v3 (Chen, Xie, He, ICCV 2021, Sec. 4 / the official ``vits.py``,
``build_2d_sincos_position_embedding``) replaces the learned position embedding of its ViTs by a
fixed 2-D sin-cos one: for the patch at row r, column c, ``[sin(r w), cos(r w), sin(c w),
cos(c w)]`` with ``w_i = temperature^(-i / (dim / 4))``, a zero row for the class token, and
no gradient.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["sincos_pos_embed", "fix_sincos_pos_embed"]


def sincos_pos_embed(grid: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """(1, 1 + grid^2, dim): a zero class-token row, then the patches in row-major order."""
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs dim % 4 == 0, got {dim}")
    quarter = dim // 4
    omega = temperature ** -(torch.arange(quarter, dtype=torch.float64) / quarter)
    pos = torch.arange(grid * grid)
    rows, cols = (pos // grid).double(), (pos % grid).double()
    r, c = rows[:, None] * omega, cols[:, None] * omega
    emb = torch.cat([r.sin(), r.cos(), c.sin(), c.cos()], dim=1).float()
    return torch.cat([torch.zeros(1, dim), emb])[None]


def fix_sincos_pos_embed(model: nn.Module) -> int:
    """Set every square-grid ViT position embedding in ``model`` (query and key encoders alike)
    to :func:`sincos_pos_embed` and freeze it; returns how many were set. An embedding of the
    patches only (a ViT without class token: I-JEPA's) gets the patch rows.

    Raises ``ValueError`` for an embedding that is not (one class token +) the patch grid.
    """
    done = 0
    for m in model.modules():
        pos = getattr(m, "pos_embed", None)
        grid = getattr(getattr(m, "patch_embed", None), "grid_size", None)
        if isinstance(pos, nn.Parameter) and grid is not None and grid[0] == grid[1]:
            patches = grid[0] * grid[1]
            if pos.shape[1] not in (patches, patches + 1):
                raise ValueError(f"expected the {patches} patches and at most one class token "
                                 f"in pos_embed {tuple(pos.shape)}")
            with torch.no_grad():
                pos.copy_(sincos_pos_embed(grid[0], pos.shape[-1])[:, -pos.shape[1]:])
            pos.requires_grad_(False)
            done += 1
    return done
