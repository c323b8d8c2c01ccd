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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["OnlineProbe"]


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
