"""``--init``: a run's image backbone starts from given weights (issue 49), for every kit with
an image backbone (:mod:`~contrastive.engine.kits.image`, and the image tower of
:mod:`~contrastive.engine.kits.image_text`).

:class:`InitFields` declares the flags once; :class:`BackboneInit` is what a kit's adapter does
with them: :meth:`~BackboneInit.resolve` reads and checks the weights while the kit prepares
(before the run folder exists; :func:`contrastive.eval.init.resolve_init`), and
:meth:`~BackboneInit.building` is the context the recipe's ``build_method`` runs in, where every
``--encoder`` backbone the method creates is loaded before the method copies it (a momentum
encoder, a teacher: :func:`contrastive.nn.encoders.starting_weights`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from contrastive.engine.fields import help_field

if TYPE_CHECKING:
    from contrastive.eval.init import InitWeights

__all__ = ["InitFields", "BackboneInit"]

logger = logging.getLogger(__name__)

#: (mean, std) of an input normalisation
Normalisation = tuple[Sequence[float], Sequence[float]]


@dataclass
class InitFields:
    """The ``--init`` flags (a kit's configuration inherits them with its other fields)."""

    init: str = help_field(
        "", "start the backbone from these weights, and every copy the method makes of it "
        "(momentum encoder, teacher) with it: timm:NAME | torchvision:NAME (the library's "
        "published weights) | a weights file (.safetensors, a .pt/.pth state dict or training "
        "checkpoint, our encoder.pt) | a run folder; empty = random weights. The source and its "
        "sha256 go into config.json; a resume continues from its checkpoint")
    init_mean: tuple[float, ...] = help_field(
        (), "the per-channel mean the --init weights were trained with, for a file that does "
        "not record it (e.g. 0.5 0.5 0.5); empty = the source's own record")
    init_std: tuple[float, ...] = help_field(
        (), "the per-channel std the --init weights were trained with (see --init-mean)")


class BackboneInit:
    """``--init`` in a kit: the resolved weights (``weights``, None without ``--init``)."""

    def __init__(self) -> None:
        self.weights: InitWeights | None = None
        self.backbones: list[nn.Module] = []  # the --encoder backbones the last build created

    def resolve(self, cfg: InitFields) -> InitWeights | None:
        """Read and check ``cfg.init`` (a one-line :class:`~contrastive.eval.init.InitError`
        when it cannot be used); None without ``--init``."""
        self.weights = None
        if cfg.init:
            from contrastive.eval.init import resolve_init

            self.weights = resolve_init(cfg.init, mean=cfg.init_mean or None,
                                        std=cfg.init_std or None)
        return self.weights

    @contextlib.contextmanager
    def building(self, encoder: str) -> Iterator[None]:
        """Every backbone named ``encoder`` created inside is recorded (``backbones``: what the
        fine-tuning controls apply to) and, with ``--init``, starts from the weights (each load
        reported in one line); with ``--init``, a block that creates none is
        refused (its recipe builds the backbone another way)."""
        from contrastive.nn.encoders import starting_weights

        weights = self.weights
        self.backbones = []

        def load(backbone: nn.Module) -> None:
            if weights is not None:
                from contrastive.eval.init import load_into

                load_into(backbone, weights)  # which logs what loaded, in one line
            self.backbones.append(backbone)

        with starting_weights(encoder, load) as start:
            yield
        if weights is not None and not start.loaded:
            from contrastive.eval.init import InitError

            raise InitError(f"--init {weights.source}: the method built no --encoder {encoder} "
                            "backbone to load it into (its recipe builds the backbone another "
                            "way); --init works with the recipes that build --encoder")

    def normalisation(self, ours: Normalisation) -> Normalisation:
        """(mean, std) the images take: the ``--init`` weights' when the source records them or
        ``--init-mean/--init-std`` give them (logged when they replace ``ours``, the recipe's);
        else ``ours`` (with a warning under ``--init``)."""
        weights = self.weights
        if weights is None:
            return ours
        if weights.mean is None or weights.std is None:
            logger.warning("--init %s records no input normalisation: the images keep this "
                           "recipe's (mean %s, std %s); give --init-mean and --init-std if the "
                           "weights were trained with others", weights.source, *ours)
            return ours
        theirs = (tuple(weights.mean), tuple(weights.std))
        if theirs != (tuple(ours[0]), tuple(ours[1])):
            logger.info("--init %s: images normalised as its weights were trained (mean %s, std "
                        "%s: %s) instead of the recipe's (mean %s, std %s)", weights.source,
                        *theirs, weights.norm_from, *ours)
        return theirs

    def resolved(self) -> dict[str, Any]:
        """``{"init": source, sha256, normalisation ...}`` for config.json; {} without."""
        return {"init": self.weights.describe()} if self.weights is not None else {}
