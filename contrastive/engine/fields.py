"""Declaring a configuration field: :func:`help_field` (a new field with its help and
choices), :func:`override` (a subclass's default for a declared field, keeping its choices and
help: each choice list has one home) and :func:`field_options` (what ``--help`` and the parser
use)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

__all__ = ["help_field", "override", "field_options", "as_flag"]


def help_field(default: Any, help: str, **kwargs: Any) -> Any:
    """A new field: ``dataclasses.field`` with a help text (shown by ``--help``) and options
    such as ``choices``. A subclass changes a field its base declares with :func:`override`."""
    _check_default(default)
    return field(default=default, metadata={"help": help, **kwargs})


def override(default: Any, note: str = "", *, only: tuple[Any, ...] = (), why: str = "") -> Any:
    """A subclass's default for a field that a base configuration declares, keeping the base's
    choices and help (each choice list is written once, where the field is declared).

    ``note`` says what the new default is (``--help`` shows it before the base's help). ``only``
    narrows the choices to a subset, for a recipe that cannot run the others; ``why`` (required
    with ``only``) says why, in ``--help``. A bare new
    default (``batch_size: int = 128``) also keeps the base's choices and help.

        lr_schedule: str = override("linear", "BERT's: linear decay to 0 after the warm-up")
    """
    _check_default(default)
    if bool(only) != bool(why):
        raise TypeError("override: narrowing the choices (only=...) needs why=..., the reason")
    return field(default=default, metadata={"note": note, "only": tuple(only), "why": why})


def _check_default(default: Any) -> None:
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple for sequence defaults (dataclass fields must be immutable)")


def field_options(cls: type, name: str) -> dict[str, Any]:
    """The command-line options of field ``name`` of ``cls`` (``help``, ``choices``): those of
    the class that declares it first, with each subclass's :func:`override` applied (its note
    before the declared help, its narrowed choices and their reason). A subclass that declares
    the field again with :func:`help_field` is refused: it would drop or copy the choices."""
    options: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        f = vars(klass).get("__dataclass_fields__", {}).get(name)
        if f is None or name not in vars(klass).get("__annotations__", {}):
            continue  # klass inherits the field or does not have it
        meta = dict(f.metadata)
        if not options and "note" in meta:
            raise TypeError(f"{klass.__qualname__}.{name}: override() changes a field that a "
                            "base configuration declares, and none does: use help_field")
        if not options:
            options = meta or {"help": ""}
        elif "help" in meta:
            raise TypeError(f"{klass.__qualname__}.{name} declares a field that a base "
                            f"configuration declares: write `{name}: ... = override(default, "
                            "note)`, which keeps its choices and help")
        elif meta:
            declared = options.get("declared_help", options["help"])
            options["declared_help"] = declared
            note = meta["note"].rstrip(".")
            options["help"] = f"{note}. {declared}" if note else declared
            if meta["only"]:
                base = options.get("choices")
                if base is not None and not set(meta["only"]) <= set(base):
                    raise TypeError(f"{klass.__qualname__}.{name}: only={meta['only']} is not a "
                                    f"subset of the declared choices {tuple(base)}")
                options["choices"] = meta["only"]
                options["help"] += f" (here only {' | '.join(map(str, meta['only']))}: " \
                                   f"{meta['why']})"
    return options


def as_flag(name: str) -> str:
    """The command-line flag of field ``name`` (``batch_size`` -> ``batch-size``)."""
    return name.replace("_", "-")
