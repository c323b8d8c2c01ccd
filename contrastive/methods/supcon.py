"""SupCon: supervised contrastive learning, every view of the same class is a positive.

Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020 (arXiv 2004.11362); the authors'
code is HobbitLong/SupContrast (``losses.py``, ``main_supcon.py``).

One step::

    z_v = normalize(head(encoder(x_v)))  for each view v             # local N x D
    z_all, y_all = gather_with_grad(z), gather(labels)                 # the GLOBAL batch
    loss = supcon(stack(z_all), y_all, temperature) * temperature / base_temperature

The registry's ``supcon`` is L^sup_out (eq. 2). The official code multiplies the loss by
``temperature / base_temperature`` (both 0.07 by default, so 1); it only rescales the loss,
i.e. the learning rate, and is kept as an option (``base_temperature``; None = no factor).
Defaults: head ``Linear-ReLU-Linear(128)`` at the encoder's width (the code's ``mlp`` head),
temperature 0.1 (paper Sec. 4: "0.1 works best"; the code defaults to 0.07). Labels are
class labels for every image (``batch["labels"]``; -1, unknown, is refused).

``head_bn=True`` swaps in SimCLR's head (BN after the hidden Linear and on the output, as
:class:`~contrastive.methods.SimCLR`; google-research/supcon's head offers the hidden BN as
``use_projection_batch_norm``). A small encoder whose pooled ReLU features start almost
identical (``small_cnn``) gives embeddings that the first steps shrink to one point, where the
loss sits at ln(2N - 1) and its gradient vanishes; the output BN centres the embeddings over
the batch so they cannot (measured: tests/recipes/test_learning_family.py, EXTRA).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from contrastive.losses import get_loss
from contrastive.methods._common import unit, width
from contrastive.methods.base import Method, read, views_of
from contrastive.methods.registry import register_method
from contrastive.nn import build_mlp, resolve_encoder
from contrastive.nn.distributed import gather, gather_with_grad, world_size

__all__ = ["SupCon"]


@register_method("supcon")
class SupCon(Method):
    """Supervised contrastive pre-training (two or more views per image).

    Args:
        encoder: backbone name or module with ``num_features`` (``self.encoder``).
        dim: head output dimension (128); mlp_hidden: its hidden width (None = the encoder's).
        head_bn: SimCLR's head instead: BatchNorm after the hidden Linear and on the output
            (without affine), as :class:`~contrastive.methods.SimCLR`. Off (the paper's and the
            authors' codes' head) by default; see the module docstring for when it is needed.
        temperature: tau (0.1).
        base_temperature: the official code's loss factor tau / base_temperature; None = 1.
        encoder_kwargs: keyword arguments for ``create_encoder``.
    """

    needs = ("views", "labels")
    uses_in_batch_negatives = True
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        # paper Sec. 4 / code README: ResNet-50, batch 6144 (1024 on CIFAR), tau 0.1
        "resnet50": dict(encoder="torchvision:resnet50", dim=128, temperature=0.1),
        # solo-learn scripts/pretrain/cifar/supcon.yaml: 2048 -> 256, temperature 0.2
        "cifar": dict(encoder="cifar_resnet18", dim=256, mlp_hidden=2048, temperature=0.2),
    }

    def __init__(self, encoder: str | nn.Module = "cifar_resnet18", dim: int = 128,
                 mlp_hidden: int | None = None, head_bn: bool = False, temperature: float = 0.1,
                 base_temperature: float | None = None,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.encoder = resolve_encoder(encoder, **(encoder_kwargs or {}))
        nf = width(self.encoder)
        self.head: nn.Module = build_mlp(nf, mlp_hidden or nf, dim, 2, hidden_bn=head_bn,
                                          last_bn=head_bn)
        self.factor = 1.0 if base_temperature is None else temperature / base_temperature
        self.criterion = get_loss("supcon", temperature=temperature, normalize=False)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:
        views = views_of(batch, "SupCon", min_n=2)
        labels = read(batch, "labels", "SupCon")
        if (labels < 0).any():  # one host sync per step: cheap next to the refusal it allows
            raise ValueError("SupCon: every image needs a class label (batch['labels'] holds "
                             "-1, unknown); train on a labelled data set")
        z = torch.stack([unit(self.head(self.encoder(x))) for x in views], dim=1)  # N x V x D
        if world_size() > 1:
            z_all, y_all = gather_with_grad(z), gather(labels)
        else:
            z_all, y_all = z, labels
        loss = self.factor * self.criterion(z_all, y_all)
        return {"loss": loss, "embeddings": z[:, 0].detach()}
