"""The online linear probe: a linear classifier trained beside the method on detached features.

As solo-learn's online classifier (``solo/methods/base.py``: ``nn.Linear(features_dim,
num_classes)`` on ``feats.detach()``, cross-entropy, unknown labels ignored), but with its own
optimiser instead of a parameter group of the method's, so that nothing about the method's
training changes: the probe's features come from an extra forward pass of the backbone in eval
mode without gradients (no batch-norm statistics move, no random number is drawn), its head
starts from zeros (no draw from the global generator either), and its SGD steps only its head.
A test checks that the encoder after N steps is bit-identical with the probe on and off.

Each step the probe first predicts the batch (``probe_top1``: the head has not seen these
images, a progressive-validation estimate), then takes one SGD step on it. Under several
processes the head's gradients are averaged, so every process holds the same head. Its state
(head and optimiser) is saved in every checkpoint and restored on resume.

:class:`ImageStepHook` is how the probe (and the images counter) hook into the training loop:
the image adapter's :meth:`~contrastive.engine.kits.image.ImageAdapter.step_hook`, a
:class:`~contrastive.engine.kits.base.StepHook`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.engine.checkpoint import TrainState
from contrastive.methods.base import evaluated_encoder

if TYPE_CHECKING:
    from contrastive.engine.kits.image import ImageConfig

__all__ = ["OnlineProbe", "ImageStepHook", "build_probe"]

logger = logging.getLogger(__name__)


class OnlineProbe(nn.Module):
    """Linear head (D -> C, zero init) and its SGD (momentum 0.9, no weight decay).

    Args:
        num_features: D, the backbone's feature width.
        num_classes: C.
        lr: constant learning rate.
    """

    def __init__(self, num_features: int, num_classes: int, lr: float = 0.1) -> None:
        super().__init__()
        self.head = nn.Linear(num_features, num_classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.optimizer = torch.optim.SGD(self.head.parameters(), lr=lr, momentum=0.9)
        self._hits = torch.zeros((), dtype=torch.long)
        self._rows = torch.zeros((), dtype=torch.long)

    def to_device(self, device: torch.device) -> OnlineProbe:
        """Move the head and the counters (before the first step)."""
        self.head.to(device)
        self._hits, self._rows = self._hits.to(device), self._rows.to(device)
        return self

    @staticmethod
    @torch.no_grad()
    def features(encoder: nn.Module, images: Tensor) -> Tensor:
        """(N, D) backbone features in eval mode; every submodule's mode is restored after."""
        modes = [(m, m.training) for m in encoder.modules()]
        encoder.eval()
        try:
            return encoder(images).float()
        finally:
            for m, training in modes:
                m.training = training

    def step(self, features: Tensor, labels: Tensor, accelerator: Any = None) -> None:
        """Predict, then learn, one batch: (N, D) features, (N,) labels (-1: unknown, ignored).

        The prediction's hits are counted for :meth:`pop_top1`; nothing here syncs with the
        host (a batch without labels takes a zero-gradient step)."""
        features = features.detach().to(self.head.weight.dtype)
        logits = self.head(features)
        known = labels >= 0
        self._hits += ((logits.detach().argmax(1) == labels) & known).sum()
        self._rows += known.sum()
        ce = F.cross_entropy(logits, labels.clamp(min=0), reduction="none")
        loss = (ce * known).sum() / known.sum().clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if accelerator is not None and accelerator.num_processes > 1:
            for p in self.head.parameters():
                p.grad = accelerator.reduce(p.grad, "mean")
        self.optimizer.step()

    def pop_top1(self, accelerator: Any = None) -> float | None:
        """Top-1 (%) of the predictions since the last call, over all processes (None if no
        labelled row was seen)."""
        counts = torch.stack([self._hits, self._rows]).float()
        if accelerator is not None and accelerator.num_processes > 1:
            counts = accelerator.reduce(counts, "sum")
        self._hits.zero_()
        self._rows.zero_()
        hits, rows = counts.tolist()
        return 100.0 * hits / rows if rows else None

    def checkpoint_state(self) -> dict[str, Any]:
        """Head and optimiser state (tensors and numbers only: ``weights_only`` loadable)."""
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`checkpoint_state`."""
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])


def build_probe(cfg: ImageConfig, module: nn.Module, train_set: Any,
                device: torch.device) -> OnlineProbe | None:
    """The online linear probe (``--online-probe``, image runs), or None when off or without
    labels."""
    if not cfg.online_probe:
        return None
    from contrastive.data import num_classes

    n_cls = num_classes(train_set)
    width = int(getattr(evaluated_encoder(module), "num_features", 0))
    if n_cls is None or width <= 0:
        logger.info("online probe off: %s", "the data has no labels" if n_cls is None else
                    f"{type(evaluated_encoder(module)).__name__} has no num_features")
        return None
    return OnlineProbe(width, n_cls, lr=cfg.probe_lr).to_device(device)


class ImageStepHook:
    """The image runs' work beside the loop's steps (a
    :class:`~contrastive.engine.kits.base.StepHook`): the online probe (when on) learns from the
    backbone's detached features of each micro-batch's first view and adds ``probe_top1`` to
    the step records; the images counter (``images_seen`` in the checkpoints) counts
    ``batch_size`` images per optimiser step."""

    def __init__(self, probe: OnlineProbe | None, batch_size: int) -> None:
        self.probe, self.batch_size = probe, batch_size
        self.checkpointed: dict[str, Any] = {"probe": probe} if probe is not None else {}

    def after_micro_batch(self, batch: dict[str, Any], sample: tuple[Any, ...],
                          module: nn.Module, accelerator: Any) -> None:
        if self.probe is None:
            return
        with accelerator.autocast():
            feats = self.probe.features(evaluated_encoder(module), batch["views"][0])
        self.probe.step(feats, sample[1].to(accelerator.device, non_blocking=True), accelerator)

    def after_optimizer_step(self, state: TrainState) -> None:
        state.images_seen += self.batch_size

    def log_fields(self, accelerator: Any) -> dict[str, Any]:
        if self.probe is None:
            return {}
        top1 = self.probe.pop_top1(accelerator)
        return {"probe_top1": None if top1 is None else round(top1, 4)}
