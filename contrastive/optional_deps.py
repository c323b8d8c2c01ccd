"""The optional ``text`` extra: Hugging Face ``transformers`` and ``tokenizers``.

They are imported only when a text feature that needs them is used, so ``import contrastive``
and ``import contrastive.losses`` work without them. GLUE reading and the generated text task
need neither (pure Python + numpy); encoders need ``transformers``, tokenizers ``tokenizers``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL_HINT = 'pip install -e ".[text]"'


class MissingTextDependencyError(ImportError):
    """A text feature was used without the ``text`` extra installed (one-line message)."""


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` (``"transformers"`` or ``"tokenizers"``) or raise a one-line error.

    Args:
        module: top-level package name.
        feature: what the user asked for, named in the message (e.g. ``"text encoders"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingTextDependencyError(
            f"{feature} need the optional package {module!r}, which is not installed: "
            f"{INSTALL_HINT}"
        ) from err
