"""Every recipe's configuration keeps the choices of the fields its base classes declare: a
recipe changes a default with ``override`` and narrows the choices only with a reason (issue 48:
``--lr-schedule linear`` was refused by nine recipes whose hand-copied lists had drifted)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from contrastive.engine import RunConfig, parse_config
from contrastive.engine.fields import field_options

RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*.py"))


def _config_classes(rx, name: str) -> list[type]:
    mod = rx.load_recipe(name)
    return [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, RunConfig)
            and v.__module__ == mod.__name__]


def _declared(cls: type, name: str) -> dataclasses.Field:
    """The field as the first class of ``cls``'s bases that has it declares it."""
    first = next(k for k in reversed(cls.__mro__) if name in getattr(k, "__dataclass_fields__", {}))
    return first.__dataclass_fields__[name]


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_keep_the_declared_choices(rx, name):
    classes = _config_classes(rx, name)
    assert classes, f"recipes/{name}.py defines no configuration"
    for cls in classes:
        for f in dataclasses.fields(cls):
            declared = _declared(cls, f.name).metadata.get("choices")
            options = field_options(cls, f.name)
            if options.get("choices") != declared:  # narrowed: the recipe says why
                assert "(here only" in options["help"], (cls.__name__, f.name)


@pytest.mark.parametrize("name", RECIPES)
def test_linear_schedule_parses_on_every_recipe(rx, name, capsys):
    """The command line itself: no recipe answers ``--lr-schedule linear`` (the drifted choice),
    ``--optimizer lars`` or ``--lr-scaling sqrt`` with 'invalid choice'."""
    for cls in _config_classes(rx, name):
        try:
            parse_config(cls, ["--lr-schedule", "linear", "--optimizer", "lars",
                               "--lr-scaling", "sqrt"])
        except SystemExit:  # a recipe's own validation (a required --teacher ...)
            err = capsys.readouterr().err
            assert "invalid choice" not in err, (cls.__name__, err)
