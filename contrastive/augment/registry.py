"""Registry of named view pipelines: ``register_pipeline``, ``get_pipeline``, ``list_pipelines``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from contrastive.augment.pipeline import Pipeline
from contrastive.registry import Registry, RegistryKeyError

PipelineFactory = Callable[..., Pipeline]



class UnknownPipelineError(RegistryKeyError):
    """Raised by :func:`get_pipeline` for a name that is not registered."""


# the policy shared by the package's registries is in contrastive.registry
_REGISTRY: Registry[PipelineFactory] = Registry(
    "pipeline", normalize=lambda s: s.lower().replace("-", "_"), error=UnknownPipelineError)


def register_pipeline(name: str, *aliases: str,
                      override: bool = False) -> Callable[[PipelineFactory], PipelineFactory]:
    """Decorator registering ``factory(image_size=..., **kwargs) -> Pipeline`` under ``name``.
    A taken name or alias raises ``ValueError`` unless ``override=True``.

    Example::

        @register_pipeline("mine")
        def mine(image_size: int = 224, *, strength: float = 0.5) -> Pipeline: ...
    """

    return _REGISTRY.register(name, *aliases, override=override)


def list_pipelines() -> list[str]:
    """Registered pipeline names (aliases excluded), sorted."""
    return _REGISTRY.names()


def get_pipeline(name: str, image_size: int = 224, **kwargs) -> Pipeline:
    """Build the pipeline registered as ``name`` for ``image_size`` pixels.

    Keyword arguments override the preset's defaults (the papers' values); an unknown keyword
    raises ``ValueError`` listing the accepted ones. Unknown names raise
    :class:`UnknownPipelineError` (a ``KeyError``) with the closest registered names.
    """
    if name not in _REGISTRY:
        close = _REGISTRY.suggestions(str(name))
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownPipelineError(
            f"unknown pipeline {name!r}{hint} Registered: {', '.join(list_pipelines())}"
        )
    key = _REGISTRY.resolve(name)
    factory = _REGISTRY.get(key)
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
