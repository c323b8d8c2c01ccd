"""Text encoders: Hugging Face transformer models behind one small, offline wrapper.

Two ways in, both through the encoder registry (:func:`contrastive.nn.create_encoder`):

- ``create_encoder("hf:/path/to/bert-base-uncased")``: a local Hugging Face checkpoint folder
  (``config.json`` plus ``model.safetensors`` or ``pytorch_model.bin``). Nothing is downloaded
  (``local_files_only=True``; a Hub id such as ``"bert-base-uncased"`` is not fetched), no code
  from the folder runs (``trust_remote_code=False``), safetensors is preferred when present and
  a ``.bin`` file is read with ``torch.load(weights_only=True)``, which refuses pickles that
  need code (:class:`UnsafeCheckpointError`). The folder's weights are always loaded.
- ``create_encoder("bert", num_layers=4, hidden_size=312, num_heads=12, intermediate_size=1200,
  vocab_size=30522)``: a BERT built from a configuration with random weights (e.g. the 4 x 312
  student of TinyBERT / LRC-BERT), or ``create_encoder("bert", config="/path/to/folder")`` for
  the architecture of a local checkpoint without its weights.

A recipe's text model (``--model``, ``--student``, ``--encoder``) is one of those two names,
built by :func:`text_encoder` from the sizes as every recipe's flags spell them (``--layers``,
``--hidden``, ``--heads``, ``--intermediate-size``, ``--dropout``; :func:`bert_options`) or from
the folder, optionally keeping some of its layers (``--keep-layers``, :func:`encoder_from_layers`).

The wrapper, :class:`TextEncoder`, has ``num_features`` (the hidden size) like every encoder.
``encoder(input_ids, attention_mask)`` (or ``encoder(batch)`` with a dict holding those keys)
returns the pooled output (B, H); :meth:`TextEncoder.encode` returns everything a distiller
needs (:class:`TextEncoderOutput`):

- ``hidden_states``: a tuple of ``num_layers`` tensors (B, T, H), the output of each
  transformer layer, shallow to deep (the embedding-layer output is *not* among them);
- ``embeddings``: (B, T, H), the embedding-layer output (word + position + token type,
  LayerNorm, dropout): the input of layer 1, and the place where LRC-BERT perturbs;
- ``pooled``: (B, H), see ``pooling`` below;
- ``attention_mask``: (B, T), 1 for real tokens and 0 for padding; hidden states at padded
  positions are computed but meaningless, mask them in any reduction over tokens.

``pooling``: ``"pooler"`` (the model's own pooler, BERT's tanh dense layer on [CLS]),
``"cls"`` (the last layer's first token), ``"mean"`` (masked mean of the last layer over real
tokens), or ``"auto"`` (the pooler when the model has one, else ``"cls"``).
"""

from __future__ import annotations

import copy
import json
import logging
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from contrastive.optional_deps import require

__all__ = [
    "POOLINGS",
    "TextEncoder",
    "TextEncoderOutput",
    "UnsafeCheckpointError",
    "bert_options",
    "check_safe_weights",
    "build_text_encoder",
    "encoder_from_layers",
    "hf_folder",
    "load_text_encoder",
    "text_encoder",
]

log = logging.getLogger(__name__)

POOLINGS = ("auto", "pooler", "cls", "mean")
_SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
_PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that would need to run code to load; it was not loaded."""


@dataclass
class TextEncoderOutput:
    """Everything one pass of a :class:`TextEncoder` produces (shapes in the module docstring)."""

    hidden_states: tuple[Tensor, ...]
    embeddings: Tensor
    pooled: Tensor
    attention_mask: Tensor


class TextEncoder(nn.Module):
    """A Hugging Face encoder model (BERT-like) with per-layer outputs and a pooled feature.

    Args:
        model: a ``transformers`` base model (``BertModel``, ``RobertaModel``, ...), called with
            ``output_hidden_states=True``.
        pooling: one of :data:`POOLINGS`.

    Attributes:
        num_features, hidden_size: the hidden size H; num_layers: the number of layers L.
    """

    def __init__(self, model: nn.Module, pooling: str = "auto") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"TextEncoder: pooling must be one of {POOLINGS}, got {pooling!r}")
        has_pooler = getattr(model, "pooler", None) is not None
        if pooling == "auto":
            pooling = "pooler" if has_pooler else "cls"
        if pooling == "pooler" and not has_pooler:
            raise ValueError(
                f"TextEncoder: {type(model).__name__} has no pooler; use pooling='cls' or 'mean'"
            )
        self.model = model
        self.pooling = pooling
        config: Any = model.config  # a transformers PretrainedConfig
        self.hidden_size: int = int(config.hidden_size)
        self.num_features: int = self.hidden_size
        self.num_layers: int = int(config.num_hidden_layers)

    @property
    def config(self) -> Any:
        """The wrapped model's ``transformers`` configuration."""
        return self.model.config

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        embedding_delta: Tensor | None = None,
    ) -> TextEncoderOutput:
        """One pass; see :class:`TextEncoderOutput` and the module docstring for shapes.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T), 1 = token, 0 = padding (default: all ones).
            token_type_ids: (B, T) segment ids (default: the model's, zeros for BERT).
            embedding_delta: optional (B, T, H) added to the embedding-layer output before
                layer 1 (gradient perturbation, LRC-BERT); the returned ``embeddings`` are the
                perturbed ones.
        """
        if input_ids.dim() != 2:
            raise ValueError(
                f"TextEncoder: input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}"
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        handle = None
        if embedding_delta is not None:
            handle = self._add_to_embeddings(embedding_delta)
        kwargs: dict[str, Any] = {"attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        try:
            out = self.model(input_ids=input_ids, output_hidden_states=True, return_dict=True, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
        states = tuple(out.hidden_states)
        embeddings, layers = states[0], states[1:]
        if self.pooling == "pooler":
            pooled = out.pooler_output
        elif self.pooling == "cls":
            pooled = layers[-1][:, 0]
        else:
            m = attention_mask.to(layers[-1].dtype).unsqueeze(-1)
            pooled = (layers[-1] * m).sum(1) / m.sum(1).clamp(min=1.0)
        return TextEncoderOutput(layers, embeddings, pooled, attention_mask)

    def _add_to_embeddings(self, delta: Tensor) -> Any:
        embeddings = getattr(self.model, "embeddings", None)
        if not isinstance(embeddings, nn.Module):
            raise TypeError(
                f"TextEncoder: {type(self.model).__name__} has no `embeddings` module to perturb"
            )

        def hook(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            if output.shape != delta.shape:
                raise ValueError(
                    f"embedding_delta has shape {tuple(delta.shape)}, the embedding-layer output "
                    f"{tuple(output.shape)}"
                )
            return output + delta

        return embeddings.register_forward_hook(hook)

    def forward(
        self,
        input_ids: Tensor | Mapping[str, Tensor],
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Pooled features (B, H). ``input_ids`` may be a batch dict with the same keys."""
        if isinstance(input_ids, Mapping):
            batch = input_ids
            input_ids = batch["input_ids"]
            attention_mask = batch.get("attention_mask", attention_mask)
            token_type_ids = batch.get("token_type_ids", token_type_ids)
        return self.encode(input_ids, attention_mask, token_type_ids).pooled

    def forward_stages(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
        """Per-layer outputs, a list of L tensors (B, T, H) (for :func:`stage_features`)."""
        return list(self.encode(input_ids, attention_mask).hidden_states)


def _bert_config(
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    intermediate_size: int | None,
    vocab_size: int,
    max_position_embeddings: int,
    type_vocab_size: int,
    dropout: float,
    attention_dropout: float,
) -> Any:
    for name, value in (("num_layers", num_layers), ("hidden_size", hidden_size),
                        ("num_heads", num_heads), ("vocab_size", vocab_size),
                        ("max_position_embeddings", max_position_embeddings)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"bert encoder: {name} must be a positive int, got {value!r}")
    if hidden_size % num_heads:
        raise ValueError(
            f"bert encoder: hidden_size {hidden_size} is not a multiple of num_heads {num_heads}"
        )
    transformers = require("transformers", "text encoders")
    return transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=4 * hidden_size if intermediate_size is None else intermediate_size,
        max_position_embeddings=max_position_embeddings,
        type_vocab_size=type_vocab_size,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=attention_dropout,
    )


def build_text_encoder(
    *,
    num_layers: int = 2,
    hidden_size: int = 32,
    num_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int = 30522,
    max_position_embeddings: int = 512,
    type_vocab_size: int = 2,
    dropout: float = 0.1,
    attention_dropout: float = 0.1,
    config: str | Path | None = None,
    pooling: str = "auto",
) -> TextEncoder:
    """A BERT with random weights, from sizes or from a local folder's ``config.json``.

    Args:
        num_layers, hidden_size, num_heads, intermediate_size (default 4 x hidden),
            vocab_size, max_position_embeddings, type_vocab_size, dropout, attention_dropout:
            the BERT configuration (ignored when ``config`` is given). BERT-base is
            12, 768, 12, 3072; the LRC-BERT / TinyBERT student 4, 312, 12, 1200.
        config: a local checkpoint folder (or its ``config.json``): its architecture, random
            weights; any model type ``transformers`` knows, no remote code.
        pooling: one of :data:`POOLINGS`.
    """
    transformers = require("transformers", "text encoders")
    if config is not None:
        folder = _checkpoint_folder(config, what="config")
        cfg = transformers.AutoConfig.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=False
        )
        model = transformers.AutoModel.from_config(cfg, trust_remote_code=False)
    else:
        cfg = _bert_config(num_layers, hidden_size, num_heads, intermediate_size, vocab_size,
                           max_position_embeddings, type_vocab_size, dropout, attention_dropout)
        model = transformers.BertModel(cfg)
    return TextEncoder(model, pooling=pooling)


def hf_folder(model: str) -> str | None:
    """The folder of a text model named ``hf:FOLDER``, None for ``bert`` (random weights from
    sizes); any other name is refused, naming the two forms."""
    if model == "bert":
        return None
    if model.startswith("hf:") and model[3:]:
        return model[3:]
    raise ValueError(f"a text model must be 'bert' or 'hf:FOLDER' (random weights of "
                     f"--layers/--hidden/--heads, or a local checkpoint folder), got {model!r}")


def bert_options(*, layers: int, hidden: int, heads: int, vocab_size: int,
                 intermediate_size: int = 0, dropout: float = 0.1,
                 max_position_embeddings: int = 512, pooling: str = "auto") -> dict[str, Any]:
    """:func:`build_text_encoder`'s keyword arguments (``create_encoder("bert", **options)``)
    from the sizes as the recipes' flags spell them: ``intermediate_size`` 0 = 4 x hidden,
    ``dropout`` for the hidden states and the attention (BERT's one ``hidden_dropout_prob`` =
    ``attention_probs_dropout_prob``)."""
    return dict(num_layers=layers, hidden_size=hidden, num_heads=heads,
                intermediate_size=intermediate_size or None, vocab_size=vocab_size,
                dropout=dropout, attention_dropout=dropout,
                max_position_embeddings=max_position_embeddings, pooling=pooling)


def text_encoder(model: str, *, keep_layers: str | Sequence[int] = (),
                 **sizes: Any) -> TextEncoder:
    """The text encoder a recipe's model name gives: ``bert`` (random weights of ``sizes``,
    :func:`bert_options`' keyword arguments: ``layers``, ``hidden``, ``heads``, ``vocab_size``
    ...) or ``hf:FOLDER`` (the folder's weights, :func:`load_text_encoder`; ``sizes`` do not
    apply). ``keep_layers`` (``hf:`` only; 0-based, a sequence or ``"1,3,5"`` as
    ``--keep-layers`` gives it): only those layers (:func:`encoder_from_layers`)."""
    folder = hf_folder(model)
    if isinstance(keep_layers, str):
        keep_layers = [int(p) for p in keep_layers.split(",") if p.strip()]
    if folder is None:
        if keep_layers:
            raise ValueError("--keep-layers applies to an hf:FOLDER model, not to 'bert'")
        return build_text_encoder(**bert_options(**sizes))
    encoder = load_text_encoder(folder)
    return encoder_from_layers(encoder, keep_layers) if keep_layers else encoder


def check_vocabulary(student: TextEncoder, tokenizer_size: int) -> None:
    """Refuse a distillation student that cannot read every id of the teacher's tokenizer:
    teacher and student read the same token ids (LRC-BERT, TinyBERT), so the student's embedding
    table needs at least ``tokenizer_size`` rows."""
    if student.config.vocab_size < tokenizer_size:
        raise ValueError(f"the student's vocabulary ({student.config.vocab_size}) is smaller than "
                         f"the teacher's tokenizer ({tokenizer_size}): teacher and student read "
                         "the same token ids; use a student with the teacher's vocabulary")


def encoder_from_layers(encoder: TextEncoder, layers: Sequence[int]) -> TextEncoder:
    """A shallower copy of ``encoder``: its embeddings, the transformer ``layers`` listed
    (0-based, in that order) and its pooler, same widths and pooling; ``encoder`` is unchanged.

    DistilBERT's initialisation of a student from its teacher ("taking one layer out of two",
    Sanh et al. 2019, section 3; Hugging Face's ``extract_distilbert.py`` keeps layers 0, 2, 4, 7,
    9, 11 of BERT-base): e.g. layers (1, 3, 5) of a 6-layer teacher give a 3-layer student.
    Works for models whose layers are ``model.encoder.layer`` (BERT, RoBERTa, MiniLM ...).
    """
    stack = getattr(getattr(encoder.model, "encoder", None), "layer", None)
    if not isinstance(stack, nn.ModuleList):
        raise TypeError(f"encoder_from_layers: {type(encoder.model).__name__} has no "
                        "encoder.layer list (a BERT-like model is needed)")
    picked = [int(i) for i in layers]
    if not picked or not all(0 <= i < len(stack) for i in picked):
        raise ValueError(f"encoder_from_layers: layers must be 1 or more of 0..{len(stack) - 1}, "
                         f"got {list(layers)}")
    config = copy.deepcopy(encoder.config)
    config.num_hidden_layers = len(picked)
    model = type(encoder.model)(config)
    state = {k: v for k, v in encoder.model.state_dict().items()
             if not k.startswith("encoder.layer.")}
    for new, old in enumerate(picked):
        prefix = f"encoder.layer.{old}."
        state.update({f"encoder.layer.{new}.{k[len(prefix):]}": v
                      for k, v in encoder.model.state_dict().items() if k.startswith(prefix)})
    model.load_state_dict(state)  # strict: every weight of the copy comes from the encoder
    return TextEncoder(model, pooling=encoder.pooling)


def _checkpoint_folder(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if not p.is_dir():
        raise FileNotFoundError(
            f"text encoder {what}: {str(path)!r} is not a folder. Give the path of a local Hugging "
            "Face checkpoint folder (config.json + model.safetensors or pytorch_model.bin); "
            "nothing is downloaded, a Hub id such as 'bert-base-uncased' is not fetched"
        )
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"text encoder {what}: {p} has no config.json")
    return p


def load_text_encoder(path: str | Path, pooling: str = "auto") -> TextEncoder:
    """The model in a local Hugging Face checkpoint folder, with its weights, offline and safe.

    ``model.safetensors`` (or a sharded safetensors index) is used when present; otherwise
    ``pytorch_model.bin`` is read with ``torch.load(weights_only=True)``. A task checkpoint
    (``BertForSequenceClassification``) loads as its base model; the task head is dropped.

    Raises:
        FileNotFoundError: not a folder, no config.json, or no weights file.
        UnsafeCheckpointError: a ``.bin`` that would need to run code to unpickle.
        ValueError: a model type that needs the folder's own code (``trust_remote_code``).
    """
    folder = _checkpoint_folder(path, what="folder")
    has_safetensors = any((folder / f).is_file() for f in _SAFETENSORS)
    has_pickle = any((folder / f).is_file() for f in _PICKLES)
    if not (has_safetensors or has_pickle):
        raise FileNotFoundError(
            f"text encoder folder {folder}: no weights ({' / '.join(_SAFETENSORS + _PICKLES)}); "
            f"for random weights with this architecture use create_encoder('bert', config={str(folder)!r})"
        )
    transformers = require("transformers", "text encoders")
    if not has_safetensors:
        _check_pickles(folder)  # ours, whatever the transformers version does
    try:
        config = transformers.AutoConfig.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=False
        )
    except ValueError as err:
        raise ValueError(
            f"text encoder folder {folder}: transformers cannot read its config.json (a model "
            "type that needs the folder's own code is refused: trust_remote_code=False): "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from err
    try:
        model, info = transformers.AutoModel.from_pretrained(
            str(folder),
            config=config,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=has_safetensors,
            weights_only=True,
            output_loading_info=True,
        )
    except Exception as err:  # the unpickling error may arrive wrapped
        if _is_unpickling_error(err):
            raise _unsafe(folder / _PICKLES[0]) from err
        raise
    missing = list(info.get("missing_keys", []))
    if missing:
        log.warning("text encoder %s: %d weights not in the checkpoint, left random: %s",
                    folder, len(missing), ", ".join(sorted(missing)[:8]))
    return TextEncoder(model, pooling=pooling)


def _unsafe(path: Path) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{path}: refused to load, the pickle needs code to run (torch.load weights_only=True "
        "rejected it); get the model as model.safetensors from a source you trust"
    )


def check_safe_weights(path: str | Path) -> None:
    """Refuse (:class:`UnsafeCheckpointError`) a checkpoint folder whose pickled weights would
    need to run code to load, before anything is built (a program's input check); a folder with
    safetensors weights passes unread."""
    folder = _checkpoint_folder(path, what="folder")
    if not any((folder / f).is_file() for f in _SAFETENSORS):
        _check_pickles(folder)


def _check_pickles(folder: Path) -> None:
    """Unpickle every ``.bin`` shard with ``weights_only=True`` (memory-mapped when possible)."""
    index = folder / _PICKLES[1]
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        files = [folder / name for name in shards]
    else:
        files = [folder / _PICKLES[0]]
    for f in files:
        if not f.is_file() or f.resolve().parent != folder.resolve():
            raise FileNotFoundError(f"text encoder folder {folder}: shard {f.name} is missing")
        try:
            torch.load(f, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(f))
        except pickle.UnpicklingError as err:
            raise _unsafe(f) from err


def _is_unpickling_error(err: BaseException | None) -> bool:
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, pickle.UnpicklingError) or "weights only load failed" in str(err).lower():
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False
