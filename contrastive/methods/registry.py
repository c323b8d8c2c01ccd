"""The method registry: ``register_method``, ``get_method``, ``list_methods``.

Adding a method is one file::

    @register_method("mine")
    class Mine(Method):
        def forward(self, batch): ...

Names are case-insensitive and ignore ``-`` / ``_`` (``"MoCo-V3"`` is ``"mocov3"``); a taken name
raises unless ``override=True`` (the policy of every registry, :mod:`contrastive.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from contrastive.methods.base import Method
from contrastive.registry import Registry, RegistryKeyError

__all__ = ["UnknownMethodError", "get_method", "list_methods", "method_class", "register_method"]

T = TypeVar("T", bound=type[Method])


class UnknownMethodError(RegistryKeyError):
    """A method name that is not registered; the message names the closest ones."""


def _normalize(name: str) -> str:
    return name.strip().lower().replace("_", "").replace("-", "")


_REGISTRY: Registry[type[Method]] = Registry(
    "method", normalize=_normalize, error=UnknownMethodError)


def register_method(name: str, *aliases: str, override: bool = False) -> Callable[[T], T]:
    """Class decorator registering a method (a :class:`~contrastive.methods.Method`) by name."""
    register = _REGISTRY.register(name, *aliases, override=override)

    def decorator(cls: T) -> T:
        register(cls)  # returns cls itself; the decorated class keeps its own type
        return cls

    return decorator


def method_class(name: str) -> type[Method]:
    """The class registered as ``name`` (raises :class:`UnknownMethodError`)."""
    return _REGISTRY.get(name)


def list_methods() -> list[str]:
    """Names accepted by :func:`get_method`, sorted."""
    return _REGISTRY.names()


def get_method(name: str, **kwargs: Any) -> Method:
    """Build a method by name; ``preset="v2"`` etc. selects one of its ``presets``."""
    cls = method_class(name)
    preset = kwargs.pop("preset", None)
    return cls.from_preset(preset, **kwargs) if preset else cls(**kwargs)
