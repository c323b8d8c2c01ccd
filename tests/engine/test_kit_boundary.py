"""The engine reads a configuration only through the fields of the type it is given: no
``getattr`` / ``hasattr`` on a configuration anywhere under ``contrastive/engine`` (kits
included), so imports and mypy see every field the engine uses, and whatever is
modality-specific arrives through a kit (issue 48). An AST check, with a self-test."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "contrastive" / "engine"


def _names(node: ast.AST) -> str:
    """The dotted name of ``node`` (``self._cfg``, ``cfg``), or '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _names(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def config_lookups(source: str) -> list[tuple[int, str]]:
    """``(line, call)`` for each ``getattr(X, ...)`` / ``hasattr(X, ...)`` whose ``X`` names a
    configuration (its last part is ``cfg``, ``config`` or ends in ``_cfg`` / ``_config``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args):
            name = _names(node.args[0])
            last = name.rsplit(".", 1)[-1].lower()
            if last in ("cfg", "config") or last.endswith(("_cfg", "_config")):
                found.append((node.lineno, f"{node.func.id}({name}, ...)"))
    return found


def test_the_check_finds_what_it_should_and_nothing_else():
    source = ("getattr(cfg, 'split_bn', 0)\nhasattr(self.cfg, 'channels_last')\n"
              "getattr(self._cfg, 'decode')\ngetattr(run_config, 'x')\n"
              "getattr(module, 'head', None)\ngetattr(self, name)\ngetattr(ds, 'tokenizer')\n")
    assert [line for line, _ in config_lookups(source)] == [1, 2, 3, 4]


def test_no_engine_module_looks_a_configuration_field_up_by_name():
    offences = [f"{path.relative_to(ENGINE.parent.parent)}:{line}: {call}"
                for path in sorted(ENGINE.rglob("*.py"))
                for line, call in config_lookups(path.read_text())]
    assert not offences, ("configuration fields read by name (declare the field on the kit's "
                          "configuration and read it, or hand it through the kit):\n"
                          + "\n".join(offences))
