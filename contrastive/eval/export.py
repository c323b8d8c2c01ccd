"""Export a backbone to timm's or torchvision's key names, for reuse outside this package.

The exported file is a plain ``{key: tensor}`` dict (``torch.save``, or safetensors when the output
ends in ``.safetensors``) that loads with ``strict=True`` into

- timm: ``timm.create_model(name, num_classes=0)``,
- torchvision: ``torchvision.models.get_model(name)`` with its classifier (``fc``, ``heads`` or
  ``classifier``) replaced by ``nn.Identity()``,

and with ``strict=False`` into the default models with only the classifier reported missing. The
export is checked by actually loading it into the target model before it is written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.eval.checkpoint import RawCheckpoint, align_state_dict, check_fit, read_checkpoint

log = logging.getLogger(__name__)

__all__ = ["FORMATS", "build_target", "target_model_name", "export_state_dict", "save_export"]

FORMATS = ("timm", "torchvision")
_CLASSIFIER_ATTRS = ("fc", "heads", "head", "classifier")


def build_target(fmt: str, model: str, *, headless: bool = True) -> nn.Module:
    """The target library's model (random init, no download), without classifier if ``headless``."""
    if fmt == "timm":
        import timm

        kwargs: dict[str, Any] = {"num_classes": 0} if headless else {}
        return timm.create_model(model, pretrained=False, **kwargs)
    if fmt == "torchvision":
        import torchvision

        try:
            net = torchvision.models.get_model(model, weights=None)
        except ValueError as e:
            raise ValueError(f"torchvision has no model {model!r}: {e}") from e
        if headless:
            for attr in _CLASSIFIER_ATTRS:
                if isinstance(getattr(net, attr, None), nn.Module):
                    setattr(net, attr, nn.Identity())
                    break
        return net
    raise ValueError(f"format {fmt!r} is not one of {FORMATS}")


def target_model_name(raw: RawCheckpoint, fmt: str) -> str:
    """The target model name implied by the checkpoint's encoder (``timm:resnet50`` -> resnet50)."""
    name = raw.encoder_name
    if name and ":" in name:
        lib, model = name.split(":", 1)
        if lib in FORMATS:
            return model
    raise ValueError(
        f"cannot tell which {fmt} model matches encoder {name!r} (only timm:<model> / "
        "torchvision:<model> encoders map by name; our cifar_resnet*/small_cnn have no counterpart "
        "in those libraries): to deploy it, export it with --format onnx (any encoder: its "
        "features as one .onnx file), or pass --model NAME of the same architecture"
    )


def export_state_dict(
    checkpoint: str | Path,
    fmt: str,
    *,
    model: str | None = None,
    encoder: str | None = None,
    prefix: str | None = None,
) -> tuple[dict[str, Tensor], str]:
    """The checkpoint's backbone under the target library's key names, checked by a strict load.

    Args:
        checkpoint: anything :func:`~contrastive.eval.checkpoint.read_checkpoint` accepts.
        fmt: ``"timm"`` or ``"torchvision"``.
        model: the target model name (default: from the checkpoint's encoder name).
        encoder: overrides the encoder name the checkpoint records.
        prefix: the backbone's key prefix in the checkpoint, when the automatic choice is wrong.

    Returns:
        (state dict, target model name).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    raw = read_checkpoint(checkpoint, encoder=encoder)
    if not raw.state_dict:
        raise ValueError(f"checkpoint {checkpoint!r} holds no weights to export ({raw.kind})")
    model = model or target_model_name(raw, fmt)
    net = build_target(fmt, model)
    target = net.state_dict()
    result = align_state_dict(raw.state_dict, target, prefix=prefix)
    check_fit(
        result,
        what=f"checkpoint {raw.path} (encoder {raw.encoder_name!r})",
        model=f"{fmt} model {model!r}",
        hint=f"the encoder is not a {fmt} {model}; pass --model NAME of the same architecture",
    )
    state = {k: v.detach().clone().contiguous() for k, v in result.state_dict.items()}
    net.load_state_dict(state, strict=True)  # the promise of the file, checked before writing
    return state, model


def save_export(state: dict[str, Tensor], out: str | Path, *, metadata: dict[str, Any] | None = None) -> Path:
    """Write the exported weights (``.safetensors`` by suffix, else ``torch.save``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(out), metadata={k: str(v) for k, v in (metadata or {}).items()})
    else:
        torch.save(state, out)
    log.info("wrote %d tensors to %s", len(state), out)
    return out
