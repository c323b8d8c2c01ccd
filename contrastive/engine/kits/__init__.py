"""The kits: one per modality, each the whole front door of its kind of run in one module.

A kit holds its configuration (a :class:`~contrastive.engine.config.RunConfig` subclass with
the modality's fields), its data adapter (data set, collate, the batch on the device), its
evaluators, its artefact writers and its part of the hand-off to the method
(:class:`~contrastive.engine.kits.base.HandOff`); the engine sees a kit only through
:class:`~contrastive.engine.kits.base.DataAdapter` and reads no modality's field by name.

- :mod:`~contrastive.engine.kits.image`: augmented views of images (``ImageConfig``,
  ``ImageAdapter``, kNN monitor, ``encoder.pt``; the online probe in
  :mod:`~contrastive.engine.kits.image_probe`);
- :mod:`~contrastive.engine.kits.image_text`: image-caption pairs (``DualEncoderConfig``,
  ``ImageTextAdapter``, zero-shot and retrieval, ``clip.pt``);
- :mod:`~contrastive.engine.kits.sentences`: examples of 1-3 sentences (``TextConfig``,
  ``TextAdapter``, STS Spearman, a sentence-transformers ``model/``);
- :mod:`~contrastive.engine.kits.labelled_text`: labelled sentences and pairs
  (``LabelledTextConfig``, ``LabelledTextAdapter``, the GLUE dev metric, a classifier
  ``model/``);
- :mod:`~contrastive.engine.kits.labelled_image`: labelled images, fine-tuning a backbone with
  a classification head (``LabelledImageConfig``, ``LabelledImageAdapter``, ``val_top1``, a
  classifier folder; ``contrastive-finetune``);
- :mod:`~contrastive.engine.kits.text`: what the two text kits share (``TextRunConfig``,
  ``BertSizes``, ``BertOptimiser``, ``TokenAdapter``).

How to add one: CONTRIBUTING.md, "Add a modality".
"""

from contrastive.engine.kits.base import BATCH_KEYS, Artefacts, DataAdapter, HandOff, StepHook
from contrastive.engine.kits.image import CifarConfig, DIMConfig, ImageAdapter, ImageConfig
from contrastive.engine.kits.image_text import (
    DualEncoderConfig,
    ImageTextAdapter,
    ImageTextConfig,
    dual_encoder_kwargs,
)
from contrastive.engine.kits.labelled_image import LabelledImageAdapter, LabelledImageConfig
from contrastive.engine.kits.labelled_text import LabelledTextAdapter, LabelledTextConfig
from contrastive.engine.kits.sentences import TextAdapter, TextConfig
from contrastive.engine.kits.text import BertOptimiser, BertSizes, TextRunConfig

__all__ = ["BATCH_KEYS", "Artefacts", "DataAdapter", "HandOff", "StepHook", "ImageConfig",
           "CifarConfig", "DIMConfig", "ImageAdapter", "ImageTextConfig", "DualEncoderConfig",
           "ImageTextAdapter", "dual_encoder_kwargs", "TextRunConfig", "BertSizes",
           "BertOptimiser", "TextConfig", "TextAdapter", "LabelledTextConfig",
           "LabelledTextAdapter", "LabelledImageConfig", "LabelledImageAdapter"]
