"""The loss registry: ``register_loss``, ``get_loss``, ``list_losses``.

A loss is registered by decorating its class (or any callable that returns an ``nn.Module``)::

    @register_loss("mine", "my_alias")
    class MyLoss(torch.nn.Module):
        def forward(self, a, b): ...

    loss = get_loss("mine", temperature=0.2)   # == MyLoss(temperature=0.2)

Names and aliases are case-insensitive. ``list_losses()`` lists the primary names (not aliases).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["UnknownLossError", "get_loss", "list_losses", "loss_class", "register_loss"]

T = TypeVar("T", bound=Callable[..., nn.Module])

# primary name -> factory (usually an nn.Module subclass)
_LOSSES: dict[str, Callable[..., nn.Module]] = {}
# alias or primary name -> primary name
_NAMES: dict[str, str] = {}


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


def _key(name: str, what: str = "name") -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"loss {what} must be a non-empty string, got {name!r}")
    return name.strip().lower()


def _same_definition(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are the same definition (e.g. a module re-imported or reloaded)."""
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", object())
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", object())
    )


def register_loss(name: str, *aliases: str) -> Callable[[T], T]:
    """Class decorator registering a loss under ``name`` (and optional ``aliases``).

    Args:
        name: the primary name shown by :func:`list_losses` (case-insensitive).
        *aliases: extra names accepted by :func:`get_loss`.

    Raises:
        ValueError: when a name or alias is already taken by a different loss, or is not a
            non-empty string.
    """
    keys = [_key(name)] + [_key(a, "alias") for a in aliases]
    if len(set(keys)) != len(keys):
        raise ValueError(f"register_loss: repeated name among {[name, *aliases]!r}")

    def decorator(factory: T) -> T:
        if not callable(factory):
            raise ValueError(
                f"register_loss({name!r}) must decorate a class or callable, got {factory!r}"
            )
        for key in keys:
            owner = _NAMES.get(key)
            if owner is not None and not _same_definition(_LOSSES[owner], factory):
                raise ValueError(
                    f"loss name {key!r} is already registered (to {_LOSSES[owner]!r} as {owner!r}); "
                    "choose another name or alias"
                )
        _LOSSES[keys[0]] = factory
        for key in keys:
            _NAMES[key] = keys[0]
        return factory

    return decorator


def loss_class(name: str) -> Callable[..., nn.Module]:
    """The registered class (factory) for ``name`` or one of its aliases, without instantiating it.

    Raises:
        UnknownLossError: (a ``KeyError``) when ``name`` is not registered.
    """
    key = _key(name)
    if key not in _NAMES:
        known = list_losses()
        suggestions = difflib.get_close_matches(key, sorted(_NAMES), n=3, cutoff=0.5)
        raise UnknownLossError(name, known, suggestions)
    return _LOSSES[_NAMES[key]]


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
    names = sorted(_LOSSES)
    if pattern is not None:
        names = [n for n in names if fnmatch.fnmatchcase(n, pattern.lower())]
    return names
