"""SimMIM: a ViT on every patch, the masked ones replaced by a learned token, and a linear head
that regresses their raw pixels.

Xie, Zhang, Cao, Lin, Bao, Yao, Dai, Hu, "SimMIM: A Simple Framework for Masked Image Modeling",
CVPR 2022 (arXiv 2111.09886); the authors' code is microsoft/SimMIM (``models/simmim.py``,
``data/data_simmim.py``, ``configs/vit_base__800ep/``).

One step (paper sec. 3; the code's ``MaskGenerator``, ``VisionTransformerForSimMIM.forward``
and ``SimMIM.forward``)::

    mask = random mask of ceil(0.6 x units) of the (H / 32) x (W / 32) mask units, each unit
           covering (32 / p)^2 model patches                           # (N, L) over the patches
    tokens = encoder(where(mask, mask_token, patch_embed(x)) + pos)      # every patch enters
    x_rec = PixelShuffle(p)(conv1x1(tokens without the class token))     # (N, C, H, W)
    loss = sum over masked pixels |x - x_rec| / (masked pixels x C)      # the registry's simmim

Unlike MAE the encoder sees all tokens (the masked ones as the learned token) and the head is
one linear layer. The encoder is a timm ``VisionTransformer`` (``self.encoder``, saved as any
backbone; its class token after the final norm is the embedding); the mask token lives on the
method (``self.mask_token``), so the encoder's state dict stays timm's. The head keeps the code's
form and names (``decoder.0`` a 1x1 ``Conv2d`` to p^2 x C channels, ``decoder.1`` a
``PixelShuffle``); it is PyTorch's default-initialised as in the code, the mask token is drawn
from a normal of std 0.02 truncated at +-0.02 (the code's ``_trunc_normal_``, ``a=-std, b=std``).

Differences from the code, none of them in the objective: the code's ViT-B has no absolute
position embedding and a shared relative position bias (``USE_APE: False``,
``USE_SHARED_RPB: True``); timm's ViT has a learned absolute one and no relative bias. The code
keeps its BEiT-style initialisation (rescaled projections); timm's is kept here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import width
from contrastive.methods.base import Method, ParamGroup, views_of
from contrastive.methods.mae import LOSS_ON
from contrastive.methods.registry import register_method
from contrastive.nn import resolve_encoder
from contrastive.nn.masked_vit import check_vit, masked_tokens
from contrastive.nn.masking import patchify, random_masking

__all__ = ["SimMIM"]


@register_method("simmim")
class SimMIM(Method):
    """SimMIM for a timm ViT encoder.

    Args:
        encoder: ``"timm:vit_*"`` name or a timm ``VisionTransformer`` with ``num_classes=0``.
        mask_ratio: fraction of the mask units masked per image (0.6).
        mask_patch_size: side of a mask unit in pixels, a multiple of the ViT's patch size (32).
        norm_pix: per-patch normalised targets (False: the code regresses the raw, dataset-
            normalised pixels).
        loss_on: ``"masked"`` (the paper), ``"all"`` pixels, or ``"visible"`` only (a copy task:
            the negative control).
        encoder_kwargs: keyword arguments for ``create_encoder`` (``img_size``, ``patch_size``,
            ``init_values``...).

    ``forward(batch)``: ``batch["views"]``, one view (N, C, H, W) of the encoder's image size.
    """

    needs = ("views",)
    #: the encoder runs through ``masked_tokens`` (its parts, with the mask token spliced in), so
    #: gradient caching cannot stand in for it; the loss is a per-sample mean and every image
    #: masks the same number of patches, so accumulation is exact (tests/methods/test_simmim.py)
    backbones = ()
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # configs/vit_base__800ep/simmim_pretrain__vit_base__img224__800ep.yaml: 224 px, mask
        # patch 32, ratio 0.6, DROP_PATH_RATE 0.1; config.py: VIT.INIT_VALUES 0.1 (LayerScale)
        "vit_base": dict(encoder="timm:vit_base_patch16_224", mask_ratio=0.6, mask_patch_size=32,
                         encoder_kwargs=dict(init_values=0.1, drop_path_rate=0.1)),
        # ours, at CPU scale: ViT-Tiny on 32 px with 4-px patches (64 tokens); mask units of
        # 8 px, 2 x 2 patches each as ViT-B's 32-px units on its 16-px patches (16 units)
        "cifar": dict(encoder="timm:vit_tiny_patch16_224",
                      encoder_kwargs=dict(img_size=32, patch_size=4), mask_ratio=0.6,
                      mask_patch_size=8),
    }

    def __init__(self, encoder: str | nn.Module = "timm:vit_tiny_patch16_224",
                 mask_ratio: float = 0.6, mask_patch_size: int = 32, norm_pix: bool = False,
                 loss_on: str = "masked", encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"SimMIM: mask_ratio must be in [0, 1), got {mask_ratio}")
        if loss_on not in LOSS_ON:
            raise ValueError(f"SimMIM: loss_on must be one of {LOSS_ON}, got {loss_on!r}")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        check_vit(self.encoder, "SimMIM")
        vit: Any = self.encoder  # a timm VisionTransformer (checked), duck-typed
        embed = vit.patch_embed
        grid = tuple(embed.grid_size)
        self.patch_size = p = int(embed.patch_size[0])
        if grid[0] != grid[1]:
            raise ValueError(f"SimMIM: the patch grid must be square, got {grid}")
        side = grid[0] * p
        if mask_patch_size % p or side % mask_patch_size:
            raise ValueError(f"SimMIM: mask_patch_size {mask_patch_size} must be a multiple of "
                             f"the patch size {p} and divide the image size {side}")
        self.grid, self.num_patches = grid[0], grid[0] * grid[1]
        self.mask_grid, self.mask_scale = side // mask_patch_size, mask_patch_size // p
        self.mask_ratio, self.mask_patch_size, self.loss_on = mask_ratio, mask_patch_size, loss_on
        self.prefix = int(vit.num_prefix_tokens)
        chans = int(embed.proj.in_channels)
        dim = width(self.encoder)
        self.mask_token = nn.Parameter(torch.zeros(1, dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02, a=-0.02, b=0.02)
        self.decoder = nn.Sequential(nn.Conv2d(dim, p * p * chans, kernel_size=1),
                                     nn.PixelShuffle(p))
        self.criterion = get_loss("simmim", norm_pix=norm_pix)

    def param_groups(self) -> list[ParamGroup]:
        """No weight decay on the class token and position embedding (the code's ViT
        ``no_weight_decay``: ``{'pos_embed', 'cls_token'}``); the mask token decays, as there."""
        tokens = [getattr(self.encoder, n) for n in ("cls_token", "pos_embed")]
        return [ParamGroup("vit_tokens", [t for t in tokens if isinstance(t, nn.Parameter)],
                           weight_decay=0.0)]

    def draw_masking(self, n: int, device: torch.device, noise: Tensor | None = None) -> Tensor:
        """This step's masks of ``n`` images, (n, L) bool over the patches, True = masked: the
        code's ``MaskGenerator`` (``ceil(units x ratio)`` random mask units, each repeated over
        its patches). ``noise`` (n, units): scores to rank instead of fresh uniform noise (the
        largest are masked); a test may replace the method."""
        g, s = self.mask_grid, self.mask_scale
        units = g * g
        coarse = random_masking(n, units, self.mask_ratio, noise=noise, device=device,
                                kept=units - math.ceil(units * self.mask_ratio)).mask
        fine = coarse.view(n, g, g).repeat_interleave(s, 1).repeat_interleave(s, 2)
        return fine.flatten(1)

    def reconstruct(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(tokens (N, prefix + L, D), reconstruction (N, C, H, W)) of images ``x`` with the
        patches where ``mask`` (N, L) is True replaced by the mask token."""
        tokens = masked_tokens(self.encoder, x, mask=mask, mask_token=self.mask_token)
        z = tokens[:, self.prefix:]
        n, length, d = z.shape
        side = math.isqrt(length)
        return tokens, self.decoder(z.transpose(1, 2).reshape(n, d, side, side))

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        (x,) = views_of(batch, "SimMIM", n=1)
        mask = self.draw_masking(x.shape[0], x.device)
        tokens, rec = self.reconstruct(x, mask)
        where = {"masked": mask, "visible": ~mask, "all": torch.ones_like(mask)}[self.loss_on]
        p = self.patch_size
        loss = self.criterion(patchify(rec, p), patchify(x, p), where)
        return {"loss": loss, "embeddings": F.normalize(tokens[:, 0].detach().float(), dim=1)}
