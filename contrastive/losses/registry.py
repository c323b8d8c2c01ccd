"""The loss registry: ``register_loss``, ``get_loss``, ``list_losses``.

A loss is registered by decorating its class (or any callable that returns an ``nn.Module``)::

    @register_loss("mine", "my_alias")
    class MyLoss(torch.nn.Module):
        def forward(self, a, b): ...

    loss = get_loss("mine", temperature=0.2)   # == MyLoss(temperature=0.2)

Names and aliases are case-insensitive; a taken name raises unless ``override=True`` (the
policy of every registry in the package, :mod:`contrastive.registry`). ``list_losses()`` lists the primary names (not aliases).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from contrastive.registry import Registry

__all__ = ["UnknownLossError", "get_loss", "list_losses", "loss_class", "register_loss"]

T = TypeVar("T", bound=Callable[..., nn.Module])


class UnknownLossError(KeyError):
    """Raised by :func:`get_loss` for a name that is not registered.

    A ``KeyError`` subclass (so ``except KeyError`` works) whose message lists the known names and
    the closest match. ``str()`` gives the plain message (``KeyError`` would show its repr).
    """

    def __init__(self, name: str, known: list[str], suggestions: list[str]) -> None:
        self.name = name
        self.known = known
        self.suggestions = suggestions
        hint = f"did you mean {suggestions[0]!r}? " if suggestions else ""
        self.message = (
            f"unknown loss {name!r}: {hint}known losses: {', '.join(known)} "
            "(register your own with @contrastive.losses.register_loss('name'))"
        )
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


# primary name (lower case) -> factory (usually an nn.Module subclass), plus aliases; the policy
# shared by the package's registries is in contrastive.registry
_REGISTRY: Registry[Callable[..., nn.Module]] = Registry(
    "loss", normalize=lambda s: s.strip().lower())


def register_loss(name: str, *aliases: str, override: bool = False) -> Callable[[T], T]:
    """Class decorator registering a loss under ``name`` (and optional ``aliases``).

    Args:
        name: the primary name shown by :func:`list_losses` (case-insensitive).
        *aliases: extra names accepted by :func:`get_loss`.
        override: replace a loss already registered under one of the names.

    Raises:
        ValueError: when a name or alias is already taken (and not ``override``), or is not a
            non-empty string.
    """
    register = _REGISTRY.register(name, *aliases, override=override)

    def decorator(factory: T) -> T:
        if not callable(factory):
            raise ValueError(
                f"register_loss({name!r}) must decorate a class or callable, got {factory!r}"
            )
        register(factory)  # returns factory itself; the decorated object keeps its own type
        return factory

    return decorator


def loss_class(name: str) -> Callable[..., nn.Module]:
    """The registered class (factory) for ``name`` or one of its aliases, without instantiating it.

    Raises:
        UnknownLossError: (a ``KeyError``) when ``name`` is not registered.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"loss name must be a non-empty string, got {name!r}")
    if name not in _REGISTRY:
        suggestions = _REGISTRY.suggestions(name, cutoff=0.5)
        raise UnknownLossError(name, list_losses(), suggestions)
    return _REGISTRY.get(name)


def get_loss(name: str, **kwargs: Any) -> nn.Module:
    """Build the loss registered as ``name`` with keyword arguments ``kwargs``.

    Example: ``get_loss("infonce", temperature=0.2)`` returns ``InfoNCELoss(temperature=0.2)``.

    Raises:
        UnknownLossError: (a ``KeyError``) listing the known names and the closest match.
        ValueError: from the loss itself for bad arguments (e.g. ``temperature <= 0``).
    """
    return loss_class(name)(**kwargs)


def list_losses(pattern: str | None = None) -> list[str]:
    """Sorted primary names of the registered losses, optionally filtered by a shell-style
    ``pattern`` (``list_losses("*nce")``)."""
    names = _REGISTRY.names()
    if pattern is not None:
        names = [n for n in names if fnmatch.fnmatchcase(n, pattern.lower())]
    return names
