"""Text models as folders other libraries load: Hugging Face and sentence-transformers.

Nothing in a written folder runs code when loaded (safetensors and JSON only):

- :func:`export_classifier`: a fine-tuned teacher or a distilled student
  (:class:`~contrastive.methods.text_classifier.TextClassifier`) as a Hugging Face folder,
  ``config.json``, ``model.safetensors``, tokenizer files. ``transformers.AutoModel`` gives the
  encoder's outputs; with the head, ``AutoModelForSequenceClassification`` gives our logits. The
  head maps one to one when the classifier pools with the model's pooler: ours is
  ``linear(dropout(pooler_output))``, BERT's ``BertForSequenceClassification`` head exactly
  (Devlin et al. 2019, sec. 4.1). A classifier on ``cls`` / ``mean`` pooling has no counterpart
  there (the HF head always reads the pooler): it is refused unless ``head=False`` (encoder
  only).
- :func:`export_sentence_encoder`: an encoder and its pooling (a SimCSE model) as a
  sentence-transformers folder: the HF files plus ``modules.json``, ``sentence_bert_config.json``
  and ``1_Pooling/config.json``; ``pooler`` pooling (supervised SimCSE's MLP kept at test) is
  ``cls`` pooling followed by a ``2_Dense`` tanh layer holding the pooler's weights.
- :func:`export_folder`: the ``contrastive-export --format hf|sentence-transformers`` command.

Every export is loaded back and compared before it returns. The folder is read by
:func:`contrastive.nn.hf_folders.read_sentence_pooling` (the sentence-transformers pipeline) and
transformers' own classes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from contrastive.nn.hf_folders import (
    ST_CONFIG,
    ST_DENSE_DIR,
    ST_KEYS,
    ST_MODULES,
    ST_POOLING_DIR,
    ST_TANH,
    ST_TYPE_PREFIX,
    ST_UNSUPPORTED_KEYS,
    read_sentence_pooling,
)
from contrastive.nn.text_encoders import TextEncoder
from contrastive.optional_deps import require
from contrastive.records import CLASSIFIER_FILE, SENTENCE_CONFIG

__all__ = ["TEXT_FORMATS", "export_classifier", "export_folder", "export_sentence_encoder",
           "save_sentence_model", "write_classifier"]

log = logging.getLogger(__name__)


def _tokenizer_files(folder: Path, tokenizer: Any) -> None:
    """``tokenizer.json`` plus the configuration ``AutoTokenizer`` needs to read it as BERT's."""
    tokenizer.save(folder)
    normalizer = json.loads(tokenizer.tokenizer.to_str()).get("normalizer") or {}
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
               "cls_token": "[CLS]", "mask_token": "[MASK]"}
    config: dict[str, Any] = {"tokenizer_class": "BertTokenizerFast",
                              "model_max_length": tokenizer.max_length, **special}
    if normalizer.get("type") == "BertNormalizer":
        config.update(do_lower_case=bool(normalizer.get("lowercase", True)),
                      strip_accents=normalizer.get("strip_accents"),
                      tokenize_chinese_chars=bool(normalizer.get("handle_chinese_chars", True)))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=1),
                                                    encoding="utf-8")


def _probe(vocab_size: int, length: int = 12) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, length // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _check_close(ours: Tensor, theirs: Tensor, what: str, folder: Path) -> None:
    if not torch.allclose(ours.float(), theirs.float(), atol=1e-5, rtol=1e-4):
        diff = (ours.float() - theirs.float()).abs().max().item()
        raise RuntimeError(f"export {folder}: {what} differ from ours by {diff:.3g} when read "
                           "back; this model type does not map to the Hugging Face class")


@torch.no_grad()
def export_classifier(model: Any, folder: str | Path, tokenizer: Any = None, *,
                      head: bool = True, label_names: Sequence[str] | None = None) -> Path:
    """Write a :class:`~contrastive.methods.text_classifier.TextClassifier` as a Hugging Face folder
    (:func:`write_classifier`) and check it.

    Args:
        model: the classifier (teacher or distilled student).
        folder: created if needed; ``config.json``, ``model.safetensors`` (+ tokenizer files).
        tokenizer: a :class:`~contrastive.data.tokenizer.TextTokenizer` to save with it.
        head: also the prediction layer, as ``*ForSequenceClassification`` (needs ``pooler``
            pooling and a pooler + dropout + linear head class; refused otherwise); False: the
            encoder only.
        label_names: ``id2label`` of the config (default ``LABEL_0``...).

    The folder is read back with ``AutoModel`` (and ``AutoModelForSequenceClassification``)
    and compared with ``model`` on a probe batch (1e-5) before this returns.
    """
    out = Path(folder)
    write_classifier(model, out, tokenizer, head=head, label_names=label_names)
    _verify_classifier(model, out, head)
    log.info("exported %s to %s (%s)", type(model).__name__, out,
             "AutoModelForSequenceClassification" if head else "AutoModel, encoder only")
    return out


@torch.no_grad()
def write_classifier(model: Any, folder: Path, tokenizer: Any = None, *, head: bool | None,
                     label_names: Sequence[str] | None = None) -> bool:
    """The files of :func:`export_classifier`, unchecked; ``head=None``: with the head when it
    maps one to one (``pooler`` pooling and a linear head class), else the encoder only.
    Returns whether the head was written. Draws no random numbers (the Hugging Face model is
    built under a forked generator: a run writing its best model continues unchanged)."""
    transformers = require("transformers", "Hugging Face export")
    encoder: TextEncoder = model.encoder
    base: Any = encoder.model  # a transformers PreTrainedModel
    state = {k: v.detach().cpu() for k, v in base.state_dict().items()}
    if head and encoder.pooling != "pooler":
        raise ValueError(f"export: the classifier pools with {encoder.pooling!r} but "
                         "AutoModelForSequenceClassification reads the pooler; export the "
                         "encoder only (head=False / --encoder-only)")
    config = base.config.__class__.from_dict(base.config.to_dict())
    hf: Any = None
    with torch.random.fork_rng(devices=[]):
        if head is not False and encoder.pooling == "pooler":
            config.num_labels = model.num_labels
            config.problem_type = ("regression" if model.regression
                                   else "single_label_classification")
            config.classifier_dropout = float(getattr(model.dropout, "p", 0.0))
            if label_names is not None:
                if len(label_names) != model.num_labels:
                    raise ValueError(f"export: {len(label_names)} label names for "
                                     f"{model.num_labels} outputs")
                config.id2label = dict(enumerate(label_names))
                config.label2id = {n: i for i, n in enumerate(label_names)}
            hf = transformers.AutoModelForSequenceClassification.from_config(config)
            classifier = getattr(hf, "classifier", None)
            if isinstance(classifier, torch.nn.Linear):
                hf.base_model.load_state_dict(state, strict=True)
                classifier.load_state_dict({k: v.detach().cpu() for k, v in
                                            model.head.state_dict().items()})
            elif head:
                raise ValueError(f"export: {type(hf).__name__}'s head is not the pooler + "
                                 "linear layer ours is; export the encoder only (head=False / "
                                 "--encoder-only)")
            else:
                hf = None
        if hf is None:
            config = base.config.__class__.from_dict(base.config.to_dict())
            config.architectures = [type(base).__name__]
            hf = transformers.AutoModel.from_config(config)
            hf.load_state_dict(state, strict=True)
    hf.save_pretrained(str(folder), safe_serialization=True)
    if tokenizer is not None:
        _tokenizer_files(folder, tokenizer)
    return hf.base_model is not hf


def _load_back(cls: Any, folder: Path) -> Any:
    return cls.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                               use_safetensors=True).eval()


def _verify_classifier(model: Any, folder: Path, head: bool) -> None:
    transformers = require("transformers", "Hugging Face export")
    was_training = model.training
    model.eval()
    try:
        encoder: TextEncoder = model.encoder
        device = next(model.parameters()).device
        batch = _probe(int(encoder.config.vocab_size))
        ours = encoder.encode(**{k: v.to(device) for k, v in batch.items()})
        auto = _load_back(transformers.AutoModel, folder)
        theirs = auto(**batch, output_hidden_states=True)
        _check_close(ours.hidden_states[-1].cpu(), theirs.last_hidden_state, "hidden states",
                     folder)
        if head:
            seq = _load_back(transformers.AutoModelForSequenceClassification, folder)
            _check_close(model.predict({k: v.to(device) for k, v in batch.items()}).cpu(),
                         seq(**batch).logits, "logits", folder)
    finally:
        model.train(was_training)


@torch.no_grad()
def export_sentence_encoder(encoder: TextEncoder, folder: str | Path, tokenizer: Any, *,
                            normalize: bool = False, max_seq_length: int | None = None,
                            verify: bool = True) -> Path:
    """Write ``encoder`` with its pooling as a folder ``SentenceTransformer(folder)`` loads.

    Args:
        encoder: e.g. ``SimCSE.sentence_encoder()`` (pooling ``cls``, ``mean`` or ``pooler``).
        folder: created if needed.
        tokenizer: its :class:`~contrastive.data.tokenizer.TextTokenizer` (required: the
            ``Transformer`` module reads it with ``AutoTokenizer``).
        normalize: add a ``Normalize`` module (unit-length embeddings; cosine scores unchanged).
        max_seq_length: ``sentence_bert_config.json``'s (default: the tokenizer's max_length).

        verify: read back with :func:`read_sentence_pooling` and compared with ``encoder``
            before returning (a run's own ``model/``, :func:`save_sentence_model`, is not: its
            writer is this one, checked by the tests, and the check would run on the CPU beside
            a model training on an accelerator).
    """
    from safetensors.torch import save_file

    if encoder.pooling not in ("cls", "mean", "pooler"):
        raise ValueError(f"export: pooling {encoder.pooling!r} is not one of cls, mean, pooler")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    base: Any = encoder.model  # a transformers PreTrainedModel
    base.save_pretrained(str(out), safe_serialization=True)
    _tokenizer_files(out, tokenizer)
    hidden = int(encoder.hidden_size)
    modules: list[dict[str, Any]] = [{"idx": 0, "name": "0", "path": "",
                                      "type": ST_TYPE_PREFIX + "Transformer"},
                                     {"idx": 1, "name": "1", "path": ST_POOLING_DIR,
                                      "type": ST_TYPE_PREFIX + "Pooling"}]
    pooling = {"word_embedding_dimension": hidden, **{k: False for k in ST_KEYS.values()},
               **{k: False for k in ST_UNSUPPORTED_KEYS}, "include_prompt": True}
    pooling[ST_KEYS["mean" if encoder.pooling == "mean" else "cls"]] = True
    (out / ST_POOLING_DIR).mkdir(exist_ok=True)
    (out / ST_POOLING_DIR / "config.json").write_text(json.dumps(pooling, indent=1),
                                                      encoding="utf-8")
    if encoder.pooling == "pooler":  # BERT's pooler = dense + tanh on [CLS]
        dense = base.pooler.dense
        (out / ST_DENSE_DIR).mkdir(exist_ok=True)
        save_file({"linear.weight": dense.weight.detach().cpu().contiguous(),
                   "linear.bias": dense.bias.detach().cpu().contiguous()},
                  str(out / ST_DENSE_DIR / "model.safetensors"))
        (out / ST_DENSE_DIR / "config.json").write_text(json.dumps(
            {"in_features": hidden, "out_features": hidden, "bias": True,
             "activation_function": ST_TANH}, indent=1), encoding="utf-8")
        modules.append({"idx": 2, "name": "2", "path": ST_DENSE_DIR, "type": ST_TYPE_PREFIX + "Dense"})
    if normalize:  # no weights; the folder as sentence-transformers writes it, empty
        path = f"{len(modules)}_Normalize"
        (out / path).mkdir(exist_ok=True)
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": ST_TYPE_PREFIX + "Normalize"})
    (out / ST_MODULES).write_text(json.dumps(modules, indent=1), encoding="utf-8")
    (out / ST_CONFIG).write_text(json.dumps(
        {"max_seq_length": int(max_seq_length or tokenizer.max_length), "do_lower_case": False},
        indent=1), encoding="utf-8")
    (out / "config_sentence_transformers.json").write_text(json.dumps(
        {"__version__": {"pytorch": torch.__version__}, "prompts": {},
         "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=1),
        encoding="utf-8")
    if verify:
        _verify_sentence_folder(encoder, out)
        log.info("exported a sentence encoder (%s pooling) to %s", encoder.pooling, out)
    return out


def save_sentence_model(folder: str | Path, encoder: TextEncoder, tokenizer: Any,
                        config: Mapping[str, Any]) -> Path:
    """A text run's ``model/``: ``encoder`` as a sentence-transformers folder
    (:func:`export_sentence_encoder`: ``SentenceTransformer(folder)`` embeds as ``encoder``
    does; ``AutoModel`` and ``create_encoder("hf:FOLDER")`` read the Hugging Face files) and
    :data:`~contrastive.records.SENTENCE_CONFIG`, ``{"pooling": encoder.pooling, **config}``
    (plain values, which those libraries ignore; ``contrastive-sts-eval`` reads its pooling),
    written last and atomically so that its ``step`` marks a complete folder. Returns its
    path."""
    out = export_sentence_encoder(encoder, folder, tokenizer, verify=False)
    text = json.dumps({"pooling": encoder.pooling, **config}, indent=1)
    tmp = out / (SENTENCE_CONFIG + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out / SENTENCE_CONFIG)
    return out / SENTENCE_CONFIG


def _verify_sentence_folder(encoder: TextEncoder, folder: Path) -> None:
    from contrastive.nn.text_encoders import load_text_encoder

    pipeline = read_sentence_pooling(folder)
    assert pipeline is not None  # we just wrote modules.json
    was_training = encoder.training
    encoder.eval()
    try:
        batch = _probe(int(encoder.config.vocab_size))
        device = next(encoder.parameters()).device
        ours = encoder(**{k: v.to(device) for k, v in batch.items()}).cpu()
        if pipeline.normalize:
            ours = F.normalize(ours, dim=-1)
        loaded = load_text_encoder(folder).eval()
        theirs = pipeline.embedder(loaded)(batch["input_ids"], batch["attention_mask"],
                                           batch["token_type_ids"])
        _check_close(ours, theirs, "sentence embeddings", folder)
    finally:
        encoder.train(was_training)


# -- the contrastive-export entry -------------------------------------------------------------

TEXT_FORMATS = ("hf", "sentence-transformers")


def export_folder(source: str | Path, out: str | Path, fmt: str, *, head: bool = True,
                  pooling: str | None = None, normalize: bool = False) -> str:
    """``contrastive-export --format hf|sentence-transformers``: one of our saved text models
    as a folder other tools load; returns how to load it.

    Args:
        source: a classifier folder (``classifier.json``: recipes/bert_finetune.py's or
            recipes/lrc_bert.py's ``OUTPUT_DIR/model``) or, for ``sentence-transformers``, also
            a Hugging Face encoder folder (recipes/simcse.py's ``OUT/model``, with its
            ``simcse.json``).
        fmt: ``"hf"`` (classifier) or ``"sentence-transformers"`` (encoder + pooling).
        head: ``hf``: with the classifier head (``AutoModelForSequenceClassification``).
        pooling: ``sentence-transformers``: cls, mean or pooler (default: the source's own).
        normalize: ``sentence-transformers``: add a Normalize module.
    """
    from contrastive.data.tokenizer import TOKENIZER_FILE, load_tokenizer
    from contrastive.eval.classifier_folder import load_classifier
    from contrastive.nn.text_encoders import load_text_encoder

    if fmt not in TEXT_FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {TEXT_FORMATS}")
    src = Path(source)
    has_tokenizer = (src / TOKENIZER_FILE).is_file() or (src / "vocab.txt").is_file()
    tokenizer = load_tokenizer(src) if has_tokenizer else None
    if (src / CLASSIFIER_FILE).is_file():
        model, meta = load_classifier(src)
        if fmt == "hf":
            from contrastive.data.glue import GLUE_TASKS

            task = GLUE_TASKS.get(str(meta.get("task", "")))
            export_classifier(model, out, tokenizer, head=head,
                              label_names=task.label_names if task and head else None)
            return ("AutoModelForSequenceClassification.from_pretrained(folder) (the classifier) "
                    "or AutoModel.from_pretrained(folder)" if head
                    else "AutoModel.from_pretrained(folder)")
        encoder = model.encoder
    elif fmt == "hf":
        raise ValueError(f"{src} has no {CLASSIFIER_FILE}: --format hf exports a classifier "
                         "folder (recipes/bert_finetune.py or recipes/lrc_bert.py OUTPUT_DIR/model)")
    else:
        config = src / SENTENCE_CONFIG
        own = (json.loads(config.read_text(encoding="utf-8")).get("pooling")
               if config.is_file() else None)
        encoder = load_text_encoder(src, pooling=own or "auto")
    if pooling is not None and pooling != encoder.pooling:
        encoder = TextEncoder(encoder.model, pooling=pooling)
    if tokenizer is None:
        raise ValueError(f"{src} has no {TOKENIZER_FILE} or vocab.txt: a sentence-transformers "
                         "folder needs its tokenizer; copy it into the folder first")
    export_sentence_encoder(encoder, out, tokenizer, normalize=normalize)
    return f"SentenceTransformer(folder) ({encoder.pooling} pooling), or contrastive-sts-eval"
