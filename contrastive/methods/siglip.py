"""SigLIP: image-text pre-training with the pairwise sigmoid loss.

Zhai, Mustafa, Kolesnikov, Beyer, "Sigmoid Loss for Language Image Pre-Training", ICCV 2023
(arXiv 2303.15343), Algorithm 1 and sec. 3.3. CLIP's two towers
(:class:`~contrastive.methods.dual_encoder.DualEncoder`, CLIP's base too), data, evaluation and
recipe conventions; only the loss differs (CLIP's softmax scale and its clamp are not here)::

    x = normalize(image_proj(image_encoder(image)))          # N x D, local
    y = normalize(text_proj(text_encoder(tokens)))           # N x D, local
    loss = siglip(x, y, scale=exp(t'), bias=b)               # one process
    loss = siglip_ring(x, y, scale=exp(t'), bias=b)          # several: texts passed round

- t' and b are the registry's ``siglip`` loss parameters (:class:`~contrastive.losses.modules.
  SigLIPLoss`), learnt, initialised t' = log 10, b = -10 (``presets["paper"]``; checked
  2026-11-27: the paper's sec. 3.2, "We initialize t' and b to log 10 and -10", and sec. 4.9 /
  Table 4, the default of all its experiments; open_clip ``open_clip_train/main.py`` with
  ``--siglip``: ``init_logit_scale = np.log(10)``, ``init_logit_bias = -10``; big_vision
  ``models/proj/image_text/two_towers.py`` learns t' with ``t = exp(t')`` from
  ``log(temperature_init)``; its public ``siglip_lit_coco.py`` example, a LiT fine-tune, sets
  ``temperature_init = 10`` but ``bias_init = -2.71``), no clamp (the paper states none; see
  SigLIPLoss), no weight decay (the towers' :meth:`param_groups`: ``ndim < 2``).
- The paper's training settings belong to its recipe, not to this module: ScalingViT-Adafactor
  by default (sec. 4), beta2 0.95 for Adam and Adafactor (sec. 4.7), batch 32k (sec. 4.2, 4.6).
  Its learning rate and weight decay for SigLIP from scratch were not found in the text read
  (sec. 4.4 gives the SigLiT-on-4-chips run: LION, lr 1e-4, decoupled weight decay 1e-7).
- Several processes: each process passes its LOCAL batch; the loss runs the paper's chunked
  exchange (each text chunk visits every process, autograd-aware), so no (M x M) matrix and no
  gather; the mean over processes with DDP's gradient average equals one process with the whole
  batch. The metrics (``pos_acc`` ...) are those of the local pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.losses.modules import SigLIPLoss
from contrastive.methods._common import in_batch_metrics
from contrastive.methods.dual_encoder import DualEncoder
from contrastive.methods.registry import register_method

__all__ = ["SigLIP"]


@register_method("siglip")
class SigLIP(DualEncoder):
    """SigLIP with CLIP's towers (see :class:`DualEncoder` for the encoders and the batch keys).

    Args:
        encoder, text_encoder, dim, encoder_kwargs, text_kwargs, lock_image: the towers
            (:class:`DualEncoder`).
        scale_init: t = exp(t') at init (10, the paper's).
        bias_init: b at init (-10, the paper's).
    """

    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # the paper's initialisation of the loss (sec. 3.2, Table 4; module docstring); the
        # towers' sizes are the recipe's (DualEncoderConfig), as CLIP's
        "paper": dict(scale_init=10.0, bias_init=-10.0),
    }

    def __init__(self, encoder: str | nn.Module = "small_cnn",
                 text_encoder: str | nn.Module = "bert", dim: int = 64,
                 scale_init: float = 10.0, bias_init: float = -10.0,
                 encoder_kwargs: dict[str, Any] | None = None,
                 text_kwargs: dict[str, Any] | None = None, lock_image: bool = False) -> None:
        super().__init__(encoder, text_encoder, dim, encoder_kwargs, text_kwargs, lock_image)
        self.criterion = cast(SigLIPLoss, get_loss("siglip", scale_init=scale_init,
                                                   bias_init=bias_init, normalize=False))

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        zi, zt = self.encode_pairs(batch)
        loss = self.criterion(zi, zt)  # the ring exchange on several processes
        cols = torch.arange(zi.shape[0], device=zi.device)
        metrics = in_batch_metrics(zi.detach(), zt.detach(), pos_col=cols)  # local pairs
        return {"loss": loss, **metrics,
                "logit_scale": self.criterion.log_scale.detach().exp(),
                "logit_bias": self.criterion.bias.detach(),
                "embeddings": zi.detach()}
