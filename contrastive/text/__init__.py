"""Text: Hugging Face encoders, GLUE, a generated text task and WordPiece tokenizers.

Everything here is imported lazily (PEP 562), and the optional ``text`` extra
(``pip install -e ".[text]"``: ``transformers``, ``tokenizers``) is imported only by the
features that need it: encoders need ``transformers``, tokenizers need ``tokenizers``; GLUE
reading / metrics and the generated task need neither.

- Encoders (:mod:`contrastive.text.encoders`): ``create_encoder("hf:FOLDER")`` (a local
  checkpoint, offline, no remote code, safetensors or ``weights_only`` pickles) or
  ``create_encoder("bert", num_layers=..., hidden_size=..., num_heads=...)`` (random weights);
  :class:`TextEncoder` gives per-layer hidden states, the embedding-layer output and a pooled
  output.
- GLUE (:mod:`contrastive.text.glue`): :func:`load_glue` reads the official TSV files,
  :func:`glue_metrics` computes the official metrics with scikit-learn / scipy.
- Generated task (:mod:`contrastive.text.generated`): :func:`generate_sentiment` (labelled
  sentences following a rule with negation and contrast), :func:`generate_nli`
  (premise, paraphrase, neutral, contradiction), :func:`generate_sts` (pairs scored 0-5),
  :func:`text_corpus`.
- Tokenizers (:mod:`contrastive.text.tokenizer`): :func:`train_wordpiece`,
  :func:`load_tokenizer` (a saved ``tokenizer.json`` or a BERT ``vocab.txt``),
  :class:`TextTokenizer` (batch of tensors for the encoders).
- Text batches (:mod:`contrastive.text.batches`): :class:`SentenceGroups` (examples of 1-3
  sentences), :class:`GroupCollate` (``input_ids`` / ``attention_mask`` / ``token_type_ids``
  (B, S, T)), readers of SimCSE's files :func:`read_simcse_csv`, :func:`read_sentence_file`.
- SimCSE lives with the other methods (:mod:`contrastive.methods.simcse`; ``SimCSE`` here is
  that class, kept for old imports).
- STS evaluation (:mod:`contrastive.text.sts`): :func:`evaluate_sts`, :func:`sts_correlation`
  (Spearman of cosine similarities), the ``contrastive-sts-eval`` command.
- LRC-BERT (:mod:`contrastive.text.lrc_bert`): :class:`LRCBert` (COS-NCE distillation of a
  fine-tuned teacher, Fu et al. 2021); :class:`TextClassifier` (encoder + prediction layer, the
  teacher), :func:`evaluate`, :func:`save_classifier` / :func:`load_classifier`
  (:mod:`contrastive.text.finetune`); :func:`train_text` (:mod:`contrastive.text.loop`, the
  text recipes' resumable loop); :func:`load_task` (generated or GLUE task).
- Folders other tools load (:mod:`contrastive.text.hf_folders`): :func:`export_classifier`
  (a teacher / student as a Hugging Face folder), :func:`export_sentence_encoder` (a
  sentence-transformers folder), :func:`read_sentence_pooling` (such a folder's pooling); the
  ``contrastive-export --format hf|sentence-transformers`` command.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "MissingTextDependencyError": "contrastive.text._deps",
    "TextEncoder": "contrastive.text.encoders",
    "TextEncoderOutput": "contrastive.text.encoders",
    "UnsafeCheckpointError": "contrastive.text.encoders",
    "build_text_encoder": "contrastive.text.encoders",
    "load_text_encoder": "contrastive.text.encoders",
    "GLUE_TASKS": "contrastive.text.glue",
    "GlueDataset": "contrastive.text.glue",
    "GlueFormatError": "contrastive.text.glue",
    "load_glue": "contrastive.text.glue",
    "glue_metrics": "contrastive.text.glue",
    "GeneratedNLI": "contrastive.text.generated",
    "GeneratedTextDataset": "contrastive.text.generated",
    "generate_nli": "contrastive.text.generated",
    "generate_sentiment": "contrastive.text.generated",
    "generate_sts": "contrastive.text.generated",
    "text_corpus": "contrastive.text.generated",
    "GroupCollate": "contrastive.text.batches",
    "SentenceGroups": "contrastive.text.batches",
    "nli_groups": "contrastive.text.batches",
    "read_sentence_file": "contrastive.text.batches",
    "read_simcse_csv": "contrastive.text.batches",
    "SimCSE": "contrastive.methods.simcse",
    "evaluate_sts": "contrastive.text.sts",
    "sts_correlation": "contrastive.text.sts",
    "TextTokenizer": "contrastive.text.tokenizer",
    "train_wordpiece": "contrastive.text.tokenizer",
    "load_tokenizer": "contrastive.text.tokenizer",
    "LRCBert": "contrastive.text.lrc_bert",
    "TextClassifier": "contrastive.text.finetune",
    "evaluate": "contrastive.text.finetune",
    "load_classifier": "contrastive.text.finetune",
    "save_classifier": "contrastive.text.finetune",
    "TextTrainConfig": "contrastive.text.loop",
    "train_text": "contrastive.text.loop",
    "load_task": "contrastive.text.tasks",
    "SentencePooling": "contrastive.text.hf_folders",
    "export_classifier": "contrastive.text.hf_folders",
    "export_sentence_encoder": "contrastive.text.hf_folders",
    "read_sentence_pooling": "contrastive.text.hf_folders",
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
