"""iBOT and DINOv2's objective: DINO on the class token, masked-patch self-distillation, KoLeo.

- iBOT: Zhou et al., "iBOT: Image BERT Pre-Training with Online Tokenizer", ICLR 2022 (arXiv
  2111.07832); the authors' bytedance/ibot (``main_ibot.py``: ``iBOTLoss``, ``train_one_epoch``;
  ``models/head.py``: ``iBOTHead``; ``loader.py``: ``ImageFolderMask``; README: ViT-S/16 run).
- DINOv2: Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision", TMLR
  2024 (arXiv 2304.07193); facebookresearch/dinov2 (``dinov2/train/ssl_meta_arch.py``,
  ``dinov2/loss/{dino_clstoken,ibot_patch,koleo}_loss.py``, ``dinov2/data/collate.py``,
  ``dinov2/configs/ssl_default_config.yaml`` and ``train/vitl14.yaml``).

One method, ``ibot``, covers both; DINOv2 is its presets (``dinov2`` and ``dinov2_in1k``:
KoLeo weight 0.1, Sinkhorn-Knopp centring for the former). One step (iBOT Algorithm 1, the codes'
``forward``)::

    teacher <- m * teacher + (1 - m) * student                 # m: cosine m0 -> 1
    M = block masks of the G global crops: a fraction p of the images masked, ratio U(r0, r1)
    T = teacher ViT(global crops)                               # unmasked, no gradient
    S = student ViT(global crops, masked patches -> mask token); s_v = student ViT(local crop v)
    q_cls = C(head_t(T[cls]), tau_t);  q_patch = C(patch_head_t(T[patches]), tau_p)
        C = softmax((x - c) / tau), c a running mean (iBOT, DINOv2's default config), or
            Sinkhorn-Knopp with epsilon tau over the global batch (DINOv2 vitl14)
    loss = w_dino * DINO(head(S[cls]), head(s_v) | q_cls)          # pairs (t, v != t), as DINO
         + w_ibot * mean_image mean_masked CE(q_patch, softmax(patch_head(S[patches]) / tau_s))
         + w_koleo * sum over the global crops of KoLeo(S[cls])     # before the head, per process

The DINO term is :func:`~contrastive.losses.clustering.dino` and the patch term
:func:`~contrastive.losses.dinov2.ibot_patch`; with Sinkhorn-Knopp the codes' targets are
probabilities, passed as their logarithm at temperature 1 (softmax(log q) = q);
:func:`~contrastive.losses.clustering.sinkhorn_knopp` is SwAV's and DINOv2's
``sinkhorn_knopp_teacher`` (3 iterations, the same normalisations; the patch rows are the
masked ones only, as DINOv2). KoLeo runs per process as DINOv2 computes it (no gather): a
run on P processes of B images is not the same as one of P * B images in that term.

Masks (:meth:`IBOT.draw_masks`): iBOT's block masks (:func:`~contrastive.nn.masking.block_masks`,
aspect 0.3 - 1/0.3) on ``int(p * n)`` of the n global-crop images chosen at random, each with
ratio uniform in [r0, r1]. This is DINOv2's count (its ``collate_data_and_cast``, which also
spreads the ratios over [r0, r1] by strata; here they are drawn independently) and iBOT's
expectation (``--pred_ratio 0 0.3 --pred_ratio_var 0 0.2``: each crop unmasked or masked at
U(0.1, 0.5) with probability 1/2 each). Heads: one :class:`~contrastive.methods.dino.DINOHead`
for the class and patch tokens (``shared_head``: iBOT's README runs ``--shared_head true``,
DINOv2's default ``ibot.separate_head: false``) or a second one for the patches (DINOv2
vitl14). The running centres follow iBOT's ``update_center``: the class centre over the global
crops' teacher outputs, the patch centre over every patch (``patch_center_tokens="all"``), or
over the masked patches only as DINOv2's ``iBOTPatchLoss.update_center`` (``"masked"``, its
presets); the heads run on the masked patches only, save the teacher's under iBOT's patch
centre (that centre needs them all). DINOv2's optimiser groups (layer-wise lr decay, patch-embedding
lr factor) are :meth:`IBOT.param_groups` with ``layer_decay`` / ``patch_embed_lr_scale``; its last
layer frozen by a zero lr is ``freeze_last_layer_by="lr"``, its clipping of each student part apart
``clip_mode="part"`` (:meth:`IBOT.clip_parts`; iBOT's presets clip each parameter apart,
``clip_mode="parameter"``, as its ``utils.clip_gradients``), its drop path equal in every block the encoder's
``drop_path_uniform`` (all set by the DINOv2 presets). The encoder must be a timm ViT; local crops
of another size need ``dynamic_img_size=True`` (timm resamples the position embedding, as the codes'
``interpolate_pos_encoding``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses.clustering import dino, dino_center, sinkhorn_knopp
from contrastive.losses.dinov2 import ibot_patch, koleo
from contrastive.methods._common import check_layer_decay, vit_layer_groups, width
from contrastive.methods.base import (
    FROZEN_BY,
    Method,
    ParamGroup,
    Schedule,
    check_clip_mode,
    clip_parts_by,
    read,
    views_of,
)
from contrastive.methods.dino import (
    DINOHead,
    build_teacher,
    last_layer_groups,
    teacher_schedules,
    teacher_step_spans,
)
from contrastive.methods.registry import register_method
from contrastive.nn import resolve_encoder
from contrastive.nn.masked_vit import check_vit, masked_tokens
from contrastive.nn.masking import block_masks

__all__ = ["IBOT"]

CENTERING = ("mean", "sinkhorn", "none")
PATCH_CENTER_TOKENS = ("all", "masked")


def _pack(rows: Tensor, packed: Tensor) -> Tensor:
    """(M, K) rows -> (N, W, K), zeros where ``packed`` (N, W) is False (M True entries)."""
    out = rows.new_zeros(*packed.shape, rows.shape[-1])
    return out.masked_scatter(packed.unsqueeze(-1), rows)


@register_method("ibot")
class IBOT(Method):
    """iBOT / DINOv2-style self-distillation of a timm ViT (global crops first in the views).

    Args:
        encoder: a timm ViT name or module (``self.encoder``; its class token is the feature).
        out_dim, hidden_dim, bottleneck_dim, head_layers, norm_last_layer: the DINO head.
        shared_head: one head for class and patch tokens; else a second one with
            ``patch_out_dim`` (None: ``out_dim``) prototypes for the patches.
        momentum: m0 of the teacher's cosine schedule to 1.
        student_temperature: 0.1 (both codes, both terms).
        teacher_temperature, warmup_teacher_temperature: the final and starting teacher
            temperatures of the class term, warmed up linearly over ``warmup_teacher_steps``.
        teacher_patch_temperature, warmup_teacher_patch_temperature: the same for the patch term.
        centering: "mean" (running centres, ``center_momentum``), "sinkhorn" (Sinkhorn-Knopp,
            ``sinkhorn_iterations``) or "none" (no centring: the collapse control).
        mask_probability, mask_ratio: fraction of the global-crop images masked and the
            (min, max) of their masked fraction; min_aspect: the blocks' aspect range.
        dino_weight, ibot_weight, koleo_weight: the three terms' weights.
        patch_center_tokens: the teacher patches the running patch centre averages: "all"
            (iBOT's ``update_center``) or "masked" (DINOv2's: the masked ones only, their mean
            on each process, averaged over the processes); only with ``centering="mean"``.
        num_global: global crops (the first views; same size).
        weight_decay / weight_decay_end, freeze_last_layer_steps: as :class:`DINO`.
        freeze_last_layer_by: how the last layer is frozen: "grad" (its gradients dropped:
            DINO's and iBOT's ``cancel_gradients_last_layer``) or "lr" (its lr 0, AdamW's
            moments still moving: DINOv2's ``last_layer_lr_schedule``); see
            :class:`~contrastive.methods.ParamGroup`.
        clip_mode: what ``--clip-grad-norm`` clips apart (:meth:`clip_parts`): "all"
            parameters together (the engine's default); each "part", the student ViT (with the
            mask token), the head and the patch head, as DINOv2's ``do_train``
            (``dinov2/train/train.py``: ``for v in model.student.values():
            v.clip_grad_norm_(cfg.optim.clip_grad)``); or each "parameter", as iBOT's
            ``utils.clip_gradients`` (each gradient times min(1, clip / (|g| + 1e-6))).
        layer_decay, patch_embed_lr_scale: DINOv2's layer-wise lr decay of the student ViT and
            the extra factor of its patch embedding (``optim.layerwise_decay``,
            ``optim.patch_embed_lr_mult``; :func:`~contrastive.methods._common.vit_layer_groups`,
            the mask token at layer 0 with the embeddings); 1.0 and 1.0: one lr for all.
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    center: Tensor  # buffer (out_dim,): running mean of the teacher's class outputs
    center_patch: Tensor  # buffer (patch_out_dim,): running mean of its patch outputs
    needs = ("views",)
    #: the student ViT runs through ``masked_tokens`` (mask tokens swapped in), not its forward:
    #: gradient caching cannot stand in for it; and the loss couples the batch (KoLeo's nearest
    #: neighbours, the Sinkhorn codes, the centre and the teacher's EMA once per step), so
    #: --grad-accum-steps is refused
    backbones = ()
    couples_samples = True
    #: the teacher's backbone is exported and evaluated (bytedance/ibot evaluation/eval_knn.py,
    #: eval_linear.py: ``--checkpoint_key teacher``)
    evaluated = "teacher.module.encoder"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # iBOT README, ViT-S/16 800 epochs: --teacher_temp 0.07 --warmup_teacher_temp_epochs 30
        # --norm_last_layer false --shared_head true --out_dim 8192 --pred_ratio 0 0.3
        # --pred_ratio_var 0 0.2; main_ibot.py defaults: momentum 0.996, warm-up temperatures
        # 0.04, patch temperature 0.07, student 0.1, centre momenta 0.9, lambda1 = lambda2 = 1,
        # drop path 0.1; train_one_epoch: each parameter's gradient clipped apart
        # (utils.clip_gradients, --clip_grad 3.0)
        "vit_small": dict(encoder="timm:vit_small_patch16_224", out_dim=8192, shared_head=True,
                          norm_last_layer=False, momentum=0.996, teacher_temperature=0.07,
                          warmup_teacher_temperature=0.04, teacher_patch_temperature=0.07,
                          warmup_teacher_patch_temperature=0.04, centering="mean",
                          mask_probability=0.5, mask_ratio=(0.1, 0.5), koleo_weight=0.0,
                          clip_mode="parameter",
                          encoder_kwargs=dict(dynamic_img_size=True, drop_path_rate=0.1)),
        # DINOv2 ssl_default_config.yaml (= train/vitl16_short.yaml, ImageNet-1k): ViT-L/16
        # (student.arch, patch_size), 65536 prototypes (dino.head_n_prototypes), head shared
        # (ibot.separate_head false), momentum 0.992 (teacher.momentum_teacher), teacher 0.04 ->
        # 0.07 over 30 epochs for both terms (teacher.*), centring by running mean
        # (train.centering "centering"; the patch centre over the masked patches:
        # ssl_meta_arch.py), KoLeo 0.1 (dino.koleo_loss_weight), masks on half the images at
        # 0.1-0.5 (ibot.mask_sample_probability, mask_ratio_min_max), layerscale 1e-5, drop
        # path 0.3 in every block (student.drop_path_rate, drop_path_uniform true: timm's
        # would grow linearly to it), layer-wise lr decay 0.9 and patch-embedding lr x 0.2
        # (optim.layerwise_decay, patch_embed_lr_mult); DINOHead's weight norm is trainable
        # (norm_last_layer false); train/train.py: the last layer frozen by a zero lr
        # (build_schedulers), the gradient clipped per student part (do_train)
        "dinov2_in1k": dict(encoder="timm:vit_large_patch16_224", out_dim=65536,
                            shared_head=True, norm_last_layer=False, momentum=0.992,
                            teacher_temperature=0.07, warmup_teacher_temperature=0.04,
                            teacher_patch_temperature=0.07,
                            warmup_teacher_patch_temperature=0.04, centering="mean",
                            patch_center_tokens="masked",
                            mask_probability=0.5, mask_ratio=(0.1, 0.5), koleo_weight=0.1,
                            layer_decay=0.9, patch_embed_lr_scale=0.2,
                            freeze_last_layer_by="lr", clip_mode="part",
                            encoder_kwargs=dict(dynamic_img_size=True, drop_path_rate=0.3,
                                                drop_path_uniform=True, init_values=1e-5)),
        # DINOv2 train/vitl14.yaml (LVD-142M): Sinkhorn-Knopp centring, separate heads of
        # 131072 prototypes with a 384-d bottleneck, momentum 0.994, drop path 0.4 (uniform:
        # the default config's drop_path_uniform), no
        # layer-wise lr decay (optim.layerwise_decay 1.0), the default config's
        # patch-embedding lr x 0.2, on timm's DINOv2 ViT-L/14 at 224 px (layerscale 1e-5; its
        # SwiGLU FFN is not reproduced); patch_center_tokens as DINOv2 (no running centre here);
        # last layer frozen by lr 0 and clipping per part as "dinov2_in1k"
        "dinov2": dict(encoder="timm:vit_large_patch14_dinov2", out_dim=131072,
                       bottleneck_dim=384, shared_head=False, norm_last_layer=False,
                       momentum=0.994, teacher_temperature=0.07, warmup_teacher_temperature=0.04,
                       teacher_patch_temperature=0.07, warmup_teacher_patch_temperature=0.04,
                       centering="sinkhorn", patch_center_tokens="masked",
                       mask_probability=0.5, mask_ratio=(0.1, 0.5), koleo_weight=0.1,
                       layer_decay=1.0, patch_embed_lr_scale=0.2,
                       freeze_last_layer_by="lr", clip_mode="part",
                       encoder_kwargs=dict(img_size=224, dynamic_img_size=True,
                                           drop_path_rate=0.4, drop_path_uniform=True)),
        # CIFAR scale (no paper setting): ViT-Tiny at 32 px with 4-px patches (64 tokens), the
        # iBOT settings (each parameter clipped apart included) with DINO's CIFAR head (4096
        # prototypes)
        "cifar": dict(encoder="timm:vit_tiny_patch16_224", out_dim=4096, shared_head=True,
                      norm_last_layer=False, momentum=0.996, teacher_temperature=0.07,
                      warmup_teacher_temperature=0.04, teacher_patch_temperature=0.07,
                      warmup_teacher_patch_temperature=0.04, centering="mean",
                      mask_probability=0.5, mask_ratio=(0.1, 0.5), koleo_weight=0.0,
                      clip_mode="parameter",
                      encoder_kwargs=dict(img_size=32, patch_size=4, dynamic_img_size=True)),
        # CIFAR scale of DINOv2's objective and optimiser groups (no paper setting): the
        # "cifar" ViT-Tiny and head with Sinkhorn-Knopp centring (vitl14.yaml), KoLeo 0.1,
        # layer-wise lr decay 0.9 and patch-embedding lr x 0.2 (ssl_default_config.yaml), the
        # last layer frozen by lr 0 and clipping per part (train/train.py)
        "dinov2_cifar": dict(encoder="timm:vit_tiny_patch16_224", out_dim=4096, shared_head=True,
                             norm_last_layer=False, momentum=0.996, teacher_temperature=0.07,
                             warmup_teacher_temperature=0.04, teacher_patch_temperature=0.07,
                             warmup_teacher_patch_temperature=0.04, centering="sinkhorn",
                             patch_center_tokens="masked", mask_probability=0.5,
                             mask_ratio=(0.1, 0.5), koleo_weight=0.1, layer_decay=0.9,
                             patch_embed_lr_scale=0.2, freeze_last_layer_by="lr",
                             clip_mode="part",
                             encoder_kwargs=dict(img_size=32, patch_size=4,
                                                 dynamic_img_size=True)),
    }

    def __init__(self, encoder: str | nn.Module = "timm:vit_tiny_patch16_224",
                 out_dim: int = 8192, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 head_layers: int = 3, norm_last_layer: bool = True, shared_head: bool = True,
                 patch_out_dim: int | None = None, momentum: float = 0.996,
                 student_temperature: float = 0.1, teacher_temperature: float = 0.04,
                 warmup_teacher_temperature: float | None = None,
                 teacher_patch_temperature: float = 0.07,
                 warmup_teacher_patch_temperature: float | None = 0.04,
                 warmup_teacher_steps: int = 0, centering: str = "mean",
                 center_momentum: float = 0.9, sinkhorn_iterations: int = 3,
                 mask_probability: float = 0.5, mask_ratio: tuple[float, float] = (0.1, 0.5),
                 min_aspect: float = 0.3, dino_weight: float = 1.0, ibot_weight: float = 1.0,
                 koleo_weight: float = 0.0, num_global: int = 2,
                 weight_decay: float | None = None, weight_decay_end: float | None = None,
                 freeze_last_layer_steps: int = 0, patch_center_tokens: str = "all",
                 layer_decay: float = 1.0, patch_embed_lr_scale: float = 1.0,
                 freeze_last_layer_by: str = "grad", clip_mode: str = "all",
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if centering not in CENTERING:
            raise ValueError(f"iBOT: centering must be one of {CENTERING}, got {centering!r}")
        if patch_center_tokens not in PATCH_CENTER_TOKENS:
            raise ValueError(f"iBOT: patch_center_tokens must be one of {PATCH_CENTER_TOKENS}, "
                             f"got {patch_center_tokens!r}")
        check_layer_decay("iBOT", layer_decay, patch_embed_lr_scale)
        check_clip_mode("iBOT", clip_mode)
        if freeze_last_layer_by not in FROZEN_BY:
            raise ValueError(f"iBOT: freeze_last_layer_by must be one of {FROZEN_BY}, got "
                             f"{freeze_last_layer_by!r}")
        if not 0.0 <= momentum <= 1.0 or not 0.0 <= center_momentum <= 1.0:
            raise ValueError(f"iBOT: momentum and center_momentum must be in [0, 1], got "
                             f"{momentum}, {center_momentum}")
        lo, hi = (float(r) for r in mask_ratio)
        if not 0.0 <= mask_probability <= 1.0 or not 0.0 <= lo <= hi < 1.0:
            raise ValueError(f"iBOT: need 0 <= mask_probability <= 1 and 0 <= mask_ratio[0] <= "
                             f"mask_ratio[1] < 1, got {mask_probability}, {mask_ratio}")
        if (weight_decay is None) != (weight_decay_end is None):
            raise ValueError("iBOT: give both weight_decay and weight_decay_end (the cosine "
                             "schedule), or neither")
        if num_global < 1:
            raise ValueError(f"iBOT: num_global must be >= 1, got {num_global}")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        check_vit(self.encoder, "iBOT")
        dim = width(self.encoder)
        self.head = DINOHead(dim, out_dim, hidden_dim, bottleneck_dim, head_layers,
                             norm_last_layer=norm_last_layer)
        patch_dim = out_dim if shared_head or patch_out_dim is None else patch_out_dim
        self.patch_head = None if shared_head else DINOHead(
            dim, patch_dim, hidden_dim, bottleneck_dim, head_layers,
            norm_last_layer=norm_last_layer)
        # iBOT's masked_embed / DINOv2's mask_token: a learned (1, D) token, zero at the start;
        # 2-d as in both codes (bytedance/ibot models/vision_transformer.py, dinov2
        # models/vision_transformer.py), so the ndim rule gives it weight decay as both do
        self.mask_token = nn.Parameter(torch.zeros(1, dim))
        parts = {"encoder": self.encoder, "head": self.head}
        if self.patch_head is not None:
            parts["patch_head"] = self.patch_head
        self.teacher = build_teacher(nn.ModuleDict(parts))
        self.register_buffer("center", torch.zeros(out_dim))
        self.register_buffer("center_patch", torch.zeros(patch_dim))
        self.base_momentum, self.num_global, self.centering = momentum, num_global, centering
        self.student_temperature, self.center_momentum = student_temperature, center_momentum
        self.sinkhorn_iterations = sinkhorn_iterations
        self.teacher_temperatures = (
            teacher_temperature if warmup_teacher_temperature is None
            else warmup_teacher_temperature, teacher_temperature, warmup_teacher_steps)
        self.teacher_patch_temperatures = (
            teacher_patch_temperature if warmup_teacher_patch_temperature is None
            else warmup_teacher_patch_temperature, teacher_patch_temperature,
            warmup_teacher_steps)
        self.mask_probability, self.mask_ratio, self.min_aspect = mask_probability, (lo, hi), \
            min_aspect
        self.weights = (dino_weight, ibot_weight, koleo_weight)
        self.weight_decays = (None if weight_decay is None or weight_decay_end is None
                              else (weight_decay, weight_decay_end))
        self.freeze_last_layer_steps = freeze_last_layer_steps
        self.freeze_last_layer_by, self.clip_mode = freeze_last_layer_by, clip_mode
        self.patch_center_tokens = patch_center_tokens
        self.layer_decay, self.patch_embed_lr_scale = layer_decay, patch_embed_lr_scale

    def schedules(self) -> dict[str, Schedule]:
        return teacher_schedules(
            self.base_momentum, {"teacher_temperature": self.teacher_temperatures,
                                 "teacher_patch_temperature": self.teacher_patch_temperatures},
            self.weight_decays)

    def step_spans(self) -> dict[str, int]:
        return teacher_step_spans(self)

    def param_groups(self) -> list[ParamGroup]:
        """DINOv2's layer-wise lr groups of the student ViT and its mask token (none at
        ``layer_decay = patch_embed_lr_scale = 1``), then the heads' frozen last layer (lr
        scale 1, as DINOv2's heads; frozen by ``freeze_last_layer_by``): disjoint parameters."""
        heads = [self.head] + ([self.patch_head] if self.patch_head is not None else [])
        return [*vit_layer_groups(self.encoder, self.layer_decay, self.patch_embed_lr_scale,
                                  embeddings=[self.mask_token]),
                *last_layer_groups(heads, self.freeze_last_layer_steps,
                                   self.freeze_last_layer_by)]

    def clip_parts(self) -> dict[str, list[nn.Parameter]]:
        """The student's parts for ``clip_mode``
        (:func:`~contrastive.methods.base.clip_parts_by`): DINOv2's (``ssl_meta_arch.py``:
        ``student_model_dict``) ``backbone`` (the ViT and the mask token, which DINOv2's
        backbone holds), ``dino_head`` and, when separate, ``ibot_head`` ("part"); each of
        their trainable parameters ("parameter"); none ("all")."""
        parts = {"backbone": [*self.encoder.parameters(), self.mask_token],
                 "dino_head": list(self.head.parameters())}
        if self.patch_head is not None:
            parts["ibot_head"] = list(self.patch_head.parameters())
        return clip_parts_by(self.clip_mode, parts)

    def draw_masks(self, n: int, height: int, width: int) -> Tensor:
        """(n, height * width) bool masks of n global-crop images (see the module docstring);
        the randomness follows torch's generator (``torch.manual_seed``)."""
        rng = random.Random(int(torch.randint(2**62, (1,))))
        masks = torch.zeros(n, height * width, dtype=torch.bool)
        count = int(self.mask_probability * n)
        if count:
            lo, hi = self.mask_ratio
            rows = torch.randperm(n)[:count]
            masks[rows] = block_masks(count, height, width, ratio=(lo + hi) / 2,
                                      ratio_var=(hi - lo) / 2, min_aspect=self.min_aspect,
                                      rng=rng)
        return masks

    def _patch_head(self) -> nn.Module:
        return self.head if self.patch_head is None else self.patch_head

    def _targets(self, logits: Tensor, center: Tensor, tau: float) -> tuple[Tensor, Tensor | None,
                                                                            float]:
        """The teacher's (logits, centre, temperature) for the losses: softmax((logits -
        centre) / temperature) is its target distribution."""
        if self.centering == "sinkhorn":
            q = sinkhorn_knopp(logits, epsilon=tau, iterations=self.sinkhorn_iterations)
            return q.clamp_min(torch.finfo(q.dtype).tiny).log(), None, 1.0
        return logits, center if self.centering == "mean" else None, tau

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "iBOT", min_n=max(2, self.num_global))
        m = read(batch, "momentum", "iBOT")
        tau_t = float(read(batch, "teacher_temperature", "iBOT"))
        tau_p = float(read(batch, "teacher_patch_temperature", "iBOT"))
        g, b = self.num_global, views[0].shape[0]
        if len({tuple(v.shape) for v in views[:g]}) != 1:
            raise ValueError(f"iBOT: the {g} global crops must have one size, got "
                             f"{[tuple(v.shape) for v in views[:g]]}")
        vit: Any = self.encoder  # a timm VisionTransformer (check_vit)
        if any(v.shape[-2:] != views[0].shape[-2:] for v in views[g:]) and \
                not getattr(vit, "dynamic_img_size", False):
            raise ValueError("iBOT: local crops of another size than the global ones need a ViT "
                             "built with dynamic_img_size=True (encoder_kwargs / "
                             "--encoder-kwargs '{\"dynamic_img_size\": true, ...}')")
        images = torch.cat(views[:g])  # (G B, C, H, W), crop-major
        ph, pw = vit.patch_embed.patch_size
        prefix = int(vit.num_prefix_tokens)  # class token (+ registers): not patches
        masks = self.draw_masks(g * b, images.shape[-2] // ph, images.shape[-1] // pw).to(
            images.device)
        with torch.no_grad():
            self.teacher.update(self._student_params(), m)
            parts: Any = self.teacher.module
            t_tokens = masked_tokens(parts["encoder"], images)
            t_cls = parts["head"](t_tokens[:, 0])  # (G B, K)
            t_patch_head = parts["patch_head" if "patch_head" in parts else "head"]
            # the heads run on the masked patches only (the loss reads nothing else), except
            # the teacher's under iBOT's running patch centre, which averages every patch
            center_all = self.centering == "mean" and self.patch_center_tokens == "all"
            t_all = t_patch_head(t_tokens[:, prefix:]) if center_all else None
            t_rows = t_all[masks] if t_all is not None else t_patch_head(
                t_tokens[:, prefix:][masks])  # (M, K'), image-major
            t_masked = t_rows  # the raw logits of the masked patches (DINOv2's centre)
        s_tokens = masked_tokens(self.encoder, images, mask=masks, mask_token=self.mask_token)
        s_cls = [s_tokens[:, 0]] + [masked_tokens(self.encoder, v)[:, 0] for v in views[g:]]
        student = self.head(torch.cat(s_cls)).reshape(len(views), b, -1).transpose(0, 1)
        s_rows = self._patch_head()(s_tokens[:, prefix:][masks])  # (M, K')

        cls_logits, cls_center, cls_tau = self._targets(t_cls, self.center, tau_t)
        dino_loss = dino(student, cls_logits.reshape(g, b, -1).transpose(0, 1), cls_center,
                         student_temperature=self.student_temperature,
                         teacher_temperature=cls_tau)
        # (M, K') rows -> (N, W, K'), each image's masked patches first (W: the most masked)
        counts = masks.sum(1)
        packed = torch.arange(int(counts.max()) if masks.any() else 1,
                              device=masks.device) < counts.unsqueeze(1)
        t_rows, patch_center, patch_tau = self._targets(t_rows, self.center_patch, tau_p)
        ibot_loss = ibot_patch(_pack(s_rows, packed), _pack(t_rows, packed), packed,
                               patch_center, student_temperature=self.student_temperature,
                               teacher_temperature=patch_tau)
        w_dino, w_ibot, w_koleo = self.weights
        loss = w_dino * dino_loss + w_ibot * ibot_loss
        koleo_loss = torch.zeros((), dtype=loss.dtype, device=loss.device)
        if w_koleo:
            koleo_loss = self.koleo_term(s_tokens[:, 0])
            loss = loss + w_koleo * koleo_loss
        with torch.no_grad():
            probs = F.softmax((cls_logits[:b] - (0 if cls_center is None else cls_center))
                              / cls_tau, dim=1)
            entropy = -(probs * probs.clamp_min(1e-12).log()).sum(1).mean()  # collapse monitor
            if self.centering == "mean":
                self.center.copy_(dino_center(self.center, t_cls,
                                              momentum=self.center_momentum))
                # iBOT: the mean over the images of their patches' mean; DINOv2: this
                # process's masked rows' mean (the current centre when it has none), averaged
                # over the processes (ibot_patch_loss.py, reduce_center_update)
                seen = t_all.mean(1) if t_all is not None else (
                    t_masked.mean(0, keepdim=True) if len(t_masked) else self.center_patch[None])
                self.center_patch.copy_(dino_center(self.center_patch, seen,
                                                    momentum=self.center_momentum))
        return {"loss": loss, "dino_loss": dino_loss.detach(), "ibot_loss": ibot_loss.detach(),
                "koleo_loss": koleo_loss.detach(), "teacher_entropy": entropy,
                "mask_fraction": masks.float().mean(),
                "embeddings": F.normalize(s_tokens[:b, 0].detach(), dim=1)}

    def koleo_term(self, cls_tokens: Tensor) -> Tensor:
        """KoLeo of the student's class tokens (G B, D) of the global crops, before the head:
        per global crop on this process's B rows, summed over the crops (DINOv2's
        ``ssl_meta_arch``: ``sum(koleo_loss(p) for p in student_cls_tokens.chunk(2))``)."""
        return torch.stack([koleo(c) for c in cls_tokens.chunk(self.num_global)]).sum()

    def _student_params(self) -> list[nn.Parameter]:
        """The student's parameters in the teacher's order (encoder, head[, patch head])."""
        heads = [self.head] + ([self.patch_head] if self.patch_head is not None else [])
        return [*self.encoder.parameters(), *(p for h in heads for p in h.parameters())]
