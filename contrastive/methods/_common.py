"""Small helpers shared by the methods: unit rows, cheap metrics, a ViT's layer-wise lr groups."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.methods.base import ParamGroup

__all__ = ["unit", "wide", "width", "queue_metrics", "in_batch_metrics", "check_layer_decay",
           "vit_layer_groups", "vit_layer_id", "batch_accuracy"]


def width(encoder: nn.Module) -> int:
    """The encoder's output width, its int ``num_features`` (the encoder contract of
    :func:`contrastive.nn.resolve_encoder`, which checks it; checked again here because
    ``nn.Module`` attributes are untyped)."""
    n = getattr(encoder, "num_features", None)
    if not isinstance(n, int):
        raise TypeError(f"encoder {type(encoder).__name__} must have an int attribute "
                        f"`num_features` (its output width), got {n!r}")
    return n


#: a timm ViT's parameters before the blocks: DINOv2's layer 0 (``get_vit_lr_decay_rate``:
#: pos_embed, patch_embed, mask_token, cls_token, register_tokens; timm names the registers
#: ``reg_token``)
_EMBEDDINGS = ("pos_embed", "patch_embed", "cls_token", "reg_token", "mask_token")


def check_layer_decay(what: str, layer_decay: float, patch_embed_lr_scale: float) -> None:
    """Raise a one-line ``ValueError`` unless 0 < ``layer_decay`` <= 1 and
    ``patch_embed_lr_scale`` >= 0 (both finite)."""
    if not 0.0 < layer_decay <= 1.0 or not (0.0 <= patch_embed_lr_scale < math.inf):
        raise ValueError(f"{what}: layer_decay must be in (0, 1] (1 = no layer-wise lr decay; "
                         f"DINOv2: 0.9) and patch_embed_lr_scale >= 0 (DINOv2: 0.2), got "
                         f"{layer_decay!r}, {patch_embed_lr_scale!r}")


def vit_layer_id(name: str, depth: int) -> int:
    """The layer id of a timm ``VisionTransformer``'s parameter ``name`` for layer-wise lr
    decay, the rule of BEiT, MAE (facebookresearch/mae ``util/lr_decay.py``,
    ``get_layer_id_for_vit``) and DINOv2: 0 for the embeddings (``patch_embed.*``,
    ``pos_embed``, ``cls_token``, ``reg_token``, a mask token), ``i + 1`` for ``blocks.i.*``,
    ``depth + 1`` for the rest (final norm, head); the scale of layer ``i`` is
    ``decay ** (depth + 1 - i)``, so the last block already trains at ``decay`` x the lr."""
    top, _, rest = name.partition(".")
    if top in _EMBEDDINGS:
        return 0
    if top == "blocks":
        return int(rest.partition(".")[0]) + 1
    return depth + 1


def vit_layer_groups(vit: nn.Module, layer_decay: float = 1.0, patch_embed_lr_scale: float = 1.0,
                     *, embeddings: Sequence[nn.Parameter] = ()) -> list[ParamGroup]:
    """Layer-wise lr decay of a timm ``VisionTransformer`` as :class:`ParamGroup` s with an
    ``lr_scale``, DINOv2's rule (facebookresearch/dinov2 ``dinov2/utils/param_groups.py``:
    ``get_vit_lr_decay_rate``, ``get_params_groups_with_decay``).

    With L = ``len(vit.blocks)``, each trainable parameter gets a layer id: 0 for the
    embeddings (``patch_embed.*``, ``pos_embed``, ``cls_token``, ``reg_token``, and
    ``embeddings``, e.g. a method's mask token that DINOv2 keeps in its backbone), i + 1 for
    ``blocks.i.*``, L + 1 for the rest (final ``norm``, ``fc_norm``, a head). Its scale of the
    scheduled lr is ``layer_decay ** (L + 1 - id)``, times ``patch_embed_lr_scale`` for
    ``patch_embed.*``. Modules outside the ViT (DINOv2's heads) keep scale 1.

    Only the parameters whose scale is not 1 are returned (one group per scale, named after
    its layer), so ``(1.0, 1.0)`` returns ``[]``: the optimiser's groups stay as without it.
    Weight decay stays the engine's rule (none on ``ndim <= 1``: biases, norms, layer-scale
    gammas, as DINOv2's ``.bias`` / ``norm`` / ``gamma`` names; see
    :mod:`contrastive.engine.optim`), so a weight-decay schedule reaches every weight.
    """
    check_layer_decay("vit_layer_groups", layer_decay, patch_embed_lr_scale)
    blocks = getattr(vit, "blocks", None)
    if not isinstance(blocks, nn.Sequential | nn.ModuleList):
        raise TypeError(f"vit_layer_groups: expected a timm VisionTransformer (with .blocks), "
                        f"got {type(vit).__name__}")
    depth = len(blocks)
    named = [(n, p) for n, p in vit.named_parameters()] + [("mask_token", p) for p in embeddings]
    groups: dict[str, tuple[float, list[nn.Parameter]]] = {}
    for name, p in named:
        layer = vit_layer_id(name, depth)
        if not p.requires_grad or layer == depth + 1:
            continue  # layer L + 1: scale 1, the run's own groups
        top = name.partition(".")[0]
        group = "patch_embed" if top == "patch_embed" else f"layer{layer}"
        scale = layer_decay ** (depth + 1 - layer)
        if top == "patch_embed":
            scale *= patch_embed_lr_scale
        if scale != 1.0:
            groups.setdefault(group, (scale, []))[1].append(p)
    return [ParamGroup(f"vit_{name}", params, lr_scale=scale)
            for name, (scale, params) in groups.items()]


def wide(x: Tensor) -> Tensor:
    """``x`` in float32 when it is in a narrower float type; float64 stays float64.

    The losses follow the same rule (float32 maths under bf16/fp16, float64 kept), so a method
    run in float64 computes in float64 throughout: that is how the tests compare several
    training steps with the formula written plainly, free of float32 rounding.
    """
    return x if x.dtype == torch.float64 else x.float()


def unit(x: Tensor) -> Tensor:
    """L2-normalise rows in float32 or wider (also under autocast), (N, D) -> (N, D)."""
    return F.normalize(wide(x), dim=1)



def batch_accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """The batch's top-1 accuracy in percent (a 0-dim float tensor, detached: a step metric, no
    host sync): the share of rows whose largest (N, C) logit is at their (N,) label."""
    return (logits.detach().argmax(1) == labels).float().mean() * 100.0


def _metrics(pos: Tensor, neg_max: Tensor, neg_sum: Tensor, neg_count: Tensor | int) -> dict:
    return {
        "pos_acc": (pos >= neg_max).float().mean() * 100.0,
        "pos_sim": pos.mean(),
        "neg_sim": neg_sum / neg_count,
    }


def _exact(fn: Callable[..., dict[str, Tensor]]) -> Callable[..., dict[str, Tensor]]:
    """Run a metric without gradient and without autocast (fp32 similarities, as the loss)."""

    @functools.wraps(fn)
    def wrapper(first: Tensor, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        with torch.no_grad(), torch.autocast(first.device.type, enabled=False):
            return fn(first, *args, **kwargs)

    return wrapper


@_exact
def queue_metrics(q: Tensor, k: Tensor, queue: Tensor) -> dict[str, Tensor]:
    """Metrics of MoCo's logits ``[q.k+, q.queue^T]`` (q, k: (N, D), queue: (K, D), unit rows).

    ``pos_acc``: % of queries whose positive is top-1 (>= every negative); ``pos_sim`` /
    ``neg_sim``: mean cosine similarity to the positive / to the negatives. On the device, no
    host sync.
    """
    pos = (wide(q) * wide(k)).sum(dim=1)
    neg = wide(q) @ wide(queue).T  # N x K
    return _metrics(pos, neg.max(dim=1).values, neg.sum(), neg.numel())


@_exact
def in_batch_metrics(
    anchors: Tensor, candidates: Tensor, pos_col: Tensor, self_col: Tensor | None = None
) -> dict[str, Tensor]:
    """The same metrics for in-batch negatives (SimCLR, MoCo v3).

    anchors (A, D), candidates (C, D) unit rows; ``candidates[pos_col[a]]`` is anchor a's
    positive, ``candidates[self_col[a]]`` the anchor itself (excluded); every other candidate
    is a negative.
    """
    sim = wide(anchors) @ wide(candidates).T  # A x C
    rows = torch.arange(sim.shape[0], device=sim.device)
    pos = sim[rows, pos_col]
    neg_mask = torch.ones_like(sim, dtype=torch.bool)
    neg_mask[rows, pos_col] = False
    if self_col is not None:
        neg_mask[rows, self_col] = False
    neg_max = sim.masked_fill(~neg_mask, float("-inf")).max(dim=1).values
    return _metrics(pos, neg_max, (sim * neg_mask).sum(), neg_mask.sum().clamp(min=1))
