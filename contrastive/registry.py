"""One small name -> object registry shared by the five registries of the package.

Losses (:mod:`contrastive.losses`), encoders (:mod:`contrastive.nn`), augmentation pipelines
(:mod:`contrastive.augment`), data sets (:mod:`contrastive.data`) and methods
(:mod:`contrastive.methods`) each keep one :class:`Registry`, so they share one policy:

- a name (or alias) that is already taken raises ``ValueError`` unless ``override=True``
  (which replaces the entry; e.g. after ``importlib.reload`` of the module that registered it);
- names are normalised by the registry's ``normalize`` function (e.g. lower case) both when
  registering and when looking up;
- an unknown name raises the registry's ``KeyError`` subclass, naming the closest known names
  ("did you mean ...?") and listing the registered ones.

Torch-free on purpose: ``import contrastive.losses`` stays light.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry", "RegistryKeyError"]

T = TypeVar("T")


class RegistryKeyError(KeyError):
    """An unknown name; ``str()`` is the plain message (``KeyError`` would show its repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _identity(name: str) -> str:
    return name


class Registry(Generic[T]):
    """Primary names -> objects, plus aliases -> primary names.

    Args:
        kind: what is registered ("loss", "encoder", ...), used in messages.
        normalize: maps a user-given name to its key (default: unchanged).
        error: the ``KeyError`` subclass raised for unknown names.
    """

    def __init__(self, kind: str, *, normalize: Callable[[str], str] = _identity,
                 error: type[KeyError] = RegistryKeyError) -> None:
        self.kind = kind
        self.normalize = normalize
        self.error = error
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}  # alias -> primary name

    # -- registration ------------------------------------------------------------------------
    def add(self, name: str, obj: T, *aliases: str, override: bool = False) -> T:
        """Register ``obj`` as ``name`` (and ``aliases``); a taken name raises ``ValueError``
        unless ``override``. Nothing is changed when it raises."""
        keys = self._keys(name, aliases)
        if not override:
            for given, key in zip((name, *aliases), keys):
                if key in self:
                    owner = self._aliases.get(key, key)
                    shown = repr(given) if given.strip() == key else f"{given!r} ({key!r})"
                    raise ValueError(
                        f"{self.kind} name {shown} is already registered (to "
                        f"{self._entries[owner]!r} as {owner!r}); choose another name, or pass "
                        "override=True to replace it")
        for key in keys:  # an overridden alias or name stops pointing elsewhere
            self._aliases.pop(key, None)
        self._entries[keys[0]] = obj
        for alias in keys[1:]:
            self._entries.pop(alias, None)
            self._aliases[alias] = keys[0]
        return obj

    def register(self, name: str, *aliases: str,
                 override: bool = False) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""
        self._keys(name, aliases)  # a bad name fails at the decorator line

        def decorator(obj: T) -> T:
            return self.add(name, obj, *aliases, override=override)

        return decorator

    def remove(self, name: str) -> None:
        """Drop ``name`` and its aliases (tests, plug-ins that unload)."""
        key = self.resolve(name)
        self._entries.pop(key)
        for alias in [a for a, p in self._aliases.items() if p == key]:
            del self._aliases[alias]

    def pop(self, name: str, default: T | None = None) -> T | None:
        """Remove ``name`` (and its aliases) and return its object; ``default`` if unknown."""
        if name not in self:
            return default
        obj = self.get(name)
        self.remove(name)
        return obj

    # -- look-up -----------------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """The primary name of ``name`` (or alias); unknown names raise ``self.error``."""
        key = self.normalize(name) if isinstance(name, str) else name
        if key in self._entries:
            return key
        if key in self._aliases:
            return self._aliases[key]
        raise self.error(self.unknown_message(name))

    def get(self, name: str) -> T:
        return self._entries[self.resolve(name)]

    def suggestions(self, name: str, n: int = 3, cutoff: float = 0.6) -> list[str]:
        key = self.normalize(name) if isinstance(name, str) else str(name)
        return difflib.get_close_matches(key, [*self._entries, *self._aliases], n=n,
                                         cutoff=cutoff)

    def unknown_message(self, name: str) -> str:
        close = self.suggestions(name)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Registered: {', '.join(self.names())}"

    def names(self) -> list[str]:
        """Sorted primary names (aliases excluded)."""
        return sorted(self._entries)

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._entries.items())

    def copy(self) -> Registry[T]:
        """A shallow copy (tests swap it in to register without leaking)."""
        new: Registry[T] = Registry(self.kind, normalize=self.normalize, error=self.error)
        new._entries, new._aliases = dict(self._entries), dict(self._aliases)
        return new

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        key = self.normalize(name)
        return key in self._entries or key in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def _keys(self, name: str, aliases: tuple[str, ...]) -> list[str]:
        keys = [self._key(name)] + [self._key(a, "alias") for a in aliases]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.kind} registration: repeated name among {[name, *aliases]!r}")
        return keys

    def _key(self, name: str, what: str = "name") -> str:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{self.kind} {what} must be a non-empty string, got {name!r}")
        return self.normalize(name.strip())
