"""Evaluation of pretrained encoders: linear probes, weighted kNN, checkpoint loading, export, plots.

Modules (names are resolved lazily, so ``import contrastive.eval.knn`` stays light):

- :mod:`~contrastive.eval.knn`: weighted kNN (faiss ``IndexFlatIP`` exact, or torch matmul + topk).
- :mod:`~contrastive.eval.linear`: cached-feature probe with an lr/wd sweep on a training split
  (``linear.cached``); the MoCo standard protocol and backbone-unchanged check
  (``linear.standard``); low-shot subsets (``linear.common``).
- :mod:`~contrastive.eval.features`: feature extraction (``gather_for_metrics`` under accelerate).
- :mod:`~contrastive.eval.checkpoint`: our encoder.pt / run / accelerate checkpoints, official
  MoCo / MoCo v3 checkpoints, timm / torchvision names; strict loading with clear errors.
- :mod:`~contrastive.eval.export`: weights under timm / torchvision key names.
- :mod:`~contrastive.eval.export_text`: text models as Hugging Face / sentence-transformers
  folders (``contrastive-export --format hf|sentence-transformers``, a text run's ``model/``).
- :mod:`~contrastive.eval.classifier_folder`: a fine-tuned classifier's folder, saved and loaded.
- :mod:`~contrastive.eval.glue`: GLUE scoring of a text model; :mod:`~contrastive.eval.sts`: STS.
- :mod:`~contrastive.eval.segmentation`: per-pixel linear segmentation on a frozen encoder's
  feature map (mIoU, pixel accuracy; the probe of dense methods, VICRegL's protocol).
- :mod:`~contrastive.eval.runner`: whole evaluations from a ``--data`` spec.
- :mod:`~contrastive.eval.plot`: training curves and t-SNE maps (matplotlib, scikit-learn).
- :mod:`~contrastive.eval.zeroshot`: CLIP zero-shot classification (prompt templates) and
  image-text retrieval recall@k; ``contrastive-zeroshot``.
- :mod:`~contrastive.eval.cli`: the ``contrastive-*`` command-line tools.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "WeightedKNN": "knn",
    "knn_predict": "knn",
    "knn_accuracy": "knn",
    "topk_accuracy": "knn",
    "fit_linear_cached": "linear",
    "train_linear_standard": "linear",
    "evaluate_head": "linear",
    "evaluate_standard": "linear",
    "label_fraction_indices": "linear",
    "extract_features": "features",
    "load_encoder": "checkpoint",
    "read_checkpoint": "checkpoint",
    "CheckpointMismatchError": "checkpoint",
    "export_state_dict": "export",
    "save_export": "export",
    "linear_eval": "runner",
    "knn_eval": "runner",
    "plot_curves": "plot",
    "plot_embedding": "plot",
    "zero_shot_classifier": "zeroshot",
    "zero_shot_accuracy": "zeroshot",
    "retrieval_recall": "zeroshot",
    "load_clip_run": "zeroshot",
    "linear_segmentation": "segmentation",
    "segmentation_scores": "segmentation",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"contrastive.eval.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'contrastive.eval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
