"""Contrastive methods: ``nn.Module`` s that take a batch of named inputs and return the loss.

``MoCo`` (v1/v2, queue), ``DenseCL`` (MoCo v2 plus a dense loss between matched
feature-map locations), ``MoCoV3`` (no queue, predictor), ``SimCLR`` (NT-Xent, in-batch),
``Distiller`` (COS-NCE contrastive distillation of a frozen teacher into a student, LRC-BERT);
the two-view family without (or with other) negatives: ``BYOL``, ``SimSiam``, ``SupCon``,
``NNCLR``, ``BarlowTwins``, ``VICReg``, ``VICRegL`` (VICReg plus VICReg between matched
feature-map locations; reads ``crop_boxes``); multi-crop clustering and self-distillation: ``SwAV``,
``DINO``, ``IBOT`` (iBOT / DINOv2: DINO plus masked-patch distillation and KoLeo, a timm
ViT); ``MSN`` (masked siamese networks: prototypes, me-max, or PMSN's power-law prior;
a timm ViT); masked image modelling: ``MAE`` and ``SimMIM`` (one view, a timm ViT) and ``IJEPA`` (one
view, a timm ViT: a momentum target encoder's features of masked blocks predicted from a context
block); mutual information: ``DeepInfoMax``; image-text: ``CLIP`` and ``SigLIP``, siblings on one ``DualEncoder`` (the
two towers; both read ``input_ids`` and ``attention_mask`` besides the image); sentence
embeddings: ``SimCSE`` (reads ``input_ids`` and ``attention_mask``); labelled text:
``TextClassifier`` (an encoder fine-tuned with a prediction layer: the LRC-BERT teacher, the
cross-entropy student) and ``LRCBert`` (contrastive distillation of such a teacher into a small
student); both read ``input_ids``, ``attention_mask``, ``token_type_ids`` and ``labels``;
labelled images: ``ImageClassifier`` (a backbone fine-tuned with a linear head, ``contrastive-finetune``).

The contract (every method; the training engine relies on nothing else)
-----------------------------------------------------------------------
- ``forward(batch) -> dict``. ``batch`` is a mapping of named inputs. Image methods read
  ``batch["views"]``, a list of tensors (N, C, H_v, W_v) of any count and sizes (e.g. 2 x 224 px
  global + 6 x 96 px local crops); ``batch["labels"]`` (N,) are class labels (-1 where unknown)
  and ``batch["indices"]`` (N,) the images' data-set indices, two separate keys. Text and
  image-text methods read their own keys through the same mapping. The result holds ``loss``
  (scalar with grad) and cheap metrics: every 0-d tensor is logged (``pos_acc``, ``pos_sim``,
  ``neg_sim`` ...); from ``embeddings`` (detached (N, D)) the engine logs ``embedding_std``, the
  mean per-dimension std of the unit rows (near 0 when the embeddings collapse); all on the
  device, no host sync.
- ``needs``: the batch keys a method reads besides its schedules (``("views",)``,
  ``("views", "labels")`` ...). The engine provides exactly those (an unknown need is an error
  before training); a missing key in ``forward`` raises a ``KeyError`` naming it.
- ``schedules() -> {name: f(step, total_steps)}``: values that change with training progress
  (EMA momentum, a stage, a temperature warm-up). The loop evaluates each once per optimiser
  step, passes it as ``batch[name]`` and logs it; nothing extra is checkpointed (they are
  functions of the step). A schedule named ``weight_decay`` is also applied to the optimiser's
  decaying groups (DINO's cosine weight decay). The method's constructor takes their
  parameters (e.g. MoCo v3's ``momentum`` m0); nothing else holds a copy and ``forward`` has
  no fallback.
- ``param_groups() -> [ParamGroup(...)]`` (optional): parameters with their own weight decay, a
  fixed learning rate, or frozen for the first N steps (gradients dropped, or ``frozen_by="lr"``:
  lr 0, DINOv2); the engine builds the optimiser (SGD, LARS as the official MoCo v3 code, AdamW)
  and applies the lr schedule from them.
- ``clip_parts() -> {name: [params]}`` (optional): parts whose gradient norms ``--clip-grad-norm``
  clips apart (DINOv2's backbone and heads; DINO's and iBOT's each parameter: ``clip_mode``,
  :func:`~contrastive.methods.base.clip_parts_by`); by default all parameters together.
  Momentum (key) encoders have ``requires_grad=False`` and never enter the optimiser.
- ``method.encoder``: the backbone the engine trains (and compiles). ``evaluated`` (class
  attribute, default ``"encoder"``) names the backbone the engine saves as ``encoder.pt`` and the
  kNN monitor and online probe encode with: the momentum copy where the paper evaluates that one
  (DINO and iBOT ``"teacher.module.0"`` / ``"teacher.module.encoder"``, MSN
  ``"teacher.module.0"``, I-JEPA ``"target.module"``;
  :func:`~contrastive.methods.base.evaluated_encoder`); the eval tools read the same part of a
  checkpoint folder. ``--knn-feature head`` uses ``head`` (else ``projector``) on top of
  ``encoder``.
- ``uses_in_batch_negatives`` / ``couples_samples`` (class attributes, default False): the loss
  couples the samples of a batch through the gradient (in-batch negatives; batch statistics such
  as Barlow Twins' cross-correlation); the engine refuses ``--grad-accum-steps`` for such a
  method (micro-batches would train a smaller batch) and names ``--grad-cache-chunk``.
- ``backbones`` (class attribute, default ``("encoder",)``; CLIP: both towers; ``()`` where the
  loss reads intermediate layers): during a training step with gradient caching
  (:mod:`contrastive.engine.grad_cache`) the engine may stand in for these submodules with a
  proxy that runs them chunk by chunk and returns the cached features in call order (each call,
  multi-crop included, gets its own). So a method calls a backbone only as
  ``backbone(tensors...)`` -> one tensor with one row per input row, may read its attributes and
  parameters, and calls none of its other methods during ``forward`` (refused with a clear
  error). Momentum copies built as ``MomentumEncoder(nn.Sequential(backbone, head))`` get their
  backbone chunked (without gradient) too.

Beside the contract: ``presets`` hold a paper's settings of the method's arguments, their one
home: ``from_preset(name, **kw)`` and ``get_method(name, preset=...)`` build from them, and the
recipes' fields default to them (``recipes/moco_cifar.py``: ``PRESET = MoCo.presets["cifar"]``);
the engine does not read them.

By hand, ``method.make_batch(views, step=s, total_steps=T, labels=...)`` builds what the loop
passes. Adding a method is one file: subclass :class:`Method`, decorate it with
``@register_method("name")``; ``get_method(name, **kwargs)`` / ``list_methods()`` then know it
(a taken name raises unless ``override=True``; unknown names suggest the closest).
"""

from __future__ import annotations

from contrastive.methods.barlow_twins import BarlowTwins
from contrastive.methods.base import Method, ParamGroup, Schedule
from contrastive.methods.byol import BYOL
from contrastive.methods.clip import CLIP
from contrastive.methods.dcl import DCL
from contrastive.methods.dclw import DCLW
from contrastive.methods.deep_infomax import DeepInfoMax
from contrastive.methods.densecl import DenseCL
from contrastive.methods.dino import DINO
from contrastive.methods.distill import Distiller
from contrastive.methods.dual_encoder import DualEncoder
from contrastive.methods.ibot import IBOT
from contrastive.methods.ijepa import IJEPA
from contrastive.methods.image_classifier import ImageClassifier
from contrastive.methods.lrc_bert import LRCBert
from contrastive.methods.mae import MAE
from contrastive.methods.moco import MoCo
from contrastive.methods.moco_v3 import MoCoV3
from contrastive.methods.msn import MSN
from contrastive.methods.nnclr import NNCLR
from contrastive.methods.registry import (
    UnknownMethodError,
    get_method,
    list_methods,
    method_class,
    register_method,
)
from contrastive.methods.siglip import SigLIP
from contrastive.methods.simclr import SimCLR
from contrastive.methods.simcse import SimCSE
from contrastive.methods.simmim import SimMIM
from contrastive.methods.simsiam import SimSiam
from contrastive.methods.supcon import SupCon
from contrastive.methods.swav import SwAV
from contrastive.methods.text_classifier import TextClassifier
from contrastive.methods.vicreg import VICReg
from contrastive.methods.vicregl import VICRegL

__all__ = [
    "BYOL",
    "CLIP",
    "DCL",
    "DCLW",
    "BarlowTwins",
    "DINO",
    "DeepInfoMax",
    "DenseCL",
    "Distiller",
    "DualEncoder",
    "IBOT",
    "IJEPA",
    "ImageClassifier",
    "LRCBert",
    "MAE",
    "Method",
    "MoCo",
    "MoCoV3",
    "MSN",
    "NNCLR",
    "ParamGroup",
    "Schedule",
    "SigLIP",
    "SimCLR",
    "SimCSE",
    "SimMIM",
    "SimSiam",
    "SupCon",
    "SwAV",
    "TextClassifier",
    "UnknownMethodError",
    "VICReg",
    "VICRegL",
    "get_method",
    "list_methods",
    "method_class",
    "register_method",
]
