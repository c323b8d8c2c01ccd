"""MAE: masked autoencoders, a ViT encoder on the visible patches and a light decoder.

He, Chen, Xie, Li, Dollar, Girshick, "Masked Autoencoders Are Scalable Vision Learners", CVPR
2022 (arXiv 2111.06377); the authors' code is facebookresearch/mae (``models_mae.py``,
``main_pretrain.py``, ``PRETRAIN.md``).

One step (paper sec. 3, the code's ``forward``)::

    keep, restore, mask = random_masking(N, L, 0.75)    # per sample, argsort of noise
    latent = encoder(patches[keep] + pos)                 # class token + 25 % of the patches
    pred = decoder(unshuffle([latent, mask tokens], restore) + pos)   # every patch, (N, L, P)
    loss = mean over masked patches of mean_pixels (pred - norm_pix(patchify(x)))^2

The encoder is a timm ``VisionTransformer`` (``self.encoder``, saved and evaluated as any
backbone: its class token after the final norm); the decoder is ``MAEDecoder``. The MAE
initialisation (the code's ``initialize_weights``) replaces timm's: fixed 2-D sin-cos position
embeddings (:func:`contrastive.nn.pos_embed.sincos_pos_embed`, MoCo v3's channel order: the
code puts the column's sin / cos before the row's, a fixed permutation of the channels),
Xavier-uniform linear layers with zero biases, the patch projection Xavier-initialised as a
linear layer, class and mask tokens N(0, 0.02^2).

Settings (``presets``; checked against the paper's Table 8 / appendix A.1 and the code, see
``recipes/mae_in1k.py`` for the optimiser): mask ratio 0.75, decoder 8 blocks of width 512
with 16 heads, MLP ratio 4, LayerNorm eps 1e-6, normalised-pixel targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import width
from contrastive.methods.base import Method, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import resolve_encoder
from contrastive.nn.masked_vit import MaskTokenTransformer, check_vit, masked_tokens
from contrastive.nn.masking import Masking, patchify, random_masking
from contrastive.nn.pos_embed import fix_sincos_pos_embed

__all__ = ["MAE", "MAEDecoder"]

LOSS_ON = ("masked", "all", "visible")


class MAEDecoder(MaskTokenTransformer):
    """The code's decoder: linear embedding, mask tokens put back in place, fixed sin-cos
    positions, ``depth`` timm ``Block`` s, LayerNorm, linear prediction of every patch's pixels.

    ``forward(latent (N, prefix + K, D), restore (N, L)) -> (N, L, patch_dim)``.
    """

    def __init__(self, in_dim: int, grid: int, patch_dim: int, dim: int = 512, depth: int = 8,
                 heads: int = 16, mlp_ratio: float = 4.0, prefix: int = 1) -> None:
        super().__init__(in_dim, grid, patch_dim, dim, depth, heads, mlp_ratio)
        self.prefix = prefix

    def forward(self, latent: Tensor, restore: Tensor) -> Tensor:
        x = self.embed(latent)
        n, length, d = x.shape[0], restore.shape[1], x.shape[-1]
        visible = x[:, self.prefix:]
        fill = self.mask_token.to(x.dtype).expand(n, length - visible.shape[1], d)
        seq = torch.gather(torch.cat([visible, fill], dim=1), 1,
                           restore.unsqueeze(-1).expand(-1, -1, d))  # unshuffle
        x = torch.cat([x[:, :self.prefix], seq + self.pos_embed.to(x.dtype)], dim=1)
        return self.pred(self.norm(self.blocks(x)))[:, self.prefix:]


def mae_init_(module: nn.Module) -> None:
    """The code's ``_init_weights`` on every ``nn.Linear`` / ``nn.LayerNorm`` of ``module``."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


@register_method("mae")
class MAE(Method):
    """MAE for a timm ViT encoder.

    Args:
        encoder: ``"timm:vit_*"`` name or a timm ``VisionTransformer`` with ``num_classes=0``.
        mask_ratio: fraction of patches removed per image (0.75).
        decoder_dim, decoder_depth, decoder_heads: the decoder (512, 8, 16).
        mlp_ratio: of the decoder blocks (4).
        norm_pix: per-patch normalised pixel targets (True).
        loss_on: where the loss is taken: ``"masked"`` (the paper), ``"all"`` patches (the
            paper's ablation), or ``"visible"`` only (a copy task: the negative control).
        mae_init: apply MAE's initialisation to the encoder and decoder (True).
        encoder_kwargs: keyword arguments for ``create_encoder`` (e.g. ``img_size``,
            ``patch_size``).

    ``forward(batch)``: ``batch["views"]``, one view (N, C, H, W) (more are refused).
    """

    needs = ("views",)
    #: the encoder runs on the visible tokens through ``masked_tokens`` (its parts, not its
    #: forward), so gradient caching cannot stand in for it; per-sample loss: accumulation is exact
    backbones = ()
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # paper Table 1 defaults / the code's mae_vit_*_dec512d8b and PRETRAIN.md
        "vit_base": dict(encoder="timm:vit_base_patch16_224", mask_ratio=0.75, decoder_dim=512,
                         decoder_depth=8, decoder_heads=16, norm_pix=True),
        "vit_large": dict(encoder="timm:vit_large_patch16_224", mask_ratio=0.75,
                          decoder_dim=512, decoder_depth=8, decoder_heads=16, norm_pix=True),
        # ours, at CPU scale: ViT-Tiny on 32 px with 4-px patches (64 tokens), a decoder of
        # 2 blocks of width 128 (the paper's Table 1a/b: depth 1 and width 128 still work)
        "cifar": dict(encoder="timm:vit_tiny_patch16_224",
                      encoder_kwargs=dict(img_size=32, patch_size=4), mask_ratio=0.75,
                      decoder_dim=128, decoder_depth=2, decoder_heads=4, norm_pix=True),
    }

    def __init__(self, encoder: str | nn.Module = "timm:vit_tiny_patch16_224",
                 mask_ratio: float = 0.75, decoder_dim: int = 512, decoder_depth: int = 8,
                 decoder_heads: int = 16, mlp_ratio: float = 4.0, norm_pix: bool = True,
                 loss_on: str = "masked", mae_init: bool = True,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"MAE: mask_ratio must be in [0, 1), got {mask_ratio}")
        if loss_on not in LOSS_ON:
            raise ValueError(f"MAE: loss_on must be one of {LOSS_ON}, got {loss_on!r}")
        if decoder_dim % decoder_heads:
            raise ValueError(f"MAE: decoder_dim {decoder_dim} must be a multiple of "
                             f"decoder_heads {decoder_heads}")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        check_vit(self.encoder, "MAE")
        vit: Any = self.encoder  # a timm VisionTransformer (checked), duck-typed
        embed = vit.patch_embed
        grid = tuple(embed.grid_size)
        if grid[0] != grid[1]:
            raise ValueError(f"MAE: the patch grid must be square, got {grid}")
        self.patch_size = int(embed.patch_size[0])
        self.num_patches = grid[0] * grid[1]
        chans = int(embed.proj.in_channels)
        self.decoder = MAEDecoder(width(self.encoder), grid[0], self.patch_size ** 2 * chans,
                                  decoder_dim, decoder_depth, decoder_heads, mlp_ratio,
                                  prefix=int(vit.num_prefix_tokens))
        self.mask_ratio, self.loss_on = mask_ratio, loss_on
        self.criterion = get_loss("mae", norm_pix=norm_pix)
        if mae_init:
            self._mae_init()

    def _mae_init(self) -> None:
        fix_sincos_pos_embed(self.encoder)
        mae_init_(self.encoder)
        mae_init_(self.decoder)
        vit: Any = self.encoder
        w = vit.patch_embed.proj.weight
        with torch.no_grad():  # "initialize patch_embed like nn.Linear"
            nn.init.xavier_uniform_(w.view(w.shape[0], -1))
            for token in (getattr(self.encoder, "cls_token", None), self.decoder.mask_token):
                if token is not None:
                    nn.init.normal_(token, std=0.02)

    def draw_masking(self, n: int, device: torch.device, noise: Tensor | None = None) -> Masking:
        """This step's masks of ``n`` images (``noise`` (n, L): scores to rank instead of fresh
        uniform noise, the smallest kept; a test may replace the method)."""
        return random_masking(n, self.num_patches, self.mask_ratio, noise=noise, device=device)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        (x,) = views_of(batch, "MAE", n=1)
        masking = self.draw_masking(x.shape[0], x.device)
        latent = masked_tokens(self.encoder, x, keep=masking.keep)
        pred = self.decoder(latent, masking.restore)
        where = {"masked": masking.mask, "visible": ~masking.mask,
                 "all": torch.ones_like(masking.mask)}[self.loss_on]
        loss = self.criterion(pred, patchify(x, self.patch_size), where)
        return {"loss": loss, "embeddings": F.normalize(latent[:, 0].detach().float(), dim=1)}
