"""A fine-tuned classifier's folder (a labelled-text run's ``model/``): written and read here.

A :class:`~contrastive.methods.text_classifier.TextClassifier` (a fine-tuned teacher, or an
LRC-BERT student as one) is saved as a folder that loads without running code:
``model.safetensors`` (all weights), ``classifier.json`` (sizes, labels, the encoder's
``transformers`` config) and ``tokenizer.json`` (plain JSON, when a tokenizer is given). The
file names are :mod:`contrastive.records`'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contrastive.methods.text_classifier import TextClassifier
from contrastive.nn.text_encoders import TextEncoder
from contrastive.records import CLASSIFIER_FILE, MODEL_FILE

__all__ = ["load_classifier", "save_classifier"]


def save_classifier(folder: str | Path, model: TextClassifier, tokenizer: Any = None,
                    **info: Any) -> Path:
    """Write ``model.safetensors``, ``classifier.json`` (+ ``tokenizer.json``) into ``folder``."""
    from safetensors.torch import save_file

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / MODEL_FILE))
    meta = {"num_labels": model.num_labels, "regression": model.regression,
            "pooling": model.encoder.pooling, "encoder_config": model.encoder.config.to_dict(),
            **info}
    (path / CLASSIFIER_FILE).write_text(json.dumps(meta, indent=1))
    if tokenizer is not None:
        tokenizer.save(path)
    return path


def load_classifier(folder: str | Path) -> tuple[TextClassifier, dict[str, Any]]:
    """A classifier saved by :func:`save_classifier` (safetensors + JSON: no code runs)."""
    from safetensors.torch import load_file

    from contrastive.optional_deps import require

    path = Path(folder)
    if not (path / CLASSIFIER_FILE).is_file() or not (path / MODEL_FILE).is_file():
        raise FileNotFoundError(f"load_classifier: {path} lacks {CLASSIFIER_FILE} or "
                                f"{MODEL_FILE}; make a teacher with recipes/bert_finetune.py")
    meta = json.loads((path / CLASSIFIER_FILE).read_text(encoding="utf-8"))
    transformers = require("transformers", "text encoders")
    cfg = dict(meta["encoder_config"])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type", "bert"), **cfg)
    encoder = TextEncoder(transformers.AutoModel.from_config(config), pooling=meta["pooling"])
    model = TextClassifier(encoder, meta["num_labels"], regression=meta["regression"])
    model.load_state_dict(load_file(str(path / MODEL_FILE)))
    return model, meta
