"""Feature extraction with a frozen encoder, on one process or several (accelerate).

Evaluation reuses features: extract once (centre crops), then fit the linear head or search kNN on
the cached tensors. Under ``accelerate launch`` each process encodes its shard of the loader and
``Accelerator.gather_for_metrics`` collects all rows in dataset order, dropping the samples that
the last uneven batch repeated, so the result equals the single-process one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.data.loader import start_workers

log = logging.getLogger(__name__)

__all__ = ["extract_features", "unwrap_views"]


def unwrap_views(images: Any) -> Tensor:
    """A batch of images from a loader item: a tensor, or a one-element list of views."""
    if isinstance(images, Tensor):
        return images
    if isinstance(images, Sequence) and len(images) == 1 and isinstance(images[0], Tensor):
        return images[0]
    raise ValueError(
        "expected the loader to yield (images, labels) with images a (B, 3, H, W) tensor or a "
        f"list of one view; got {type(images).__name__}"
        + (f" of {len(images)} views: use a single-view (eval) transform" if isinstance(images, Sequence) else "")
    )


Encoder = nn.Module | Callable[[Tensor], Tensor]


@torch.no_grad()
def extract_features(
    encoder: Encoder,
    loader: Iterable,
    *,
    accelerator: Any | None = None,
    device: torch.device | str | None = None,
    device_transform: Callable[[Tensor], Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
    progress: bool = False,
) -> tuple[Tensor, Tensor]:
    """Encode every batch of ``loader`` with ``encoder`` in eval mode, without gradients.

    Args:
        encoder: maps (B, 3, H, W) float images to (B, D) features: a module (put in eval mode
            here, its mode restored after) or a function (e.g. the training monitor's, whose
            caller sets the modes).
        loader: yields ``(images, labels)``; images (B, 3, H, W) (or a list of one view),
            labels (B,) ints. Prepare it with the accelerator for multi-process sharding.
        accelerator: an ``accelerate.Accelerator``; when given, features of all processes are
            gathered with ``gather_for_metrics`` (every process gets the full result).
        device: where to run the encoder when no accelerator is given (default: the encoder's).
        device_transform: applied to the image batch on the device (e.g. a batched
            normalisation of uint8 images); None when the loader already yields float images.
        autocast_dtype: e.g. ``torch.bfloat16`` to encode under autocast; features are returned
            in float32.
        progress: show a tqdm bar (main process only).

    Returns:
        features (N, D) float32 on the CPU, labels (N,) int64 on the CPU, in loader order.
    """
    if accelerator is not None:
        device = accelerator.device
    elif device is None:
        param = next(encoder.parameters(), None) if isinstance(encoder, nn.Module) else None
        device = param.device if param is not None else torch.device("cpu")
    device = torch.device(device)
    module = encoder if isinstance(encoder, nn.Module) else None
    was_training = module is not None and module.training
    if module is not None:
        module.eval()
    feats: list[Tensor] = []
    labels: list[Tensor] = []
    # workers start with the stop signals held back, then ignore them (contrastive.data.loader)
    iterator: Iterable = start_workers(loader)
    if progress and (accelerator is None or accelerator.is_main_process):
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="features", leave=False, total=_length(loader))
    try:
        for item in iterator:  # (images, labels[, per-sample fields such as captions])
            images, targets = item[0], item[1]
            x = unwrap_views(images).to(device, non_blocking=True)
            if device_transform is not None:
                x = device_transform(x)
            targets = torch.as_tensor(targets).to(device)
            ctx = (
                torch.autocast(device.type, dtype=autocast_dtype)
                if autocast_dtype is not None
                else contextlib.nullcontext()
            )
            with ctx:
                f = encoder(x)
            if f.ndim != 2:
                raise ValueError(
                    f"the encoder returned features of shape {tuple(f.shape)}; expected (B, D) "
                    "pooled features (build it with num_classes=0 / a pooled backbone)"
                )
            f = f.float()
            if accelerator is not None:
                f, targets = accelerator.gather_for_metrics((f.contiguous(), targets.contiguous()))
            feats.append(f.cpu())
            labels.append(targets.long().cpu())
    finally:
        if module is not None:
            module.train(was_training)
    if not feats:
        raise ValueError("the loader yielded no batch: the dataset split is empty")
    return torch.cat(feats), torch.cat(labels)


def _length(loader: Iterable) -> int | None:
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None
