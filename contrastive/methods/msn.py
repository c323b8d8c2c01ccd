"""MSN: masked siamese networks; PMSN: the same with a power-law prior over the prototypes.

- MSN: Assran et al., "Masked Siamese Networks for Label-Efficient Learning", ECCV 2022 (arXiv
  2204.07141); the authors' facebookresearch/msn (``src/msn_train.py``: ``main``, ``init_model``,
  ``init_opt``; ``src/deit.py``: ``VisionTransformer.forward``, ``forward_features``;
  ``src/losses.py``; ``configs/pretrain/msn_vits16.yaml``).
- PMSN: Assran et al., "The Hidden Uniform Cluster Prior in Self-Supervised Learning", ICLR 2023
  (arXiv 2210.07277): ``prior="power_law"`` (:mod:`contrastive.losses.masked_siamese`).

One step (the code's ``train_step``)::

    teacher <- m * teacher + (1 - m) * student      # encoder and head; m: 0.996 -> 1, linear
                                                    # over 1.25 x the run (the code's schedule)
    h = head_t(ViT_t(views[0]))                     # the target view, no gradient
    z = head(ViT(anchor views))                     # views[1:]: the leading views of the first
        # anchor's size ("random views") lose a fraction patch_drop of their patches (one
        # random subset for the batch, after the position embedding, class token kept); the
        # rest ("focal views") run whole; each size group through the head apart (its BN)
    loss = msn(cos(h, P), cos(z, P))                # P: K learnable prototypes (no decay)
         = CE(sharpen + Sinkhorn targets, softmax(cos / 0.1)) + 1 * me-max  (PMSN: + KL to a
           power law)

The head is the code's ``init_model``: Linear(D, 2048), BN, GELU, Linear(2048, 2048), BN,
GELU, Linear(2048, 256), weights trunc-normal 0.02, biases 0. Prototypes: uniform in
+-1 / sqrt(256) (``main``). Declared schedules: ``momentum``; ``weight_decay`` (cosine
``weight_decay`` -> ``weight_decay_end`` over 1.25 x the run, the code's ``CosineWDSchedule``)
when given.

Shifts, so that each step uses the code's values: the code updates the teacher after the
optimiser step with m_i, i = 0, 1, ...; here the update opens the next step, so step s (s >= 1)
uses m_(s-1) (step 0's update is a no-op: teacher = student); the code's weight-decay
scheduler steps before its optimiser step, so step s uses its value at s + 1.

Gradient accumulation and caching are refused: the mean prediction of me-max and the Sinkhorn
targets are statistics of the whole batch (``couples_samples``), and the student's ViT runs on
masked token sequences, not as ``backbone(images)``.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.losses.masked_siamese import msn_targets, msn_terms, power_law_prior
from contrastive.methods._common import width
from contrastive.methods.base import Method, ParamGroup, Schedule, read, views_of
from contrastive.methods.dino import _cosine_value, build_teacher
from contrastive.methods.registry import register_method
from contrastive.nn import build_mlp, resolve_encoder
from contrastive.nn.masked_vit import check_vit, masked_tokens

__all__ = ["MSN", "PRIORS"]

#: what the regulariser matches the mean prediction to: MSN's uniform (me-max), PMSN's power law
PRIORS = ("uniform", "power_law")
#: the code's schedules run over 1.25 x the run (``ipe * num_epochs * 1.25``), so they end short
#: of their final values
SCHEDULE_STRETCH = 1.25


def msn_head(in_dim: int, hidden_dim: int = 2048, out_dim: int = 256,
             use_bn: bool = True) -> nn.Sequential:
    """The code's projection head (``init_model``): 3 Linear layers, BN + GELU between them."""
    head = build_mlp(in_dim, hidden_dim, out_dim, 3, hidden_bn=use_bn, bias=True,
                     activation=nn.GELU)
    for m in head.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
    return head


def _linear_momentum(step: int, total: int, *, m0: float) -> float:
    """The code's ``momentum_scheduler`` (0.996 + i (1 - 0.996) / (1.25 T)) at i = step - 1."""
    return m0 + (1.0 - m0) * max(step - 1, 0) / (SCHEDULE_STRETCH * total)


def _weight_decay(step: int, total: int, *, start: float, end: float) -> float:
    """The code's ``CosineWDSchedule`` after step + 1 calls (T_max = int(1.25 T))."""
    return _cosine_value(step + 1, int(SCHEDULE_STRETCH * total), start=start, end=end)


@register_method("msn")
class MSN(Method):
    """MSN / PMSN on a timm ViT (the module docstring). ``views[0]`` is the target view, the
    others are anchors: the random views (masked) first, then the focal views.

    Args:
        encoder: a timm ViT name or module (``self.encoder``).
        hidden_dim, out_dim, use_bn: the head (2048, 256, True).
        num_prototypes: K (1024).
        temperature: the anchors' softmax temperature (0.1); sharpen_temperature: the target's
            sharpening T (0.25: its temperature is 0.1 x 0.25 = 0.025).
        sinkhorn_iterations: on the targets (3; 0 = none).
        regularization_weight: of me-max / the prior's KL (1).
        prior: "uniform" (MSN's me-max) or "power_law" (PMSN, exponent ``power_law_exponent``).
        patch_drop: fraction of the random views' patches dropped (ViT-S/16: 0.15).
        momentum: the teacher's m0 (0.996, linear to 1 over 1.25 x the run).
        weight_decay / weight_decay_end: the cosine weight-decay schedule (None: the run's).
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs = ("views",)
    couples_samples = True  # me-max's mean prediction and Sinkhorn: the whole batch
    backbones: tuple[str, ...] = ()  # the ViT runs on dropped-patch sequences
    #: the target encoder is exported and evaluated (facebookresearch/msn logistic_eval.py and
    #: linear_eval.py load ``checkpoint['target_encoder']``)
    evaluated = "teacher.module.0"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # configs/pretrain/msn_vits16.yaml: deit_small (timm's ViT-S/16: qkv bias, LayerNorm
        # eps 1e-6), drop_path_rate 0.0, hidden 2048, output 256, use_bn, 1024 prototypes,
        # temperature 0.1, sharpen 0.25, Sinkhorn, me-max weight 1, patch_drop 0.15;
        # msn_train.py: momentum 0.996 -> 1; dynamic_img_size for the 96-px focal views (the
        # code's interpolate_pos_encoding)
        "vit_small": dict(encoder="timm:vit_small_patch16_224", hidden_dim=2048, out_dim=256,
                          num_prototypes=1024, patch_drop=0.15, momentum=0.996,
                          encoder_kwargs=dict(dynamic_img_size=True)),
        # the CIFAR recipe's ViT-Tiny at 32 px with 4-px patches (ibot_cifar's), the rest as
        # above
        "cifar": dict(encoder="timm:vit_tiny_patch16_224", hidden_dim=2048, out_dim=256,
                      num_prototypes=1024, patch_drop=0.15, momentum=0.996,
                      encoder_kwargs=dict(img_size=32, patch_size=4, dynamic_img_size=True)),
    }

    def __init__(self, encoder: str | nn.Module = "timm:vit_small_patch16_224",
                 hidden_dim: int = 2048, out_dim: int = 256, use_bn: bool = True,
                 num_prototypes: int = 1024, temperature: float = 0.1,
                 sharpen_temperature: float = 0.25, sinkhorn_iterations: int = 3,
                 regularization_weight: float = 1.0, prior: str = "uniform",
                 power_law_exponent: float = 0.25, patch_drop: float = 0.15,
                 momentum: float = 0.996, weight_decay: float | None = None,
                 weight_decay_end: float | None = None,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if prior not in PRIORS:
            raise ValueError(f"MSN: prior must be one of {PRIORS} (power_law: PMSN), got "
                             f"{prior!r}")
        if not 0.0 <= patch_drop < 1.0 or not 0.0 <= momentum <= 1.0 or num_prototypes < 1:
            raise ValueError(f"MSN: need patch_drop in [0, 1) (ViT-S/16: 0.15), momentum in "
                             f"[0, 1] and num_prototypes >= 1; got {patch_drop}, {momentum}, "
                             f"{num_prototypes}")
        if (weight_decay is None) != (weight_decay_end is None):
            raise ValueError("MSN: give both weight_decay and weight_decay_end (the cosine "
                             "schedule), or neither")
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        check_vit(self.encoder, "MSN")
        self.head = msn_head(width(self.encoder), hidden_dim, out_dim, use_bn)
        bound = 1.0 / math.sqrt(out_dim)
        self.prototypes = nn.Parameter(torch.empty(num_prototypes, out_dim).uniform_(-bound,
                                                                                     bound))
        self.teacher = build_teacher(nn.Sequential(self.encoder, self.head))
        self.temperature, self.sharpen_temperature = temperature, sharpen_temperature
        self.sinkhorn_iterations, self.regularization_weight = sinkhorn_iterations, \
            regularization_weight
        self.prior, self.power_law_exponent = prior, power_law_exponent
        self.patch_drop, self.base_momentum = patch_drop, momentum
        self.weight_decays = (None if weight_decay is None or weight_decay_end is None
                              else (weight_decay, weight_decay_end))

    @classmethod
    def options_of(cls, cfg: Any) -> dict[str, Any]:
        """The keyword arguments of ``MSN`` (but the encoder's) that ``cfg`` (a recipe's
        configuration) has as fields, by name."""
        return {n: getattr(cfg, n) for n in _OPTIONS if hasattr(cfg, n)}

    def schedules(self) -> dict[str, Schedule]:
        out: dict[str, Schedule] = {
            "momentum": functools.partial(_linear_momentum, m0=self.base_momentum)}
        if self.weight_decays is not None:
            out["weight_decay"] = functools.partial(_weight_decay, start=self.weight_decays[0],
                                                    end=self.weight_decays[1])
        return out

    def param_groups(self) -> list[ParamGroup]:
        """The prototypes without weight decay (the code's ``init_opt``: ``WD_exclude``)."""
        return [ParamGroup("prototypes", [self.prototypes], weight_decay=0.0)]

    def clip_parts(self) -> dict[str, list[nn.Parameter]]:
        """``--clip-grad-norm`` on the encoder and head together (the code's
        ``clip_grad_norm_(encoder.parameters())``); the prototypes, which the code does not
        clip, form the engine's one more part, clipped apart."""
        return {"encoder": [*self.encoder.parameters(), *self.head.parameters()]}

    def draw_keep(self, n: int, length: int) -> Tensor:
        """(n, kept) patch positions the random views keep: one random subset of
        floor(length (1 - patch_drop)) for the whole batch (the code's ``forward_features``),
        from torch's generator."""
        kept = int(math.floor(length * (1.0 - self.patch_drop)))
        return torch.randperm(length)[:kept].expand(n, -1)

    def _anchors(self, anchors: list[Tensor]) -> Tensor:
        """(V B, out_dim) head outputs of the anchor views, view-major: each run of equal-sized
        views through the ViT and the head together, the first run with dropped patches."""
        out, start = [], 0
        while start < len(anchors):
            end = start + 1
            while end < len(anchors) and anchors[end].shape[-2:] == anchors[start].shape[-2:]:
                end += 1
            x = torch.cat(anchors[start:end])
            if start == 0 and self.patch_drop > 0:
                vit: Any = self.encoder
                ph, pw = vit.patch_embed.patch_size
                keep = self.draw_keep(len(x), (x.shape[-2] // ph) * (x.shape[-1] // pw))
                feats = masked_tokens(vit, x, keep=keep.to(x.device))[:, 0]
            else:
                feats = self.encoder(x)
            out.append(self.head(feats))
            start = end
        return torch.cat(out)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "MSN", min_n=2)
        m = read(batch, "momentum", "MSN")
        b = views[0].shape[0]
        with torch.no_grad():
            self.teacher.update([*self.encoder.parameters(), *self.head.parameters()], m)
            target = self.teacher(views[0])  # B x out_dim
        anchors = self._anchors(views[1:])  # (V B) x out_dim, view-major
        prototypes = F.normalize(self.prototypes, dim=1)  # K x out_dim
        anchor_scores = F.normalize(anchors.reshape(len(views) - 1, b, -1).transpose(0, 1),
                                    dim=2) @ prototypes.T  # B x V x K
        targets = msn_targets(F.normalize(target, dim=1) @ prototypes.T,
                              temperature=self.temperature,
                              sharpen_temperature=self.sharpen_temperature,
                              sinkhorn_iterations=self.sinkhorn_iterations)  # B x K, no grad
        prior = None if self.prior == "uniform" else power_law_prior(
            len(self.prototypes), self.power_law_exponent, dtype=targets.dtype,
            device=targets.device)
        ce, reg = msn_terms(anchor_scores, targets, temperature=self.temperature, prior=prior)
        return {"loss": ce + self.regularization_weight * reg, "msn_ce": ce.detach(),
                "regularizer": reg.detach(), "target_max": targets.max(dim=1).values.mean(),
                "embeddings": F.normalize(target.detach().float(), dim=1)}


#: MSN's keyword arguments but the encoder's: what :meth:`MSN.options_of` reads from a config
_OPTIONS = tuple(n for n in inspect.signature(MSN.__init__).parameters
                 if n not in ("self", "encoder", "encoder_kwargs"))
