"""Pretrained weights for a backbone (``--init SOURCE``): resolve the source, then load it.

:func:`resolve_init` turns a SOURCE into :class:`InitWeights`, the tensors plus what is known
about them (the file's sha256, the normalisation the weights were trained with, where they came
from); :func:`load_into` copies them into a backbone and reports in one line what loaded, what
is new in the module and what went unused. Sources:

- ``timm:NAME`` / ``torchvision:NAME``: the library's published weights for that model (timm
  tags too: ``timm:resnet50.a1_in1k``), downloaded into the library's cache when online (the
  cached file is used offline); the normalisation is the library's own record of it (timm's
  ``pretrained_cfg``, torchvision's ``weights.transforms()``);
- a local file or run folder, as :func:`~contrastive.eval.checkpoint.read_checkpoint` reads them:
  our ``encoder.pt`` (it records its normalisation), run and checkpoint folders, MoCo files, a
  plain state dict, a checkpoint dict nesting one (timm's ``state_dict_ema`` / ``state_dict``,
  torchvision's ``model``, Lightning's ``state_dict``), ``.safetensors``. A bare file does not
  say how its inputs were normalised: give ``mean`` / ``std`` (the ``--init-mean`` /
  ``--init-std`` flags).

Files are read by ``torch.load(weights_only=True)`` or safetensors: no file runs code.

Wrapper prefixes (``module.`` of DistributedDataParallel, ``_orig_mod.`` of torch.compile,
``backbone.``, ``encoder.``, ``model.``) are stripped by :func:`resolve_init` only when every key
carries one (nothing else can be meant); otherwise :func:`load_into` finds the backbone by
matching the module's keys (:func:`~contrastive.eval.checkpoint.align_state_dict`: a Lightning
module's ``backbone.*`` beside its ``head.*``, a MoCo file's query encoder beside its momentum
copy). Every error is an :class:`InitError` whose text is one line naming the problem and the fix.

Example::

    init = resolve_init("timm:efficientnet_lite0")       # or a file, with mean=, std=
    report = load_into(backbone, init)                    # before any copy of it is made
    config["init"] = init.describe()
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from contrastive.eval.checkpoint import CheckpointMismatchError, load_aligned, read_checkpoint

__all__ = ["InitError", "InitWeights", "InitReport", "resolve_init", "load_into", "download_weights",
           "published_normalisation", "choose_normalisation", "WRAPPER_PREFIXES"]

log = logging.getLogger(__name__)

#: Prefixes a wrapper puts before every key (DDP, torch.compile, a training module's attribute).
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "backbone.", "encoder.", "model.")
_LIBRARIES = ("timm:", "torchvision:")


class InitError(ValueError):
    """An ``--init`` source that cannot be used; ``str(e)`` is one line: the problem and the fix.

    A ``ValueError``, so :func:`contrastive.engine.bad_input` and ``cli`` report it as bad input
    (one line, exit status 2)."""


@dataclass(frozen=True)
class InitWeights:
    """Resolved ``--init`` weights: a state dict for a backbone and what is known about it."""

    source: str  # the SOURCE as given
    state_dict: dict[str, Tensor]
    sha256: str  # of the file's bytes as read
    path: Path | None  # the file read (for a model name: the library's cached download)
    origin: str  # where the weights came from, in words
    kind: str  # "timm", "torchvision", or read_checkpoint's kind: "encoder.pt", "state_dict" ...
    mean: tuple[float, ...] | None = None  # the normalisation the weights were trained with
    std: tuple[float, ...] | None = None
    norm_from: str | None = None  # where mean/std come from ("timm pretrained_cfg", "given" ...)
    encoder: str | None = None  # the architecture the source names or records, if any
    stripped: str = ""  # the wrapper prefix removed from every key ("" : none)

    def describe(self) -> dict[str, Any]:
        """Plain values for ``config.json`` / ``encoder.pt``: source, sha256, normalisation."""
        return {"source": self.source, "sha256": self.sha256, "kind": self.kind,
                "path": str(self.path) if self.path else None, "origin": self.origin,
                "encoder": self.encoder, "mean": list(self.mean) if self.mean else None,
                "std": list(self.std) if self.std else None, "norm_from": self.norm_from}


@dataclass(frozen=True)
class InitReport:
    """What :func:`load_into` did: tensors loaded, module keys left new, source keys unused."""

    source: str
    loaded: int
    new: list[str] = field(default_factory=list)  # the module's heads the weights lack
    unused: list[str] = field(default_factory=list)  # the weights' heads and other copies
    found_under: str = ""  # the source key prefix the backbone was matched under
    stripped: str = ""  # the wrapper prefix resolve_init removed from every key

    def line(self) -> str:
        """The one-line summary the recipes log."""
        where = (f" (found under {self.found_under!r} by matching the module's keys)" if self.found_under
                 else f" ({self.stripped!r} stripped: every key carries it)" if self.stripped else "")
        return (f"--init {self.source}: loaded {self.loaded} tensors{where}; new in the module: "
                f"{_some(self.new)}; unused: {_some(self.unused)}")


def _some(keys: Sequence[str], shown: int = 4) -> str:
    if not keys:
        return "none"
    more = f", ... ({len(keys)} in all)" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def _floats(values: Sequence[float] | None, what: str, source: str) -> tuple[float, ...] | None:
    if values is None:
        return None
    out = tuple(float(v) for v in values)
    if len(out) not in (1, 3) or (what == "std" and min(out) <= 0):
        raise InitError(f"--init {source}: --init-{what} {list(out)} must be 1 or 3 numbers"
                        + (" above 0" if what == "std" else ""))
    return out


def resolve_init(source: str | Path, *, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None) -> InitWeights:
    """The weights and provenance of an ``--init`` SOURCE (see the module docstring).

    Args:
        source: ``timm:NAME``, ``torchvision:NAME``, a weights file or a run folder.
        mean, std: the normalisation the weights were trained with (``--init-mean`` /
            ``--init-std``); they override what the source records. Both or neither.

    Raises:
        InitError: an unknown name, a failed download (offline), a missing or unreadable file,
            a pickle that would run code, a file holding no tensors.
    """
    spec = str(source)
    given_mean, given_std = _floats(mean, "mean", spec), _floats(std, "std", spec)
    if (given_mean is None) != (given_std is None):
        raise InitError(f"--init {spec}: give both --init-mean and --init-std (or neither)")
    if spec.startswith(_LIBRARIES) and not Path(spec).exists():
        path, origin, encoder, (lib_mean, lib_std) = _published(spec)
        kind, settings = spec.split(":", 1)[0], {"mean": lib_mean, "std": lib_std}
        recorded_by = f"{kind} pretrained_cfg" if kind == "timm" else "torchvision weights.transforms()"
    else:
        if spec.startswith("hf:"):
            raise InitError(f"--init {spec}: hf: folders are text encoders (the text-encoder "
                            "source); --init takes an image backbone's weights")
        if spec == "random":
            raise InitError("--init random: leave --init out for a random start")
        path, origin, encoder, kind, settings = None, "", None, "", {}
        recorded_by = "recorded in the checkpoint"
    try:
        raw = read_checkpoint(path or spec)
    except (ValueError, OSError) as e:
        message = _one_line(e)  # the path said once
        for named in {str(path), spec, str(Path(spec).expanduser())}:
            message = message.removeprefix(f"{named}: ")
        raise InitError(f"--init {spec}: {message}") from None
    if path is None:
        path, kind, encoder, settings = raw.path, raw.kind, raw.recorded_encoder, raw.settings
        origin = f"{raw.kind} file {raw.path}" + (f" (its {raw.state_key!r} entry)" if raw.state_key else "")
    state, stripped = _strip_wrapper(raw.state_dict)
    if stripped:
        log.info("--init %s: stripped %r from every key (a wrapper's prefix)", spec, stripped)
    norm_mean, norm_std, norm_from = _normalisation(spec, (given_mean, given_std),
                                                    (settings.get("mean"), settings.get("std")), recorded_by)
    return InitWeights(spec, state, raw.sha256, path, origin, kind, norm_mean, norm_std, norm_from,
                       encoder, stripped)


def load_into(module: nn.Module, init: InitWeights, *, prefix: str | None = None) -> InitReport:
    """Copy ``init``'s tensors into ``module`` (a backbone), bit for bit, and log one line.

    Every backbone tensor of the module must come from the weights with its shape; the
    module's heads (``fc``, ``head``, ``classifier``, ``projector`` ...) may be new (they keep
    their initialisation), and the weights' heads and other copies may go unused.

    Args:
        module: the backbone (before a method copies it into momentum or teacher encoders).
        init: from :func:`resolve_init`.
        prefix: the weights' key prefix of the backbone, when the automatic match is wrong.

    Raises:
        InitError: a shape mismatch (names the key and both shapes), a key set that does not
            match (names both sides' keys), backbone tensors missing or left over.
    """
    candidates = [init.state_dict]
    if init.stripped:  # a module whose own keys start with the wrapper's name: the keys as saved
        candidates.append({init.stripped + k: v for k, v in init.state_dict.items()})
    errors: list[CheckpointMismatchError] = []
    for state in candidates:
        try:  # check_fit raises before anything is copied
            result = load_aligned(module, state, what=f"--init {init.source}",
                                  model=f"the {type(module).__name__} backbone", prefix=prefix,
                                  new_heads=True, hint="give the weights of this architecture (or "
                                  "the --encoder they were trained with)")
            break
        except CheckpointMismatchError as e:
            errors.append(e)
    else:
        raise InitError(str(errors[0])) from None
    report = InitReport(init.source, len(result.state_dict), list(result.missing), result.ignored,
                        result.source_prefix, "" if errors else init.stripped)
    log.info("%s", report.line())
    return report


def _normalisation(spec: str, given: tuple[tuple[float, ...] | None, tuple[float, ...] | None],
                   known: tuple[Any, Any], recorded_by: str
                   ) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None, str | None]:
    """(mean, std, where they come from): the given ones, else those the source records."""
    known_pair = tuple(tuple(float(v) for v in t) if t else None for t in known)
    if given[0] is not None:
        if known_pair[0] is not None and known_pair != given:
            log.warning("--init %s: using the given mean %s / std %s, not %s / %s (%s)", spec,
                        given[0], given[1], known_pair[0], known_pair[1], recorded_by)
        return given[0], given[1], "given (--init-mean/--init-std)"
    if known_pair[0] is not None and known_pair[1] is not None:
        return known_pair[0], known_pair[1], recorded_by
    return None, None, None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().strip("'\"")
    return text.splitlines()[0] if text else type(e).__name__


def _strip_wrapper(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    """``state`` without the wrapper prefixes every key carries, and the prefix removed."""
    stripped = ""
    keys = list(state)
    while keys:
        common = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in keys)), None)
        if common is None:
            break
        stripped += common
        keys = [k[len(common):] for k in keys]
    n = len(stripped)
    return {k[n:]: v for k, v in state.items()}, stripped


# ---------------------------------------------------------------------------------------------
# Published weights of a library's model


def _published(spec: str) -> tuple[Path, str, str, tuple[Any, Any]]:
    """(the downloaded file, origin, encoder name, (mean, std)) of ``timm:`` / ``torchvision:``."""
    lib, name = spec.split(":", 1)
    try:
        where, filename, origin, encoder, norm = (_timm_weights if lib == "timm" else _torchvision_weights)(name)
    except ImportError as e:
        raise InitError(f"--init {spec}: {lib} is not installed ({e}); pip install {lib}") from None
    try:
        path = download_weights(where, filename)
    except Exception as e:  # offline, a proxy, a removed file: the local-file form is the fix
        mean, std = (",".join(f"{v:g}" for v in t) for t in norm)
        raise InitError(
            f"--init {spec}: could not download its published weights ({type(e).__name__}: "
            f"{_one_line(e)}); offline, give the weights file: --init FILE --init-mean {mean} "
            f"--init-std {std}") from None
    return path, f"{origin} -> {path}", encoder, norm


_Published = tuple[str, "str | None", str, str, tuple[Any, Any]]  # where, file, origin, encoder, norm


def _timm_weights(name: str) -> _Published:
    import timm
    from timm.models import get_pretrained_cfg

    if not timm.is_model(name):
        raise InitError(f"--init timm:{name}: timm has no model {name!r} (timm.list_models('{name[:4]}*') "
                        "lists the names)")
    cfg = get_pretrained_cfg(name)
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        raise InitError(f"--init timm:{name}: timm publishes no weights for it (timm.list_pretrained() "
                        "lists those that have); or give a weights file")
    if cfg.custom_load or str(cfg.url or "").endswith(".npz"):
        raise InitError(f"--init timm:{name}: its published weights need timm's own converter; "
                        "save timm.create_model(name, pretrained=True).state_dict() and give that file")
    url = cfg.url[0] if isinstance(cfg.url, tuple) else cfg.url
    where = f"hf-hub:{cfg.hf_hub_id}" if cfg.hf_hub_id else str(url)
    filename = cfg.hf_hub_filename if cfg.hf_hub_id else None
    return where, filename, f"timm {name} ({where})", f"timm:{cfg.architecture}", (cfg.mean, cfg.std)


def _torchvision_weights(name: str) -> _Published:
    import torchvision.models as tvm

    try:
        weights = tvm.get_model_weights(name).DEFAULT
    except (ValueError, KeyError):
        raise InitError(f"--init torchvision:{name}: torchvision has no weights for {name!r} "
                        "(torchvision.models.list_models() lists the models)") from None
    preset = weights.transforms()
    return weights.url, None, f"torchvision {name} ({weights})", f"torchvision:{name}", (preset.mean, preset.std)


def published_normalisation(spec: str) -> tuple[Any, Any]:
    """(mean, std) that a ``timm:NAME`` / ``torchvision:NAME`` model's published weights were
    trained with, as its library records it (timm's ``pretrained_cfg``, torchvision's
    ``weights.transforms()``): what ``--init`` and a distillation teacher normalise with."""
    kind, _, name = spec.partition(":")
    if kind not in ("timm", "torchvision"):
        raise InitError(f"{spec}: not a timm:NAME or torchvision:NAME model")
    return (_timm_weights if kind == "timm" else _torchvision_weights)(name)[-1]


def choose_normalisation(mean: Sequence[float] | None, std: Sequence[float] | None, *,
                         recorded: tuple[Sequence[float] | None, Sequence[float] | None] = (None, None),
                         recorded_from: str = "recorded with the weights",
                         published: str | None = None) -> tuple[tuple[float, ...], tuple[float, ...], str]:
    """(mean, std, where they come from) of the images an encoder is given: the one rule every
    command that feeds it images follows (the eval CLIs, ``contrastive-embed``, the ONNX export).

    In order: the ``mean`` / ``std`` the user gives (both or neither); those ``recorded`` with the
    weights (``encoder.pt``, a run's config.json, an ``--init`` source's record); the published
    weights' own (``published``: a ``timm:NAME`` / ``torchvision:NAME`` loaded with its
    library's weights); else ImageNet's, the library's default.

    Raises:
        ValueError: only one of ``mean`` / ``std`` given.
    """
    from contrastive.augment import IMAGENET_MEAN, IMAGENET_STD

    if (mean is None) != (std is None):
        raise ValueError(f"give both --mean and --std (or neither); got mean={mean}, std={std}")
    if mean is not None and std is not None:
        found: tuple[Any, Any] = (mean, std)
        source = "--mean / --std"
    elif recorded[0] is not None and recorded[1] is not None:
        found, source = recorded, recorded_from
    elif published is not None:
        found, source = published_normalisation(published), "the library's record of its published weights"
    else:
        found, source = (IMAGENET_MEAN, IMAGENET_STD), "not recorded: ImageNet's (the default)"
    return tuple(float(v) for v in found[0]), tuple(float(v) for v in found[1]), source


def download_weights(where: str, filename: str | None = None) -> Path:
    """The local file of published weights, downloaded into the library's cache unless it is
    there (and used from it offline): ``hf-hub:REPO[@REVISION]`` (the Hugging Face hub:
    ``filename``, else ``model.safetensors``, else ``pytorch_model.bin``) or a URL (torch hub's
    ``checkpoints/`` folder, as torchvision and timm keep them)."""
    if where.startswith("hf-hub:"):
        import huggingface_hub
        from huggingface_hub import errors

        repo, _, revision = where[len("hf-hub:"):].partition("@")
        names = [filename] if filename else ["model.safetensors", "pytorch_model.bin"]
        for name in names[:-1]:
            try:
                return Path(huggingface_hub.hf_hub_download(repo, name, revision=revision or None))
            except errors.EntryNotFoundError as e:  # not on the hub: the next name; not cached: fail
                if isinstance(e, errors.LocalEntryNotFoundError):
                    raise
        return Path(huggingface_hub.hf_hub_download(repo, names[-1], revision=revision or None))
    import torch.hub

    target = Path(torch.hub.get_dir()) / "checkpoints" / Path(where.split("?")[0]).name
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(where, str(target), progress=False)
    return target
