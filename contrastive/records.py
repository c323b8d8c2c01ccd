"""What a run leaves on disk, defined once: the ``encoder.pt`` record and the run-folder layout.

Training (:mod:`contrastive.engine`) writes these files and evaluation (:mod:`contrastive.eval`)
reads them; both import this module, which sits below them and imports only torch.

``encoder.pt`` (:class:`EncoderRecord`) is a ``torch.save`` of plain values and tensors, so it
loads with ``torch.load(path, weights_only=True)`` (no code runs)::

    {"schema": 1, "encoder": "<create_encoder name>", "encoder_kwargs": {...},
     "state_dict": {<backbone key>: tensor}, "image_size": 224, "mean": [...], "std": [...],
     "num_features": 2048, "step": 1000, "recipe": "moco_r50", "method": "MoCo"}

``create_encoder(encoder, **encoder_kwargs).load_state_dict(state_dict)`` rebuilds the backbone;
``image_size``, ``mean`` and ``std`` are the pretraining crop size and normalisation, which
evaluation uses by default. Files written before the ``schema`` field existed (schema 0: the same
keys, some optional) still load.

The run folder (``--output-dir``)::

    config.json            the run's configuration; ``resolved.encoder_kwargs`` the full
                           ``create_encoder`` keyword arguments (older runs: the
                           ``encoder_kwargs`` JSON string only)
    metrics.jsonl          one JSON record per log line
    run_state.json         running / stopped / completed / failed
    encoder.pt             the record above (written at the end of a run)
    clip.pt, tokenizer/    image-text runs: the whole model (:func:`save_clip_record`)
    model/                 text runs: a Hugging Face and sentence-transformers folder
                           (config.json, model.safetensors, tokenizer files, modules.json,
                           1_Pooling/) and simcse.json, its evaluation pooling and step
                           (:func:`contrastive.eval.export_text.save_sentence_model`);
                           labelled-text runs: a Hugging Face classifier folder and
                           classifier.json (:mod:`contrastive.eval.classifier_folder`)
    results.json           labelled-text runs: the task and the latest dev metrics
    best/                  ``--keep-best``: the same artefacts at the best evaluation
    checkpoints/step_<8 digits>/   a complete checkpoint has ``meta.json`` (written last)
    trackers.json          ``--report-to``: the trackers' run ids, which a resume continues
                           (:mod:`contrastive.engine.trackers`); beside it their own data:
                           tensorboard/, wandb/, mlflow.db and mlartifacts/
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "ENCODER_FILE", "CONFIG_FILE", "CHECKPOINTS", "META", "MODEL_FILE", "SCHEMA", "STEP_PREFIX",
    "EncoderRecord", "RecordError", "step_dir_name", "complete_checkpoints", "find_latest",
    "resolve_run_path", "encoder_fields_from_config", "CLIP_FILE", "TOKENIZER_DIR",
    "BEST_DIR", "save_clip_record", "load_clip_record", "MODEL_DIR", "SENTENCE_CONFIG",
    "CLASSIFIER_FILE", "CLASSIFIER_HEAD_FILE", "RESULTS_FILE",
    "sentence_model_step", "TRACKERS_FILE", "TENSORBOARD_DIR", "recorded_normalisation",
]

ENCODER_FILE = "encoder.pt"
CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"
META = "meta.json"  # a checkpoint folder is complete when it has this file
MODEL_FILE = "model.safetensors"
#: encoder.pt schema this version writes; it reads every schema up to this one
SCHEMA = 1
CLIP_FILE = "clip.pt"
TOKENIZER_DIR = "tokenizer"
BEST_DIR = "best"
MODEL_DIR = "model"  # text runs: a Hugging Face folder
SENTENCE_CONFIG = "simcse.json"  # in it: the evaluation pooling (contrastive-sts-eval reads it)
CLASSIFIER_FILE = "classifier.json"  # in a classifier's model/: sizes, labels, task, step
CLASSIFIER_HEAD_FILE = "classifier_head.safetensors"  # its prediction layer, when HF has none
RESULTS_FILE = "results.json"  # labelled-text runs: the task and the latest dev metrics
TRACKERS_FILE = "trackers.json"  # --report-to: the tracker runs a resume continues
TENSORBOARD_DIR = "tensorboard"  # --report-to tensorboard: event files in <run>/tensorboard/<recipe>
STEP_PREFIX = "step_"  # checkpoints/step_<8 digits>; saves in progress: .tmp-step_<8 digits>
_STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")
_OPTIONAL = ("image_size", "mean", "std", "num_features", "step", "recipe", "method")


class RecordError(ValueError):
    """An ``encoder.pt`` this version cannot read; the message names the file and the fix."""


@dataclass
class EncoderRecord:
    """A pretrained backbone and what evaluation needs to rebuild and feed it.

    ``state_dict`` is the backbone's own (no prefixes, no heads), on the CPU.
    """

    encoder: str
    state_dict: dict[str, Tensor]
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)
    image_size: int | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    num_features: int | None = None
    step: int | None = None
    recipe: str | None = None
    method: str | None = None
    schema: int = SCHEMA

    @classmethod
    def from_module(cls, module: nn.Module, encoder: str, *,
                    encoder_kwargs: Mapping[str, Any] | None = None,
                    mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                    **fields: Any) -> EncoderRecord:
        """The record of a live backbone: its state dict detached, on the CPU, contiguous."""
        state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
        return cls(encoder=encoder, state_dict=state, encoder_kwargs=dict(encoder_kwargs or {}),
                   mean=None if mean is None else [float(v) for v in mean],
                   std=None if std is None else [float(v) for v in std],
                   num_features=int(getattr(module, "num_features", 0)) or None, **fields)

    def meta(self) -> dict[str, Any]:
        """The plain fields (everything but the tensors)."""
        return {"schema": self.schema, "encoder": self.encoder,
                "encoder_kwargs": dict(self.encoder_kwargs),
                **{k: getattr(self, k) for k in _OPTIONAL}}

    def save(self, path: str | Path) -> Path:
        """Write the record atomically (a temporary file renamed over ``path``)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({**self.meta(), "state_dict": self.state_dict}, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def from_payload(cls, obj: Any, where: str = "encoder.pt") -> EncoderRecord:
        """The record in a loaded ``encoder.pt`` payload; :class:`RecordError` if it is none."""
        if not is_record(obj):
            raise RecordError(f"{where} is not an encoder record (a dict with 'encoder' and "
                              "'state_dict'); pass a run folder, encoder.pt or checkpoint folder")
        schema = obj.get("schema", 0)
        if not isinstance(schema, int) or schema > SCHEMA:
            raise RecordError(f"{where} has encoder-record schema {schema!r}; this version reads "
                              f"schemas 0-{SCHEMA}: upgrade contrastive to read it")
        kwargs = obj.get("encoder_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise RecordError(f"{where}: encoder_kwargs is {type(kwargs).__name__}, not a dict")
        tensors = {k: v for k, v in obj["state_dict"].items() if isinstance(v, Tensor)}
        if not tensors:
            raise RecordError(f"{where} holds no tensors in its state_dict")
        fields: dict[str, Any] = {k: obj.get(k) for k in _OPTIONAL}
        fields["mean"], fields["std"] = recorded_normalisation(obj)
        for k in ("image_size", "num_features", "step"):
            if fields[k] is not None:
                fields[k] = int(fields[k])
        return cls(encoder=obj["encoder"], state_dict=tensors, encoder_kwargs=dict(kwargs),
                   schema=schema, **fields)

    @classmethod
    def load(cls, path: str | Path, *, mmap: bool = False) -> EncoderRecord:
        """Read ``path`` with ``torch.load(weights_only=True)`` (nothing in it can run code)."""
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception as e:  # noqa: BLE001 - pickled code, a damaged or foreign file
            raise RecordError(f"cannot read {path} with torch.load(weights_only=True): "
                              f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
                              ) from e
        return cls.from_payload(obj, str(path))


def is_record(obj: Any) -> bool:
    """Whether a loaded payload is an encoder record (any schema)."""
    return (isinstance(obj, Mapping) and isinstance(obj.get("encoder"), str)
            and isinstance(obj.get("state_dict"), Mapping))


def recorded_normalisation(fields: Mapping[str, Any]
                           ) -> tuple[list[float] | None, list[float] | None]:
    """(mean, std) of the input normalisation a file records in its plain fields: ``encoder.pt``'s,
    or ``clip.pt``'s ``config`` (the image tower's); None for one it does not record (files
    written before it was recorded: the reader's own default applies)."""
    mean, std = (fields.get(k) for k in ("mean", "std"))
    return (None if mean is None else [float(v) for v in mean],
            None if std is None else [float(v) for v in std])


def encoder_fields_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``encoder``, ``encoder_kwargs`` (a dict), ``image_size`` and the input normalisation
    (``mean``, ``std``: ``resolved.normalisation``, the image pipeline's) of a run's
    ``config.json``.

    ``resolved.encoder_kwargs`` (the recipe's full ``create_encoder`` keyword arguments) wins;
    runs written before it existed give the ``--encoder-kwargs`` JSON string. A field the config
    lacks is None (``encoder_kwargs``: empty).
    """
    resolved = config.get("resolved")
    kwargs: Any = resolved.get("encoder_kwargs") if isinstance(resolved, Mapping) else None
    if kwargs is None:
        kwargs = config.get("encoder_kwargs") or {}
        if isinstance(kwargs, str):
            try:
                kwargs = json.loads(kwargs) if kwargs.strip() else {}
            except json.JSONDecodeError as e:
                raise RecordError(f"config.json: encoder_kwargs {kwargs!r} is not JSON ({e})"
                                  ) from None
    if not isinstance(kwargs, Mapping):
        raise RecordError(f"config.json: encoder_kwargs is {type(kwargs).__name__}, not an object")
    encoder = config.get("encoder")
    size = config.get("image_size")
    norm = resolved.get("normalisation") if isinstance(resolved, Mapping) else None
    mean, std = recorded_normalisation(norm if isinstance(norm, Mapping) else {})
    return {"encoder": encoder if isinstance(encoder, str) else None,
            "encoder_kwargs": dict(kwargs),
            "image_size": int(size) if isinstance(size, int) and not isinstance(size, bool)
            else None, "mean": mean, "std": std}


# ----------------------------------------------------------------------------------------------
# the checkpoints folder


def step_dir_name(step: int) -> str:
    """The folder name of the checkpoint at ``step``: ``step_00001000``."""
    return f"{STEP_PREFIX}{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every complete checkpoint under ``root`` (a run's
    ``checkpoints/``), oldest first; saves in progress (``.tmp-*``) are not listed."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / META).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def find_latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint folder under ``root`` (``checkpoints/``), or None."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def resolve_run_path(path: str | Path) -> Path:
    """What to read for ``path``: a run folder gives its ``encoder.pt``, else its newest complete
    checkpoint folder; a checkpoint folder or a file is returned unchanged.

    Raises ``FileNotFoundError`` for a folder that is none of these.
    """
    path = Path(path)
    if not path.is_dir() or (path / META).is_file():
        return path
    if (path / ENCODER_FILE).is_file():
        return path / ENCODER_FILE
    latest = find_latest(path / CHECKPOINTS)
    if latest is not None:
        return latest
    raise FileNotFoundError(
        f"{path} is a folder without {ENCODER_FILE}, {META} or a complete "
        f"{CHECKPOINTS}/step_*/ (with {META}): pass an encoder.pt, a run folder or a checkpoint "
        "folder")


# ----------------------------------------------------------------------------------------------
# image-text runs: clip.pt (weights + plain config) and tokenizer/


def save_clip_record(folder: str | Path, state_dict: Mapping[str, Tensor],
                     config: Mapping[str, Any], tokenizer: Any) -> Path:
    """Write ``clip.pt`` (``{"config": ..., "state_dict": ...}``, tensors and plain values only:
    ``weights_only`` loads it; ``config["model"]`` holds the model's keyword arguments,
    ``config["max_length"]`` the token length, ``config["mean"]`` / ``["std"]`` the image
    tower's input normalisation, :func:`recorded_normalisation`) and
    ``tokenizer/tokenizer.json``, each atomically; returns ``clip.pt``'s path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json.dumps(config)  # only plain values: the file must not need code to load
    state = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    tokenizer.save(folder / TOKENIZER_DIR)
    tmp = folder / (CLIP_FILE + ".tmp")
    torch.save({"config": dict(config), "state_dict": state}, tmp)
    os.replace(tmp, folder / CLIP_FILE)
    return folder / CLIP_FILE


def load_clip_record(folder: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(state_dict, config) of ``folder/clip.pt``, read with ``weights_only=True``."""
    path = Path(folder) / CLIP_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CLIP_FILE}: pass the output folder of "
                                "recipes/clip.py")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    return dict(blob["state_dict"]), dict(blob["config"])


# ----------------------------------------------------------------------------------------------
# text runs: model/ (a Hugging Face folder) with simcse.json


def sentence_model_step(folder: str | Path) -> int | None:
    """The ``step`` recorded in ``folder``'s :data:`SENTENCE_CONFIG` (None: absent, unreadable
    or without one)."""
    try:
        step = json.loads((Path(folder) / SENTENCE_CONFIG).read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None
