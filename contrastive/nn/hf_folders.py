"""sentence-transformers folders read here: the pooling pipeline after the transformer.

:func:`read_sentence_pooling` reads a folder's pipeline (``modules.json``: pooling modes, Dense
layers, Normalize) and :class:`SentencePooling` applies it to a :class:`TextEncoder`'s last
layer, as sentence-transformers' ``Pooling`` / ``Dense`` / ``Normalize`` modules do
(``contrastive-sts-eval`` follows a folder's own pooling this way). The folder format's names
(``ST_*``) are defined here once; the writers (``contrastive-export`` and a text run's
``model/``) are evaluation's, :mod:`contrastive.eval.export_text`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from contrastive.nn.text_encoders import TextEncoder

__all__ = [
    "ST_CONFIG",
    "ST_DENSE_DIR",
    "ST_KEYS",
    "ST_MODES",
    "ST_MODULES",
    "ST_POOLING_DIR",
    "ST_TANH",
    "ST_TYPE_PREFIX",
    "ST_UNSUPPORTED_KEYS",
    "SentencePooling",
    "read_sentence_pooling",
]

ST_MODULES, ST_CONFIG, ST_POOLING_DIR, ST_DENSE_DIR = (
    "modules.json", "sentence_bert_config.json", "1_Pooling", "2_Dense")
ST_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")
"""Token poolings read here, in sentence-transformers' concatenation order."""
ST_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
           "mean": "pooling_mode_mean_tokens",
           "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens"}
"""``1_Pooling/config.json``'s key of each mode."""
ST_UNSUPPORTED_KEYS = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
ST_TANH = "torch.nn.modules.activation.Tanh"
"""A Dense module's tanh, as sentence-transformers names it."""
ST_TYPE_PREFIX = "sentence_transformers.models."
_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    ST_TANH: torch.tanh,
    "torch.nn.modules.linear.Identity": lambda x: x,
}


@dataclass
class SentencePooling:
    """A sentence-transformers pipeline after the transformer: pool, dense layers, normalise.

    Attributes:
        modes: token poolings of :data:`ST_MODES`, concatenated in that order.
        dense: (weight (out, in), bias (out,) or None, activation name) per Dense module.
        normalize: unit length at the end (a ``Normalize`` module).
        transformer_dir: the folder holding the HF model and tokenizer.
        max_seq_length: ``sentence_bert_config.json``'s, if the folder has one.
    """

    modes: tuple[str, ...]
    dense: list[tuple[Tensor, Tensor | None, str]] = field(default_factory=list)
    normalize: bool = False
    transformer_dir: Path | None = None
    max_seq_length: int | None = None

    def describe(self) -> str:
        """E.g. ``"mean"``, ``"cls+dense(tanh)+normalize"``."""
        parts = ["+".join(self.modes)]
        parts += [f"dense({name.rsplit('.', 1)[-1].lower()})" for _, _, name in self.dense]
        return "+".join(parts + (["normalize"] if self.normalize else []))

    def pool(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """(B, D) sentence embeddings of the last layer (B, T, H) and its mask (B, T)."""
        m = mask.to(hidden.dtype).unsqueeze(-1)
        outs = []
        for mode in ST_MODES:
            if mode not in self.modes:
                continue
            if mode == "cls":
                outs.append(hidden[:, 0])
            elif mode == "max":  # padding excluded as sentence-transformers does (-1e9)
                outs.append(hidden.masked_fill(m == 0, -1e9).max(1).values)
            else:
                total, count = (hidden * m).sum(1), m.sum(1).clamp(min=1e-9)
                outs.append(total / (count if mode == "mean" else count.sqrt()))
        out = torch.cat(outs, dim=1)
        for weight, bias, act in self.dense:
            out = _ACTIVATIONS[act](F.linear(out, weight.to(out), None if bias is None
                                             else bias.to(out)))
        return F.normalize(out, dim=-1) if self.normalize else out

    def embedder(self, encoder: TextEncoder) -> Callable[..., Tensor]:
        """``embed(input_ids, attention_mask, token_type_ids)`` -> (B, D) through ``encoder``."""
        def embed(ids: Tensor, mask: Tensor, types: Tensor | None = None) -> Tensor:
            return self.pool(encoder.encode(ids, mask, types).hidden_states[-1], mask)
        return embed


def _module_kind(entry: dict[str, Any]) -> str:
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def read_sentence_pooling(folder: str | Path) -> SentencePooling | None:
    """The pipeline of a sentence-transformers folder, or None if ``folder`` is not one
    (no ``modules.json``). Only safetensors Dense weights are read (no pickle).

    Raises:
        ValueError: a module or pooling mode this reader does not apply (the message names it
            and the fix: ``--pooling`` evaluates the bare encoder).
    """
    root = Path(folder)
    if not (root / ST_MODULES).is_file():
        return None
    modules = json.loads((root / ST_MODULES).read_text(encoding="utf-8"))
    fix = "pass --pooling (cls, mean, max, pooler) to evaluate the bare encoder"
    result: SentencePooling | None = None
    transformer_dir: Path | None = None
    for entry in sorted(modules, key=lambda e: int(e.get("idx", 0))):
        kind, path = _module_kind(entry), root / str(entry.get("path", ""))
        if kind == "Transformer":
            transformer_dir = path
        elif kind == "Pooling":
            result = SentencePooling(_read_modes(path / "config.json", fix))
        elif kind == "Dense" and result is not None:
            result.dense.append(_read_dense(path, fix))
        elif kind == "Normalize" and result is not None:
            result.normalize = True
        else:
            raise ValueError(f"{root / ST_MODULES}: module {entry.get('type')!r} (at this place) "
                             f"is not applied by this reader; {fix}")
    if result is None or transformer_dir is None:
        raise ValueError(f"{root / ST_MODULES} lists no Transformer + Pooling modules; {fix}")
    result.transformer_dir = transformer_dir
    config = transformer_dir / ST_CONFIG
    if config.is_file():
        length = json.loads(config.read_text(encoding="utf-8")).get("max_seq_length")
        result.max_seq_length = int(length) if length else None
    return result


def _read_modes(path: Path, fix: str) -> tuple[str, ...]:
    if not path.is_file():
        raise ValueError(f"{path} is missing (the Pooling module's configuration); {fix}")
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if cfg.get("pooling_mode"):  # some versions accept the mode as one string
        cfg[ST_KEYS.get(str(cfg["pooling_mode"]), str(cfg["pooling_mode"]))] = True
    bad = [k for k in ST_UNSUPPORTED_KEYS if cfg.get(k)]
    modes = tuple(m for m in ST_MODES if cfg.get(ST_KEYS[m]))
    if bad or not modes:
        raise ValueError(f"{path}: pooling {bad or 'none'} is not applied by this reader; {fix}")
    return modes


def _read_dense(path: Path, fix: str) -> tuple[Tensor, Tensor | None, str]:
    from safetensors.torch import load_file

    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    act = str(cfg.get("activation_function", ST_TANH))
    if act not in _ACTIVATIONS:
        raise ValueError(f"{path}: Dense activation {act!r} is not one of {sorted(_ACTIVATIONS)}; "
                         f"{fix}")
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{path}: no model.safetensors (a pickled pytorch_model.bin is not read: "
                         f"it could run code); re-save the model with safetensors, or {fix}")
    state = load_file(str(weights))
    return state["linear.weight"], state.get("linear.bias"), act
