"""A frozen teacher for distillation: a pretrained encoder and, when it has one, its classifier.

The teacher comes from (see :func:`load_teacher`):

- a timm / torchvision model name with its own pretrained weights and classifier (downloads);
- any checkpoint :func:`~contrastive.eval.checkpoint.load_encoder` reads (our encoder.pt, a run
  folder, a training checkpoint folder, MoCo files, plain state dicts); its classifier is the
  single ``Linear`` among the keys left over beside the backbone (:func:`single_linear_head`);
- nothing: a randomly initialised encoder (smoke runs only, with a warning).

The KD soft loss needs the classifier to predict the data's classes: with ``head="auto"`` a
classifier whose width differs from the data's number of classes is dropped.

The teacher's input normalisation (``Teacher.mean`` / ``std``) is the one its source records:
timm's ``pretrained_cfg``, torchvision's ``weights.transforms()``, the mean/std an encoder.pt or
run folder records; None when the source records none (a bare weights file: the recipe's
``--teacher-mean`` / ``--teacher-std`` give it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.eval.init import published_normalisation

__all__ = ["Teacher", "load_teacher", "single_linear_head", "labelled_classes"]

log = logging.getLogger(__name__)

HEAD_CHOICES = ("auto", "use", "none")


@dataclass
class Teacher:
    """The teacher backbone, its classifier (None: no KD soft loss) and the input normalisation
    its weights were trained with (None: its source records none)."""

    encoder: nn.Module
    head: nn.Module | None
    name: str
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


def single_linear_head(state: Mapping[str, Tensor], keys: list[str],
                       num_features: int) -> nn.Linear | None:
    """The classifier among a checkpoint's left-over keys: exactly one 2-D ``*.weight`` that takes
    ``num_features`` inputs, and no other 2-D weight (an MLP projector is not a classifier)."""
    weights = [k for k in keys if k.endswith(".weight") and state[k].dim() == 2]
    if len(weights) != 1 or state[weights[0]].shape[1] != num_features:
        return None
    w = state[weights[0]]
    b = state.get(weights[0][: -len("weight")] + "bias")
    head = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    with torch.no_grad():
        head.weight.copy_(w)
        if b is not None:
            head.bias.copy_(b)
    return head


def labelled_classes(dataset: Any) -> int | None:
    """The number of classes of a data set with at least one known label (``targets`` >= 0),
    else None (unlabelled data: no label-based loss)."""
    from contrastive.data import num_classes

    targets = torch.as_tensor(list(getattr(dataset, "targets", [])), dtype=torch.long)
    if len(targets) != len(dataset) or not bool((targets >= 0).any()):
        return None
    return num_classes(dataset)


def load_teacher(name: str = "", checkpoint: str = "", *, pretrained: bool = False,
                 encoder_kwargs: Mapping[str, Any] | None = None, head: str = "auto",
                 num_classes: int | None = None) -> Teacher:
    """Build the teacher (see the module docstring).

    Args:
        name: encoder name (``timm:<m>``, ``torchvision:<m>``, ``small_cnn`` ...); with a
            checkpoint, empty = the name it records.
        checkpoint: weights to load (empty: ``pretrained`` weights, or random init).
        pretrained: take ``name``'s own pretrained weights and classifier (timm / torchvision).
        encoder_kwargs: ``create_encoder`` keyword arguments (e.g. a ViT's ``img_size``).
        head: ``auto`` (the classifier when its width is ``num_classes``), ``use`` or ``none``.
        num_classes: the data's classes (None: unlabelled).
    """
    if head not in HEAD_CHOICES:
        raise ValueError(f"teacher head {head!r} is not one of {HEAD_CHOICES}")
    classifier: nn.Module | None = None
    norm: tuple[Any, Any] = (None, None)
    if pretrained:
        if not name.startswith(("timm:", "torchvision:")):
            raise ValueError(f"a pretrained teacher needs a timm:<m> or torchvision:<m> name, "
                             f"got {name!r}")
        from contrastive.nn import split_classifier

        if name.startswith("timm:"):
            import timm

            model = timm.create_model(name[len("timm:"):], pretrained=True)
        else:
            import torchvision

            model = torchvision.models.get_model(name[len("torchvision:"):], weights="DEFAULT")
        norm = published_normalisation(name)
        encoder, classifier = split_classifier(model)
    elif checkpoint:
        from contrastive.eval.checkpoint import load_encoder, read_checkpoint

        raw = read_checkpoint(checkpoint)
        # the name the checkpoint records (with its encoder kwargs) unless `name` differs
        loaded = load_encoder(checkpoint, encoder=name if name and name != raw.recorded_encoder
                              else None, encoder_kwargs=dict(encoder_kwargs or {}) or None)
        encoder, name, norm = loaded.encoder, loaded.name, (loaded.mean, loaded.std)
        if loaded.kind == "pretrained":  # --teacher-checkpoint timm:NAME / torchvision:NAME
            norm = published_normalisation(name)
        if head != "none" and loaded.ignored:
            classifier = single_linear_head(raw.state_dict, loaded.ignored,
                                            int(getattr(encoder, "num_features", 0)))
        log.info("teacher %s from %s (%s)", loaded.name, checkpoint, loaded.kind)
    else:
        from contrastive.nn import create_encoder

        name = name or "small_cnn"
        encoder = create_encoder(name, **dict(encoder_kwargs or {}))
        log.warning("the teacher %s has RANDOM weights (no teacher checkpoint): a smoke run, "
                    "nothing worth distilling", name)
    if classifier is not None and head == "auto" and \
            getattr(classifier, "out_features", None) != num_classes:
        log.info("teacher classifier (%s outputs) does not match the data's %s classes: no KD "
                 "soft loss (--teacher-head use forces it)",
                 getattr(classifier, "out_features", "?"), num_classes)
        classifier = None
    if head == "none":
        classifier = None
    log.info("KD soft loss: %s", "on" if classifier is not None else "off")
    mean, std = (tuple(float(v) for v in t) if t else None for t in norm)
    return Teacher(encoder, classifier, name, mean, std)
