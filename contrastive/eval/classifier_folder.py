"""A fine-tuned classifier's folder (a labelled-text run's ``model/``): written and read here.

A :class:`~contrastive.methods.text_classifier.TextClassifier` (a fine-tuned teacher, or an
LRC-BERT student as one) is saved as a Hugging Face folder that loads without running code
(:func:`~contrastive.eval.export_text.write_classifier`: ``config.json``,
``model.safetensors``, tokenizer files), so that the libraries its users run open it directly:

- ``pooler`` pooling (ours is ``linear(dropout(pooler_output))``, BERT's
  ``BertForSequenceClassification`` head exactly): the whole classifier,
  ``transformers.AutoModelForSequenceClassification.from_pretrained(folder)`` gives our logits;
- ``cls`` / ``mean`` pooling, or a model type whose head is not one linear layer on the pooler
  (RoBERTa's, ELECTRA's): the encoder only, ``AutoModel.from_pretrained(folder)``, with our
  prediction layer beside it in ``classifier_head.safetensors``.

Beside them ``classifier.json`` holds this package's own metadata (``layout``, sizes, pooling,
task, step, dev metrics: plain JSON, which those libraries ignore), written last. Folders
written before this layout (``classifier.json`` with the encoder's config and a
``model.safetensors`` of the classifier's own keys) still load. The file names are
:mod:`contrastive.records`'.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from contrastive.eval.export_text import write_classifier
from contrastive.methods.text_classifier import TextClassifier
from contrastive.nn.text_encoders import TextEncoder
from contrastive.optional_deps import require
from contrastive.records import CLASSIFIER_FILE, CLASSIFIER_HEAD_FILE, MODEL_FILE

__all__ = ["LAYOUTS", "load_classifier", "save_classifier"]

LAYOUTS = ("sequence_classification", "encoder")
"""``classifier.json``'s ``layout``: the Hugging Face class that opens the folder
(``AutoModelForSequenceClassification``, or ``AutoModel`` with our head beside it)."""


def save_classifier(folder: str | Path, model: TextClassifier, tokenizer: Any = None, *,
                    label_names: Sequence[str] | None = None, **info: Any) -> Path:
    """Write ``model`` into ``folder`` (see the module docstring) with ``info`` (plain values)
    in ``classifier.json``; ``label_names``: the config's ``id2label``. Draws no random
    numbers. Returns the folder."""
    from safetensors.torch import save_file

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    head = write_classifier(model, path, tokenizer, head=None, label_names=label_names)
    if head:
        (path / CLASSIFIER_HEAD_FILE).unlink(missing_ok=True)  # of an earlier encoder-only save
    else:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()},
                  str(path / CLASSIFIER_HEAD_FILE))
    meta = {"layout": LAYOUTS[0] if head else LAYOUTS[1], "num_labels": model.num_labels,
            "regression": model.regression, "pooling": model.encoder.pooling, **info}
    tmp = path / (CLASSIFIER_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
    os.replace(tmp, path / CLASSIFIER_FILE)
    return path


def load_classifier(folder: str | Path) -> tuple[TextClassifier, dict[str, Any]]:
    """A classifier saved by :func:`save_classifier`, or in the layout before it (safetensors
    + JSON: no code runs); returns it with ``classifier.json``'s metadata.

    The model is built as the training recipes build theirs (the encoder from its config, then
    the prediction layer) and the weights loaded strictly, so that loading draws the random
    numbers it always drew (a distillation run seeded before it loads its teacher is unchanged).
    """
    from safetensors.torch import load_file

    path = Path(folder)
    if not (path / CLASSIFIER_FILE).is_file() or not (path / MODEL_FILE).is_file():
        raise FileNotFoundError(f"load_classifier: {path} lacks {CLASSIFIER_FILE} or "
                                f"{MODEL_FILE}; make a teacher with recipes/bert_finetune.py")
    meta = json.loads((path / CLASSIFIER_FILE).read_text(encoding="utf-8"))
    transformers = require("transformers", "text encoders")
    layout = meta.get("layout")
    if layout is None:  # the first layout: the encoder's config in classifier.json
        cfg = dict(meta["encoder_config"])
        config = transformers.AutoConfig.for_model(cfg.pop("model_type", "bert"), **cfg)
    elif layout in LAYOUTS:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True,
                                                         trust_remote_code=False)
    else:
        raise ValueError(f"load_classifier: {path / CLASSIFIER_FILE} has layout {layout!r}, not "
                         f"one of {LAYOUTS}: upgrade contrastive to read it")
    base = transformers.AutoModel.from_config(config)
    model = TextClassifier(TextEncoder(base, pooling=meta["pooling"]), meta["num_labels"],
                           regression=meta["regression"])
    state = load_file(str(path / MODEL_FILE))
    if layout is not None:
        state = _own_keys(state, str(base.base_model_prefix))
        if layout == LAYOUTS[1]:
            head = load_file(str(path / CLASSIFIER_HEAD_FILE))
            state.update({f"head.{k}": v for k, v in head.items()})
    model.load_state_dict(state)
    return model, meta


def _own_keys(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """A Hugging Face folder's keys as :class:`TextClassifier`'s: ``<prefix>.x`` (or ``x``, an
    encoder saved alone) -> ``encoder.model.x``; ``classifier.x`` -> ``head.x``."""
    out = {}
    for key, value in state.items():
        if key.startswith("classifier."):
            out["head." + key[len("classifier."):]] = value
        else:
            out["encoder.model." + key.removeprefix(prefix + ".")] = value
    return out
