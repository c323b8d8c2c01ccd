"""Whether a checkpoint can continue this run, and whether the resume was exact.

Before loading, :func:`check_compatible` compares the checkpoint's model signature (method class,
every state-dict key with shape and dtype) and run-defining config fields with the new run and
raises :class:`IncompatibleCheckpointError` naming the differences. After loading, the
fingerprints (:func:`tensor_digest` of model and optimiser, :func:`rng_digest` of every
process's generators) taken at save time are compared with live ones
(:meth:`contrastive.engine.checkpoint.CheckpointManager.verify`): a resume that is not exact
raises :class:`ResumeMismatchError`.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from contrastive.engine.fields import as_flag

__all__ = ["FORMAT_VERSION", "OPERATIONAL_FIELDS", "RENAMED_FIELDS", "IncompatibleCheckpointError",
           "ResumeMismatchError", "tensor_digest", "rng_digest", "model_signature",
           "check_compatible", "renamed_to", "new_flags", "warn_renamed"]

FORMAT_VERSION = 2  # 1: accelerate's save_state (pickled custom state), not read any more

#: Config fields that may change between a run and its resume (they do not change the maths).
OPERATIONAL_FIELDS = frozenset({
    "output_dir", "resume", "max_steps", "num_workers", "save_every_steps", "save_every_epochs",
    "keep_last", "log_every", "progress", "report_to", "allow_config_change", "strict_data",
    "knn_every", "knn_at_start", "knn_max_train", "knn_max_test", "knn_k", "knn_t",
    "knn_feature", "online_probe", "probe_lr", "compile", "compile_mode", "channels_last",
    "batched_augment", "decode", "cpu", "on_nonfinite", "resident",
    "mixed_precision", "ddp_find_unused_parameters", "stop_if_orphaned", "fused_optimizer",
    "grad_checkpointing", "fsdp",
})


#: Config fields renamed since checkpoints were first written: old name -> new name. A checkpoint's
#: ``config`` is read through this table before it is compared with the run's, so a rename never
#: refuses a resume; the old flags and ``--config`` keys still work, with a one-time
#: ``FutureWarning`` (:func:`contrastive.engine.config.parse_config`). Fields added since (absent
#: from an older checkpoint) count as their default; fields removed since (absent from this
#: version) are ignored. An old name that two fields shared maps to both (a tuple): its value
#: tells which (:func:`renamed_to`). Append, never edit, an entry.
RENAMED_FIELDS: dict[str, str | tuple[str, ...]] = {
    # issue 29: one name for the EMA momentum of a key encoder / target / teacher, the name the
    # methods' constructors, their schedule and metrics.jsonl already used
    "moco_momentum": "momentum",  # moco_cifar, moco_r50, mocov1_r50, mocov3_r50, mocov3_vit_small
    "tau_base": "momentum",  # byol_cifar, byol_r50
    "momentum_teacher": "momentum",  # dino_cifar, dino_vit_small
    # one name for the KD soft-loss temperature t, as recipes/lrc_bert.py and the methods say it
    "kd_temperature": "temperature",  # distill_cosnce
    # issue 48: one spelling of a BERT's sizes in every recipe, the dual encoder's text tower too
    "text_layers": "layers", "text_width": "hidden", "text_heads": "heads",  # clip, siglip
    "text_dropout": "dropout",
    # and no name for two things: simcse's feed-forward width (an int) and lrc_bert's
    # intermediate-layer loss (cosnce | mse)
    "intermediate": ("intermediate_size", "layer_loss"),
}


def renamed_to(old: str, value: Any, defaults: dict[str, Any]) -> str | None:
    """The field that an old name (:data:`RENAMED_FIELDS`) with ``value`` fills among
    ``defaults`` (field -> default), None if none. Of several candidates that are fields, the
    first whose default's type the value has or converts to (a flag's text: ``--intermediate
    32`` is a width, ``--intermediate mse`` a loss)."""
    new = RENAMED_FIELDS.get(old, ())
    candidates = [n for n in ((new,) if isinstance(new, str) else new) if n in defaults]
    if len(candidates) < 2:
        return candidates[0] if candidates else None
    for name in candidates:
        kind = type(defaults[name])
        if isinstance(value, kind) or (kind is float and isinstance(value, int)):
            return name
        if isinstance(value, str):
            try:
                kind(value)
                return name
            except ValueError:
                pass
    return None


class IncompatibleCheckpointError(ValueError):
    """The checkpoint was written by another model, method or run configuration."""


class ResumeMismatchError(RuntimeError):
    """A loaded state differs from the state that was saved: the resume would not be exact."""


# ----------------------------------------------------------------------------------------------
# fingerprints


def _update_tensor(h: Any, t: torch.Tensor) -> None:
    t = t.detach()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())


def _update_any(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        _update_tensor(h, obj)
    elif isinstance(obj, np.ndarray):
        h.update(str(obj.dtype).encode() + obj.tobytes())
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(str(k).encode())
            _update_any(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _update_any(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def tensor_digest(obj: Any) -> str:
    """SHA-256 of a (nested) state dict: keys, dtypes, shapes and bytes of every tensor."""
    h = hashlib.sha256()
    _update_any(h, obj)
    return h.hexdigest()


def rng_digest() -> str:
    """SHA-256 of this process's torch, CUDA, ``random`` and numpy generator states."""
    h = hashlib.sha256()
    _update_tensor(h, torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for s in torch.cuda.get_rng_state_all():
            _update_tensor(h, s)
    _update_any(h, random.getstate())
    _update_any(h, np.random.get_state())
    return h.hexdigest()


def model_signature(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint must match: the method class and every state-dict entry's shape/dtype."""
    tensors = {k: f"{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}"
               for k, v in model.state_dict().items()}
    digest = hashlib.sha256(json.dumps([type(model).__name__, tensors],
                                       sort_keys=True).encode()).hexdigest()
    return {"method": type(model).__name__, "digest": digest, "tensors": tensors}


def upgrade_config(old: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``config`` as this version reads it: renamed fields under their new names
    (:data:`RENAMED_FIELDS`), fields it lacks at their ``defaults`` (every key of the run's
    config: the recipe name and the config class's defaults), keys ``defaults`` lacks (fields
    removed since) dropped."""
    renamed = {(renamed_to(k, v, defaults) or k) if k not in defaults else k: v
               for k, v in old.items()}
    return {k: renamed.get(k, v) for k, v in defaults.items()}


def check_compatible(meta: dict[str, Any], signature: dict[str, Any], config: dict[str, Any], *,
                     world_size: int, allow_config_change: bool = False,
                     path: str | Path = "", defaults: dict[str, Any] | None = None) -> list[str]:
    """Raise :class:`IncompatibleCheckpointError` when the checkpoint cannot continue this run.

    The model signature must match exactly. Config fields outside :data:`OPERATIONAL_FIELDS`
    and the number of processes must match unless ``allow_config_change`` (then they are
    returned as warnings). ``defaults``: the run's config class's defaults (its
    ``config_to_dict``): a field an older checkpoint lacks counts as its default, a renamed one
    is read under its new name (:func:`upgrade_config`).
    """
    where = f" {path}" if path else ""
    if meta.get("format") != FORMAT_VERSION:
        raise IncompatibleCheckpointError(
            f"checkpoint{where} has format {meta.get('format')!r}, this version reads "
            f"{FORMAT_VERSION} (format 1 held pickled state, which is never loaded): resume it "
            "with the version that wrote it, or start a new --output-dir")
    old = meta["signature"]
    if old["digest"] != signature["digest"]:
        problems = []
        if old["method"] != signature["method"]:
            problems.append(f"method {old['method']} in the checkpoint, {signature['method']} "
                            "now")
        a, b = old["tensors"], signature["tensors"]
        missing = [k for k in b if k not in a]
        extra = [k for k in a if k not in b]
        shaped = [f"{k}: {a[k]} vs {b[k]}" for k in b if k in a and a[k] != b[k]]
        for label, items in (("not in the checkpoint", missing), ("only in the checkpoint", extra),
                             ("different shape/dtype (checkpoint vs now)", shaped)):
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                problems.append(f"{len(items)} tensors {label}: {', '.join(items[:5])}{more}")
        old_cfg = meta.get("config", {})
        hint_fields = [k for k in ("encoder", "recipe") if old_cfg.get(k) != config.get(k)]
        hint = "".join(f"; checkpoint {k}={old_cfg.get(k)!r}, now {config.get(k)!r}"
                       for k in hint_fields)
        raise IncompatibleCheckpointError(
            f"checkpoint{where} was written by a different model{hint}: "
            + "; ".join(problems)
            + ". Resume with the same recipe and model options, or start a new --output-dir.")
    changed = []
    old_cfg = meta.get("config", {})
    if defaults is not None:
        old_cfg = upgrade_config(old_cfg, defaults)
    for key in sorted(set(old_cfg) | set(config)):
        if key in OPERATIONAL_FIELDS:
            continue
        if old_cfg.get(key) != config.get(key):
            changed.append(f"{key}: {old_cfg.get(key)!r} -> {config.get(key)!r}")
    if meta.get("world_size", world_size) != world_size:
        changed.append(f"processes: {meta.get('world_size')} -> {world_size} (RNG states cannot "
                       "be restored exactly)")
    if changed and not allow_config_change:
        raise IncompatibleCheckpointError(
            f"checkpoint{where} belongs to a run with other settings: {'; '.join(changed)}. "
            "Pass the same values, start a new --output-dir, or add --allow-config-change to "
            "continue anyway (the resumed run is then not the same run).")
    return changed


def new_flags(args: list[str], defaults: dict[str, Any]) -> list[str]:
    """``args`` with each old field name's flag (:data:`~contrastive.engine.compat.
    RENAMED_FIELDS`, ``--old``, ``--old=V``, ``--no-old``) written as its field's, with the
    one-time notice; ``defaults``: field -> default (an old name two fields shared goes to the
    one its value fits). Old names that are fields themselves stay."""
    out = list(args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        name, prefix = flag[2:].replace("-", "_"), "--"
        if name.startswith("no_") and name[3:] in RENAMED_FIELDS:
            name, prefix = name[3:], "--no-"
        if not flag.startswith("--") or name not in RENAMED_FIELDS or name in defaults:
            continue
        new = renamed_to(name, value if eq else (args[i + 1] if i + 1 < len(args) else ""),
                         defaults)
        if new is not None:
            warn_renamed(f"--{as_flag(name)}", f"--{as_flag(new)}", stacklevel=4)
            out[i] = f"{prefix}{as_flag(new)}{eq}{value}"
    return out


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """A deprecation warning, shown once per old name and process (the ``warnings`` default),
    pointing at the caller of the function (``stacklevel`` frames up) that read the old name."""
    warnings.warn(f"{old} is renamed {new}; the old name still works for now", FutureWarning,
                  stacklevel=stacklevel)
