"""Activation checkpointing (``--grad-checkpointing``): keep only each block's input in the
forward pass and run the block again in the backward pass (Chen et al., "Training Deep Nets with
Sublinear Memory Cost", arXiv:1604.06174, 2016; :func:`torch.utils.checkpoint.checkpoint`): the
activations inside a block are never all held at once, for about one more forward pass of
compute.

:func:`enable_grad_checkpointing` applies it to a whole method, in place, without changing a
parameter or a state-dict key (a checkpoint of a run with it loads into a run without it):

- the block sequences of the backbones, heads and decoders: a ViT's ``blocks`` (timm's
  VisionTransformer, the masked ViT of MAE and iBOT, MAE's decoder), a ResNet's ``layer1`` ...
  ``layer4`` (timm, torchvision, the CIFAR ResNets), an EfficientNet's ``blocks`` (timm): each
  ``nn.Sequential`` becomes a :class:`CheckpointedSequential` with the same children, which runs
  every child under the checkpoint. One mechanism for every family rather than timm's
  ``set_grad_checkpointing``, which a method that runs ``vit.blocks`` itself (the masked ViT)
  would bypass;
- a Hugging Face text model: its own ``gradient_checkpointing_enable`` (non-reentrant).

Exactness: torch's non-reentrant checkpoint saves and restores the random state, so dropout and
drop path draw the same masks in the recomputation and the gradients equal those without
checkpointing (float64: to rounding, tested). A BatchNorm in training mode would update its
running statistics a second time when its block is recomputed; :class:`CheckpointedSequential`
restores them after the recomputation, so the statistics also equal the run without it. Under
``torch.no_grad`` (momentum encoders, evaluation) and in eval mode the blocks run plainly.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["CheckpointedSequential", "enable_grad_checkpointing", "GradCheckpointingError"]

log = logging.getLogger(__name__)

#: attribute names of the block sequences checkpointed (ViTs and EfficientNets, ResNets)
BLOCK_SEQUENCES = ("blocks", "layer1", "layer2", "layer3", "layer4")


class GradCheckpointingError(ValueError):
    """The method holds no part this module knows how to checkpoint."""


class CheckpointedSequential(nn.Sequential):
    """An ``nn.Sequential`` whose children each run under :func:`torch.utils.checkpoint.checkpoint`
    (non-reentrant, random state preserved) when gradients are recorded; the same children
    and state-dict keys as the sequence it replaces."""

    def forward(self, x: Any) -> Any:  # noqa: D102 (nn.Sequential's)
        if not torch.is_grad_enabled():
            return super().forward(x)
        for block in self:
            x = checkpoint(_recompute_keeping_bn_stats(block), x, use_reentrant=False)
        return x


def _recompute_keeping_bn_stats(block: nn.Module) -> Callable[[Tensor], Tensor]:
    """``block`` as a function whose second and later calls (the recomputation in the backward
    pass) leave the running statistics of its BatchNorm layers as they found them."""
    norms = [m for m in block.modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats]
    calls = 0

    def run(x: Tensor) -> Tensor:
        nonlocal calls
        calls += 1
        if calls == 1 or not norms:
            return block(x)
        kept = [[b.clone() for b in _statistics(m)] for m in norms]
        try:  # torch stops a recomputation early (an exception) once it has what backward needs
            return block(x)
        finally:
            with torch.no_grad():
                for m, saved in zip(norms, kept, strict=True):
                    for buffer, value in zip(_statistics(m), saved, strict=True):
                        buffer.copy_(value)

    return run


def _statistics(norm: nn.Module) -> list[Tensor]:
    names = ("running_mean", "running_var", "num_batches_tracked")
    return [b for b in (norm.get_buffer(n) for n in names if norm._buffers.get(n) is not None)]


def enable_grad_checkpointing(method: nn.Module) -> list[str]:
    """Checkpoint every block sequence and Hugging Face model in ``method``, in place (see the
    module docstring). Returns the names of the parts checkpointed.

    Raises:
        GradCheckpointingError: nothing in ``method`` can be checkpointed (e.g. ``small_cnn``,
            whose blocks are not a sequence): one line naming the fix.
    """
    done: list[str] = []
    hf_models = [(name, m) for name, m in method.named_modules()
                 if callable(getattr(m, "gradient_checkpointing_enable", None))
                 and getattr(m, "supports_gradient_checkpointing", False)]
    for name, model in hf_models:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        done.append(name or "(the method)")
    inside_hf = tuple(f"{name}." for name, _ in hf_models)
    for name, module in list(method.named_modules()):
        if name.startswith(inside_hf) or (hf_models and name in {n for n, _ in hf_models}):
            continue
        for attr in BLOCK_SEQUENCES:
            child = module._modules.get(attr)
            if type(child) is nn.Sequential:  # not a subclass: already checkpointed, or another kind
                setattr(module, attr, CheckpointedSequential(OrderedDict(child.named_children())))
                done.append(f"{name}.{attr}" if name else attr)
    if not done:
        raise GradCheckpointingError(
            f"--grad-checkpointing: {type(method).__name__} has no block sequence (a ViT's blocks, "
            "a ResNet's layer1-4) and no Hugging Face model to checkpoint; use a timm, torchvision "
            "or CIFAR ResNet / ViT encoder, or leave the flag out")
    log.info("activation checkpointing: %d parts (%s%s)", len(done), ", ".join(done[:6]),
             " ..." if len(done) > 6 else "")
    return done
