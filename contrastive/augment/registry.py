"""Registry of named view pipelines: ``register_pipeline``, ``get_pipeline``, ``list_pipelines``."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable

from contrastive.augment.pipeline import Pipeline

PipelineFactory = Callable[..., Pipeline]

_REGISTRY: dict[str, PipelineFactory] = {}
_ALIASES: dict[str, str] = {}


class UnknownPipelineError(KeyError):
    """Raised by :func:`get_pipeline` for a name that is not registered."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def register_pipeline(name: str, *aliases: str) -> Callable[[PipelineFactory], PipelineFactory]:
    """Decorator registering ``factory(image_size=..., **kwargs) -> Pipeline`` under ``name``.

    Example::

        @register_pipeline("mine")
        def mine(image_size: int = 224, *, strength: float = 0.5) -> Pipeline: ...
    """

    def wrap(factory: PipelineFactory) -> PipelineFactory:
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"pipeline name {key!r} is already registered")
        _REGISTRY[name] = factory
        for alias in aliases:
            _ALIASES[alias] = name
        return factory

    return wrap


def list_pipelines() -> list[str]:
    """Registered pipeline names (aliases excluded), sorted."""
    return sorted(_REGISTRY)


def get_pipeline(name: str, image_size: int = 224, **kwargs) -> Pipeline:
    """Build the pipeline registered as ``name`` for ``image_size`` pixels.

    Keyword arguments override the preset's defaults (the papers' values); an unknown keyword
    raises ``ValueError`` listing the accepted ones. Unknown names raise
    :class:`UnknownPipelineError` (a ``KeyError``) with the closest registered names.
    """
    key = name.lower().replace("-", "_") if isinstance(name, str) else name
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY) + list(_ALIASES), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownPipelineError(
            f"unknown pipeline {name!r}{hint} Registered: {', '.join(list_pipelines())}"
        )
    factory = _REGISTRY[key]
    params = inspect.signature(factory).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(kwargs) - set(params))
    if unknown and not accepts_any:
        accepted = [p for p in params if p != "image_size"]
        raise ValueError(
            f"pipeline {key!r} got unknown argument(s) {unknown}; it accepts {accepted}"
        )
    pipeline = factory(image_size=image_size, **kwargs)
    if pipeline.name is None:
        pipeline.name = key
    return pipeline
