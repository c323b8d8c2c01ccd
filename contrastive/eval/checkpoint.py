"""Find the backbone weights in any checkpoint we support, and load them safely.

Accepted ``checkpoint`` arguments (see :func:`read_checkpoint`):

- our ``encoder.pt``: ``{"encoder": "<create_encoder name>", "state_dict": backbone weights}``;
- a run folder (holds ``encoder.pt``, else its newest complete ``checkpoints/step_N`` folder);
- a training checkpoint folder (``checkpoints/step_N``: ``model.safetensors``, or an older
  ``pytorch_model.bin``; the encoder name and kwargs come from the run's ``config.json``, else
  the copy of the configuration in the folder's ``meta.json``); both layouts are defined once,
  in :mod:`contrastive.records`;
- an official MoCo v1/v2 checkpoint (``state_dict`` with ``module.encoder_q.*`` keys and ``arch``),
  or MoCo v3 (``module.base_encoder.*``); any other file holding a plain state dict, or a
  checkpoint dict nesting one (timm's order, ``timm/models/_helpers.py``: ``state_dict_ema``,
  ``model_ema``, ``state_dict`` (also Lightning's), ``model`` (torchvision's references), then
  ``module``);
- a model name with its own weights, ``timm:<model>`` / ``torchvision:<model>`` (downloads);
- ``random`` (with an encoder name): a randomly initialised encoder, the baseline.

Every file is read with ``torch.load(weights_only=True)`` (or safetensors): a checkpoint cannot run
code. The one class allowed beyond tensors and plain values is ``argparse.Namespace`` (the
``args`` of timm's and torchvision's training checkpoints; timm allows it too), which holds
attributes and runs nothing. Keys are matched by :func:`align_state_dict`: it finds the prefix under which the checkpoint
holds the backbone (``module.encoder_q.``, ``encoder.model.`` ...; momentum/key encoders lose ties),
then requires every backbone tensor to be present with the right shape, and every left-over entry
under that prefix to be a head (``fc``, ``head``, ``classifier``, projector, predictor): the MoCo v3
"only the classifier differs" check, in both directions. A mismatch raises
:class:`CheckpointMismatchError`, one line naming the missing, surplus and mis-shaped keys.
:func:`load_aligned` is that match, check and load for any module (:func:`load_encoder` and
``--init``'s :func:`contrastive.eval.init.load_into` both use it).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import pickle
import pickletools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.records import (
    CHECKPOINTS,
    CONFIG_FILE,
    META,
    EncoderRecord,
    RecordError,
    encoder_fields_from_config,
    is_record,
    resolve_run_path,
)

log = logging.getLogger(__name__)

__all__ = [
    "CheckpointMismatchError",
    "RawCheckpoint",
    "LoadedEncoder",
    "AlignResult",
    "HEAD_NAMES",
    "align_state_dict",
    "check_fit",
    "load_aligned",
    "read_checkpoint",
    "load_encoder",
    "file_sha256",
    "resolve_checkpoint_path",
]

#: Top-level module names of classifiers and projection heads (never part of a backbone).
HEAD_NAMES = ("fc", "head", "heads", "classifier", "projector", "predictor", "head_drop", "mlp_head")
# Prefixes that hold a second copy of the backbone which we must not pick on a tie.
_SECONDARY = ("momentum", "encoder_k", "key_encoder", "key_net", "target", "teacher", "ema", "k_encoder")
_PREFERRED = ("encoder_q", "base_encoder", "encoder", "backbone", "student", "model")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.bin", "model.pt")
# Keys under which a checkpoint dict nests the state dict, in timm's order of preference
# (timm/models/_helpers.py load_state_dict: the EMA weights first); "module": older wrappers.
STATE_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model", "module")
# MoCo's `arch` (torchvision names) -> our encoder names
_ARCH_TO_ENCODER = {
    "vit_base": "timm:vit_base_patch16_224",
}


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not fit the model (another architecture, or not a backbone)."""


@dataclass
class RawCheckpoint:
    """The tensors of a checkpoint and what we know about them."""

    state_dict: dict[str, Tensor]
    encoder_name: str | None
    kind: str  # "encoder.pt", "accelerate", "moco", "mocov3", "state_dict", "pretrained", "random"
    path: Path | None
    sha256: str
    config: dict[str, Any] | None = None
    recorded_encoder: str | None = None  # what the checkpoint itself says (before --encoder)
    meta: dict[str, Any] = field(default_factory=dict)  # plain extras of encoder.pt (step, recipe ...)
    files: list[dict[str, str]] = field(default_factory=list)  # every file read: path, sha256 of its bytes
    #: what the weights were trained with: encoder_kwargs, image_size (and mean, std from encoder.pt)
    settings: dict[str, Any] = field(default_factory=dict)
    #: the key of a checkpoint dict that held the state dict, or (a training checkpoint) the
    #: submodule whose tensors these are (``teacher.module.0``: DINO's evaluated backbone);
    #: "": top level
    state_key: str = ""


@dataclass
class AlignResult:
    """Tensors renamed to the target's keys, and what was left over."""

    state_dict: dict[str, Tensor]
    source_prefix: str
    target_prefix: str
    missing: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # "key: checkpoint (..) vs model (..)"
    unused_backbone: list[str] = field(default_factory=list)
    unused_heads: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # source keys not under source_prefix

    @property
    def ignored(self) -> list[str]:
        """The source's keys left unloaded without error: heads, and everything outside the
        prefix (a momentum copy, a queue, a projector of the method)."""
        return self.unused_heads + self.outside


@dataclass
class LoadedEncoder:
    """An encoder with the checkpoint's weights loaded, and the provenance for result files."""

    encoder: nn.Module
    name: str
    kind: str
    path: Path | None
    sha256: str
    ignored: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    files: list[dict[str, str]] = field(default_factory=list)

    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def image_size(self) -> int | None:
        """The pretraining crop size recorded with the weights (None: not recorded)."""
        return self.settings.get("image_size")

    @property
    def mean(self) -> list[float] | None:
        """The pretraining normalisation mean recorded in encoder.pt (None: not recorded)."""
        return self.settings.get("mean")

    @property
    def std(self) -> list[float] | None:
        """The pretraining normalisation std recorded in encoder.pt (None: not recorded)."""
        return self.settings.get("std")

    def normalisation(self, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
                      ) -> tuple[tuple[float, ...], tuple[float, ...], str]:
        """(mean, std, where they come from) to feed this encoder images with: ``mean`` / ``std``
        if given, else those recorded with the weights, else a pretrained ``timm:`` /
        ``torchvision:`` model's published ones, else ImageNet's
        (:func:`~contrastive.eval.init.choose_normalisation`)."""
        from contrastive.eval.init import choose_normalisation

        return choose_normalisation(mean, std, recorded=(self.mean, self.std),
                                    published=self.name if self.kind == "pretrained" else None)

    def setting(self, key: str) -> Any:
        """A value recorded with the weights: ``image_size``, ``mean``, ``std``,
        ``encoder_kwargs``, or another plain field of encoder.pt (``step``, ``recipe`` ...)."""
        if key in self.settings:
            return self.settings[key]
        return self.meta.get(key)

    def describe(self) -> dict[str, Any]:
        """Provenance for result files: ``sha256`` of the weights file, and ``files``: the path and
        sha256 of every file read (weights, and the run's config.json when it was consulted),
        hashed from the very bytes that were loaded."""
        return {
            "path": str(self.path) if self.path else None,
            "kind": self.kind,
            "encoder": self.name,
            "sha256": self.sha256,
            "files": [dict(f) for f in self.files],
        }


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading


def _load_file(path: Path) -> tuple[Any, str]:
    """The file's contents and the sha256 of the bytes they were read from (one read)."""
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if path.suffix == ".safetensors":
        from safetensors.torch import load

        try:
            return load(data), sha
        except Exception as e:  # a truncated or foreign file
            raise ValueError(f"{path}: not a readable safetensors file ({e}); give the weights "
                             "file as saved (safetensors.torch.save_file)") from None
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True), sha
    except pickle.UnpicklingError:  # a pickle that needs code to run (refused), or none
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
        except Exception:  # a legacy (non-zip) pickle, or not a torch.save file at all
            legacy = _pickle_globals(data)
            if legacy is None:
                raise _not_weights(path, None) from None
            found = legacy
        raise ValueError(
            f"{path}: refused to load, torch.load(weights_only=True) found code it would have to "
            f"run ({', '.join(found) or 'an unsupported global'}); only tensors and plain values "
            "load (never arbitrary pickles): save the weights as .safetensors or a plain state dict"
        ) from None
    except Exception as e:  # not a torch file
        raise _not_weights(path, e) from None


def _pickle_globals(data: bytes) -> list[str] | None:
    """The globals a plain (non-zip) pickle names, read with :mod:`pickletools` (nothing runs);
    None when ``data`` is not a pickle."""
    if data[:1] != b"\x80":  # the PROTO opcode every pickle of protocol 2 or later starts with
        return None
    names: list[str] = []
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(".".join(strings[-2:]))
            elif isinstance(arg, str):
                strings.append(arg)
    except Exception:  # not a whole pickle
        return None
    return names


def _not_weights(path: Path, e: Exception | None) -> ValueError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0] if e is not None else ""
    return ValueError(
        f"{path}: not a weights file that torch.load or safetensors reads{f' ({first})' if first else ''}; "
        "give a .safetensors, .pt / .pth (a state dict or a checkpoint dict) or a run folder"
    )


def _read_config(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """The run configuration at ``path`` (a ``config.json``) and [its path and sha256]; nothing
    when the file is absent or unreadable."""
    if not path.is_file():
        return None, []
    data = path.read_bytes()
    try:
        config = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        log.warning("ignoring unreadable %s: %s", path, e)
        return None, []
    if not isinstance(config, dict):
        log.warning("ignoring %s: not a JSON object", path)
        return None, []
    return config, [{"path": str(path), "sha256": hashlib.sha256(data).hexdigest()}]


def _checkpoint_config(folder: Path) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """The configuration of the run a checkpoint folder belongs to: ``<run>/config.json`` (the
    folder is ``<run>/checkpoints/step_N``), else the copy in the folder's own ``meta.json``."""
    if folder.parent.name == CHECKPOINTS:
        config, files = _read_config(folder.parent.parent / CONFIG_FILE)
        if config is not None:
            return config, files
    meta, files = _read_config(folder / META)
    if meta is not None and isinstance(meta.get("config"), dict):
        return meta["config"], files
    return None, []


def resolve_checkpoint_path(path: Path) -> Path:
    """A run folder -> its encoder.pt or newest complete checkpoint folder (see
    :func:`contrastive.records.resolve_run_path`); a folder holding weights, or a file, unchanged."""
    if path.is_dir() and any((path / f).is_file() for f in _WEIGHT_FILES):
        return path
    return resolve_run_path(path)


def _is_model_name(spec: str) -> bool:
    return spec.startswith(("timm:", "torchvision:"))


def read_checkpoint(checkpoint: str | Path, *, encoder: str | None = None) -> RawCheckpoint:
    """Read the tensors of any supported checkpoint (see the module docstring).

    Args:
        checkpoint: a path, a ``timm:``/``torchvision:`` model name, or ``"random"``.
        encoder: the encoder name when the checkpoint cannot tell (overrides what it says).
    """
    spec = str(checkpoint)
    path = Path(spec).expanduser()
    if not path.exists():
        if _is_model_name(spec):
            return RawCheckpoint({}, encoder or spec, "pretrained", None, f"pretrained:{spec}")
        if spec == "random":
            if encoder is None:
                raise ValueError("checkpoint 'random' needs --encoder NAME (the architecture to initialise)")
            return RawCheckpoint({}, encoder, "random", None, "random")
        raise FileNotFoundError(
            f"checkpoint {spec!r} not found; give an encoder.pt, a run folder, a checkpoint "
            "folder, an official MoCo .pth.tar, 'timm:<model>' / 'torchvision:<model>', or 'random'"
        )
    path = resolve_checkpoint_path(path)
    if path.is_dir():  # a training checkpoint folder (checkpoints/step_N)
        weights = next((path / f for f in _WEIGHT_FILES if (path / f).is_file()), None)
        if weights is None:
            raise FileNotFoundError(f"checkpoint folder {path} holds no weights ({' / '.join(_WEIGHT_FILES)})")
        state, sha = _load_file(weights)
        config, config_files = _checkpoint_config(path)
        settings = _config_settings(config, path)
        recorded = settings.pop("encoder")
        state, evaluated = _evaluated_part(_tensors_only(state, weights), config)
        return RawCheckpoint(state, encoder or recorded, "accelerate", weights,
                             sha, config, recorded, files=[{"path": str(weights), "sha256": sha}, *config_files],
                             settings=settings, state_key=evaluated)
    obj, sha = _load_file(path)
    config, config_files = _read_config(path.parent / CONFIG_FILE)
    files = [{"path": str(path), "sha256": sha}, *config_files]
    if is_record(obj):
        try:
            record = EncoderRecord.from_payload(obj, str(path))
        except RecordError as e:
            raise ValueError(str(e)) from None
        meta = record.meta()
        settings = {k: meta[k] for k in ("encoder_kwargs", "image_size", "mean", "std")}
        if record.schema == 0:  # written before the record was complete: the run's config fills in
            for k, v in _config_settings(config, path).items():
                if k != "encoder" and not settings.get(k):
                    settings[k] = v
        return RawCheckpoint(record.state_dict, encoder or record.encoder, "encoder.pt",
                             path, sha, config, record.encoder, meta, files, settings)
    if isinstance(obj, Mapping):
        state, state_key = obj, ""
        for key in STATE_KEYS:
            if isinstance(obj.get(key), Mapping):
                state, state_key = obj[key], key
                break
        state = _tensors_only(state, path)
        arch = obj.get("arch") if isinstance(obj.get("arch"), str) else None
        if any(k.startswith(("module.encoder_q.", "encoder_q.")) for k in state):
            kind = "moco"
        elif any(k.startswith(("module.base_encoder.", "base_encoder.")) for k in state):
            kind = "mocov3"
        else:
            kind = "state_dict"
        settings = _config_settings(config, path)
        recorded = settings.pop("encoder")
        if recorded is None and arch is not None:
            recorded = _ARCH_TO_ENCODER.get(arch, f"torchvision:{arch}" if not arch.startswith("vit") else None)
            if recorded is None and encoder is None:
                raise ValueError(
                    f"{path}: arch {arch!r} has no known encoder (MoCo v3's vit_small has 12 heads, "
                    "timm's 6): pass --encoder NAME"
                )
        return RawCheckpoint(state, encoder or recorded, kind, path, sha, config, recorded, files=files,
                             settings=settings, state_key=state_key)
    raise ValueError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")


def _evaluated_part(state: dict[str, Tensor],
                    config: dict[str, Any] | None) -> tuple[dict[str, Tensor], str]:
    """A training checkpoint's tensors as the eval tools read them, and the submodule they come
    from: the backbone the run's method is evaluated by (``resolved.evaluated`` of its
    config.json, :attr:`~contrastive.methods.base.Method.evaluated`: DINO's teacher's), its
    keys relative to it, where that is not the trained ``encoder``; else all of them and ""
    (the backbone then found by :func:`align_state_dict`, as in any file)."""
    resolved = (config or {}).get("resolved")
    path = resolved.get("evaluated") if isinstance(resolved, Mapping) else None
    if not isinstance(path, str) or path in ("", "encoder"):
        return state, ""
    prefix = path + "."
    part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return (part, path) if part else (state, "")


def _config_settings(config: dict[str, Any] | None, path: Path) -> dict[str, Any]:
    """``encoder``, ``encoder_kwargs``, ``image_size`` and ``mean`` / ``std`` recorded in a
    run's configuration."""
    if config is None:
        return {"encoder": None, "encoder_kwargs": {}, "image_size": None, "mean": None, "std": None}
    try:
        return encoder_fields_from_config(config)
    except RecordError as e:
        raise ValueError(f"the run configuration of {path}: {e}") from None


def _tensors_only(state: Mapping[str, Any], path: Path) -> dict[str, Tensor]:
    tensors = {k: v for k, v in state.items() if isinstance(v, Tensor)}
    if not tensors:
        raise ValueError(f"{path}: holds no tensors (keys: {list(state)[:8]})")
    return tensors


# ---------------------------------------------------------------------------------------------
# Matching keys


def _common_prefix(keys: Iterable[str]) -> str:
    parts_list = [k.split(".") for k in keys]
    if not parts_list:
        return ""
    prefix: list[str] = []
    for group in zip(*(p[:-1] for p in parts_list)):
        if len(set(group)) != 1:
            break
        prefix.append(group[0])
    return "".join(p + "." for p in prefix)


def _prefix_rank(prefix: str) -> tuple[int, int]:
    lowered = prefix.lower()
    secondary = any(s in lowered for s in _SECONDARY)
    preferred = any(p in lowered for p in _PREFERRED)
    return (1 if secondary else 0, 0 if preferred else 1)


def _is_head(key: str) -> bool:
    return key.split(".")[0] in HEAD_NAMES


def align_state_dict(
    source: Mapping[str, Tensor],
    target: Mapping[str, Tensor],
    *,
    prefix: str | None = None,
) -> AlignResult:
    """Rename ``source`` tensors to ``target``'s keys (see the module docstring).

    The target's keys are taken relative to their common prefix (a wrapper module's ``model.``);
    the source prefix is the one under which most target keys are found (``prefix`` forces it).
    The result's ``missing`` / ``mismatched`` / ``unused_backbone`` lists are empty exactly when
    the backbone fits; :func:`check_fit` turns them into an error.
    """
    t_prefix = _common_prefix(target)
    rel = {k[len(t_prefix) :]: k for k in target}
    if prefix is None:
        counts: dict[str, int] = {}
        anchors = list(rel)
        for s in source:
            for u in anchors[:1] + anchors[-1:] + anchors[len(anchors) // 2 : len(anchors) // 2 + 1]:
                if s == u or s.endswith("." + u):
                    p = s[: len(s) - len(u)]
                    counts.setdefault(p, 0)
        for p in counts:
            counts[p] = sum(1 for u in rel if p + u in source)
        if not counts:
            counts[""] = sum(1 for u in rel if u in source)
        prefix = min(counts, key=lambda p: (-counts[p], _prefix_rank(p), len(p)))
    out: dict[str, Tensor] = {}
    result = AlignResult(out, prefix, t_prefix)
    for u, tk in rel.items():
        sk = prefix + u
        if sk not in source:
            result.missing.append(tk)
        elif source[sk].shape != target[tk].shape:
            result.mismatched.append(
                f"{tk}: checkpoint {tuple(source[sk].shape)} vs model {tuple(target[tk].shape)}"
            )
        else:
            out[tk] = source[sk]
    used = {prefix + u for u in rel}
    for sk in source:
        if not sk.startswith(prefix):
            result.outside.append(sk)
        elif sk not in used:
            (result.unused_heads if _is_head(sk[len(prefix) :]) else result.unused_backbone).append(sk)
    return result


def _is_new_head(result: AlignResult, key: str) -> bool:
    return _is_head(key[len(result.target_prefix) :])


def check_fit(result: AlignResult, *, what: str, model: str, hint: str = "",
              new_heads: bool = False) -> None:
    """Raise :class:`CheckpointMismatchError` (one line) unless the backbone fits exactly, heads
    aside: the source's heads may go unused, and with ``new_heads`` the model's heads may be
    missing from the source (they keep their initialisation)."""
    missing = [k for k in result.missing if not (new_heads and _is_new_head(result, k))]
    fix = f": {hint}" if hint else ": pass --encoder NAME matching the checkpoint"
    if missing and not result.state_dict and not result.mismatched:
        source = sorted(result.unused_backbone + result.unused_heads + result.outside)
        raise CheckpointMismatchError(
            f"{what} does not fit {model}: none of its {len(source)} tensors matches the model's "
            f"{len(result.missing)} keys (its keys look like {source[:3]}, the model's like "
            f"{result.missing[:3]}). It is probably another architecture, or not a backbone{fix}"
        )
    problems = []
    if result.mismatched:
        problems.append(f"{len(result.mismatched)} of another shape (e.g. {result.mismatched[:3]})")
    if missing:
        problems.append(f"{len(missing)} model tensors missing from it (e.g. {missing[:4]})")
    if result.unused_backbone:
        problems.append(
            f"{len(result.unused_backbone)} backbone tensors the model lacks (e.g. {result.unused_backbone[:4]})"
        )
    if problems:
        raise CheckpointMismatchError(
            f"{what} does not fit {model} (looked under key prefix {result.source_prefix!r}): "
            + "; ".join(problems) + f". It is probably another architecture{fix}"
        )


def load_aligned(module: nn.Module, source: Mapping[str, Tensor], *, what: str, model: str,
                 hint: str = "", prefix: str | None = None, new_heads: bool = False) -> AlignResult:
    """Match ``source`` to ``module``'s keys (:func:`align_state_dict`), check the fit
    (:func:`check_fit`) and copy the tensors into the module, bit for bit (in its dtype and
    device). With ``new_heads``, heads the source lacks keep their initialisation."""
    result = align_state_dict(source, module.state_dict(), prefix=prefix)
    check_fit(result, what=what, model=model, hint=hint, new_heads=new_heads)
    outcome = module.load_state_dict(result.state_dict, strict=not new_heads)
    if set(outcome.missing_keys) != set(result.missing) or outcome.unexpected_keys:  # a bug of ours
        raise RuntimeError(f"loading {what}: expected missing {result.missing}, got {outcome}")
    return result


# ---------------------------------------------------------------------------------------------
# Loading into our encoder


def load_encoder(
    checkpoint: str | Path,
    *,
    encoder: str | None = None,
    prefix: str | None = None,
    encoder_kwargs: Mapping[str, Any] | None = None,
) -> LoadedEncoder:
    """Build the encoder and load the checkpoint's backbone into it, strictly (heads aside).

    Args:
        checkpoint: see :func:`read_checkpoint`.
        encoder: a ``create_encoder`` name; needed when the checkpoint does not record one, and
            overriding it when it does.
        prefix: the checkpoint's key prefix of the backbone, when the automatic choice is wrong.
        encoder_kwargs: passed to ``create_encoder``.

    Returns:
        :class:`LoadedEncoder` (encoder in eval mode on the CPU).

    Raises:
        CheckpointMismatchError: the checkpoint is another architecture (names what differs).
        ValueError: no encoder name known, unreadable file.
    """
    from contrastive.nn import create_encoder

    raw = read_checkpoint(checkpoint, encoder=encoder)
    if raw.encoder_name is None:
        raise ValueError(
            f"cannot tell which encoder {raw.path} was trained with (no 'encoder' entry, no "
            "config.json, no 'arch'): pass --encoder NAME (e.g. cifar_resnet18, timm:resnet50)"
        )
    if encoder_kwargs is None and encoder is None:  # e.g. img_size of a ViT, recorded by the engine
        encoder_kwargs = raw.settings.get("encoder_kwargs")
    kwargs = dict(encoder_kwargs or {})
    if raw.kind == "pretrained":
        try:
            model = create_encoder(raw.encoder_name, pretrained=True, **kwargs)
        except Exception as e:
            raise RuntimeError(
                f"could not build {raw.encoder_name} with its pretrained weights ({e}); offline, "
                "the weights must already be in the timm / torch hub cache"
            ) from e
        return LoadedEncoder(model.eval(), raw.encoder_name, raw.kind, None, raw.sha256, meta=raw.meta,
                             settings=raw.settings)
    model = create_encoder(raw.encoder_name, pretrained=False, **kwargs)
    if raw.kind == "random":
        return LoadedEncoder(model.eval(), raw.encoder_name, raw.kind, None, raw.sha256, meta=raw.meta,
                             settings=raw.settings)
    trained_with = raw.recorded_encoder
    hint = (
        f"it records encoder {trained_with!r}; pass --encoder {trained_with}"
        if trained_with and trained_with != raw.encoder_name
        else ""
    )
    result = load_aligned(model, raw.state_dict, what=f"checkpoint {raw.path}",
                          model=f"encoder {raw.encoder_name!r}", hint=hint, prefix=prefix)
    ignored = result.ignored
    if result.unused_heads:
        log.info("ignored %d head tensors of %s: %s", len(result.unused_heads), raw.path, result.unused_heads[:6])
    return LoadedEncoder(model.eval(), raw.encoder_name, raw.kind, raw.path, raw.sha256, ignored, raw.config,
                         raw.meta, raw.files, raw.settings)
