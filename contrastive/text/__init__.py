"""Text in one import: the text API of the layers that own it, loaded lazily (PEP 562).

Nothing is defined here; each name lives in the layer it belongs to and is re-exported so that
``from contrastive.text import X`` keeps working:

- encoders (:mod:`contrastive.nn.text_encoders`, the ``hf:`` and ``bert`` names of
  ``create_encoder``) and sentence-transformers pipelines (:mod:`contrastive.nn.hf_folders`);
- tokenizers (:mod:`contrastive.data.tokenizer`), sentence batches
  (:mod:`contrastive.data.text_batches`), GLUE files and metrics (:mod:`contrastive.data.glue`),
  the generated text tasks (:mod:`contrastive.data.generated_text`) and task loading
  (:mod:`contrastive.data.text_tasks`);
- methods: :class:`~contrastive.methods.simcse.SimCSE`,
  :class:`~contrastive.methods.text_classifier.TextClassifier` (teacher fine-tuning and the
  cross-entropy student), :class:`~contrastive.methods.lrc_bert.LRCBert`;
- evaluation: STS (:mod:`contrastive.eval.sts`, the ``contrastive-sts-eval`` command), GLUE
  scoring (:mod:`contrastive.eval.glue`) and export to Hugging Face / sentence-transformers
  folders (:mod:`contrastive.eval.export_text`).

It sits above :mod:`contrastive.eval` (the highest layer it re-exports) and below the engine:
nothing under ``engine`` or lower imports it (CONTRIBUTING.md, "Layers").

The optional ``text`` extra (``pip install -e ".[text]"``: ``transformers``, ``tokenizers``) is
imported only by the features that need it (:mod:`contrastive.optional_deps`): GLUE reading /
metrics and the generated tasks need neither.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "MissingTextDependencyError": "contrastive.optional_deps",
    "TextEncoder": "contrastive.nn.text_encoders",
    "TextEncoderOutput": "contrastive.nn.text_encoders",
    "UnsafeCheckpointError": "contrastive.nn.text_encoders",
    "build_text_encoder": "contrastive.nn.text_encoders",
    "load_text_encoder": "contrastive.nn.text_encoders",
    "GLUE_TASKS": "contrastive.data.glue",
    "GlueDataset": "contrastive.data.glue",
    "GlueFormatError": "contrastive.data.glue",
    "load_glue": "contrastive.data.glue",
    "glue_metrics": "contrastive.data.glue",
    "GeneratedNLI": "contrastive.data.generated_text",
    "GeneratedTextDataset": "contrastive.data.generated_text",
    "generate_nli": "contrastive.data.generated_text",
    "generate_sentiment": "contrastive.data.generated_text",
    "generate_sts": "contrastive.data.generated_text",
    "text_corpus": "contrastive.data.generated_text",
    "GroupCollate": "contrastive.data.text_batches",
    "SentenceGroups": "contrastive.data.text_batches",
    "nli_groups": "contrastive.data.text_batches",
    "read_sentence_file": "contrastive.data.text_batches",
    "read_simcse_csv": "contrastive.data.text_batches",
    "SimCSE": "contrastive.methods.simcse",
    "evaluate_sts": "contrastive.eval.sts",
    "sts_correlation": "contrastive.eval.sts",
    "TextTokenizer": "contrastive.data.tokenizer",
    "train_wordpiece": "contrastive.data.tokenizer",
    "load_tokenizer": "contrastive.data.tokenizer",
    "LRCBert": "contrastive.methods.lrc_bert",
    "TextClassifier": "contrastive.methods.text_classifier",
    "evaluate": "contrastive.eval.glue",
    "load_classifier": "contrastive.eval.classifier_folder",
    "save_classifier": "contrastive.eval.classifier_folder",
    "load_task": "contrastive.data.text_tasks",
    "SentencePooling": "contrastive.nn.hf_folders",
    "export_classifier": "contrastive.eval.export_text",
    "export_sentence_encoder": "contrastive.eval.export_text",
    "read_sentence_pooling": "contrastive.nn.hf_folders",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'contrastive.text' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
