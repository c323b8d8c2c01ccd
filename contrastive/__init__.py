"""contrastive: self-supervised contrastive pretraining for PyTorch.

The top-level names are resolved lazily (PEP 562 module ``__getattr__``) so that
``import contrastive.losses`` stays torch-only: nothing here imports torchvision,
timm, accelerate or faiss until the name that needs it is used.

Public API
----------
Losses (torch only)
    ``get_loss``, ``register_loss``, ``list_losses``
Encoders
    ``create_encoder``, ``list_encoders``, ``register_encoder``
Methods
    ``get_method``, ``list_methods``, ``register_method``
Run files
    ``EncoderRecord`` (``encoder.pt``) and the run-folder layout: :mod:`contrastive.records`
Sub-packages
    ``contrastive.losses``, ``contrastive.nn``, ``contrastive.methods``,
    ``contrastive.augment``, ``contrastive.data``, ``contrastive.engine``,
    ``contrastive.eval``, ``contrastive.text`` (encoders, GLUE, generated text; the ``text``
    extra, imported only when used)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY_NAMES: dict[str, str] = {
    "get_loss": "contrastive.losses",
    "register_loss": "contrastive.losses",
    "list_losses": "contrastive.losses",
    "create_encoder": "contrastive.nn",
    "list_encoders": "contrastive.nn",
    "register_encoder": "contrastive.nn",
    "get_method": "contrastive.methods",
    "list_methods": "contrastive.methods",
    "register_method": "contrastive.methods",
    "EncoderRecord": "contrastive.records",
}

_SUBPACKAGES = {"losses", "nn", "methods", "augment", "data", "engine", "eval", "text"}

__all__ = sorted([*_LAZY_NAMES, *_SUBPACKAGES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"contrastive.{name}")
    raise AttributeError(f"module 'contrastive' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
