"""The README stays true: its methods table names every registered method and every recipe;
every recipe its quick-start commands name exists and accepts their flags and values (parsed
into the recipe's configuration, nothing trained; the commands were run as written, with the
times benchmarks/results/demo.md gives); and every claim of the README or the manual that a
flag exists on a group of recipes holds for each recipe of the group.

A claim is marked ``<!-- flags: GROUP -->``, the flags are the backticked ``--flags`` of the text
after it up to the next marker or blank line, and GROUP is ``every recipe``, a kind of recipe
(``image recipes``, ``text and image-text recipes``, ``text recipes``, ``image-text recipes``) or
recipe names (``recipes moco_cifar, clip``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLAIM = re.compile(r"<!-- flags: ([\w ,-]+?) -->\n(.*?)(?=\n\n|\n<!--|\Z)", re.S)


def _commands() -> list[list[str]]:
    text = README.read_text()
    marker = "<!-- train-anything"
    assert marker in text, "the README lost its train-anything section marker"
    block = re.search(r"```bash\n(.*?)```", text[text.index(marker):], re.S)
    assert block is not None
    return [shlex.split(line) for line in block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _config_class(mod):
    from contrastive.engine import RunConfig

    if hasattr(mod, "make"):  # text recipes: make() -> (config class, build_method, adapter)
        return mod.make()[0]
    own = [v for v in vars(mod).values() if isinstance(v, type) and dataclasses.is_dataclass(v)
           and issubclass(v, RunConfig) and v.__module__ == mod.__name__]
    assert len(own) == 1, f"{mod.__name__}: expected one configuration class, found {own}"
    return own[0]


def test_the_section_covers_image_text_and_image_text():
    recipes = {next(a for a in cmd if a.startswith("recipes/")) for cmd in _commands()}
    assert {"recipes/moco_cifar.py", "recipes/clip.py", "recipes/simcse.py",
            "recipes/bert_finetune.py", "recipes/lrc_bert.py"} <= recipes
    assert any(cmd[:2] == ["accelerate", "launch"] for cmd in _commands())
    assert any("--resume" in cmd for cmd in _commands())


@pytest.mark.parametrize("cmd", _commands(), ids=lambda c: " ".join(c)[:60])
def test_every_command_parses(cmd, rx):
    from contrastive.engine import parse_config

    at = next(i for i, a in enumerate(cmd) if a.startswith("recipes/"))
    assert cmd[at - 1] in ("python", "2") or cmd[0] == "accelerate", cmd
    mod = rx.load_recipe(Path(cmd[at]).stem)
    cfg = parse_config(_config_class(mod), cmd[at + 1:])
    assert cfg.output_dir.startswith("runs/any-")


def _claims() -> list[tuple[str, str, tuple[str, ...]]]:
    """(file, group, flags) for every marked claim in the README and the manual."""
    found = []
    for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for m in CLAIM.finditer(path.read_text(encoding="utf-8")):
            flags = tuple(dict.fromkeys(re.findall(r"`(--[a-z][\w-]*)", m.group(2))))
            found.append((str(path.relative_to(ROOT)), m.group(1), flags))
    return found


@functools.cache
def _help(name: str) -> tuple[str, str]:
    """(kind, --help text) of recipes/<name>.py; kind: image, image-text or text."""
    import importlib.util
    import sys

    from contrastive.engine import ImageConfig, ImageTextConfig, parse_config

    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    cls = _config_class(mod)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_config(cls, ["--help"], prog=name)
    kind = ("image" if issubclass(cls, ImageConfig) else
            "image-text" if issubclass(cls, ImageTextConfig) else "text")
    return kind, out.getvalue()


def _group(group: str) -> list[str]:
    names = sorted(p.stem for p in (ROOT / "recipes").glob("*.py"))
    if group.startswith("recipes "):
        listed = [n.strip() for n in group.removeprefix("recipes ").split(",")]
        assert set(listed) <= set(names), f"no such recipe in {listed}"
        return listed
    kinds = {"every recipe": {"image", "image-text", "text"}, "image recipes": {"image"},
             "text recipes": {"text"}, "image-text recipes": {"image-text"},
             "text and image-text recipes": {"text", "image-text"}}
    assert group in kinds, f"unknown recipe group {group!r}: use one of {sorted(kinds)}"
    return [n for n in names if _help(n)[0] in kinds[group]]


def _missing(group: str, flags: tuple[str, ...]) -> list[str]:
    """'recipe: --flag' for every flag of the claim that a recipe of the group lacks."""
    return [f"{name}: {flag}" for name in _group(group) for flag in flags
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", _help(name)[1])]


def test_the_readme_claims_flags():
    groups = {group for where, group, _ in _claims() if where == "README.md"}
    assert {"every recipe", "image recipes"} <= groups, groups


@pytest.mark.parametrize("where, group, flags", _claims(), ids=lambda v: str(v)[:40])
def test_every_flag_claim_holds_for_each_recipe_of_its_group(where, group, flags):
    assert flags, f"{where}: the claim on {group!r} names no backticked --flag"
    missing = _missing(group, flags)
    assert not missing, f"{where} claims flags that these {group} lack: {missing}"


def test_a_false_claim_is_caught():
    """The check can fail: the image recipes have --knn-every, not --eval-every."""
    assert _missing("recipes moco_cifar", ("--knn-every",)) == []
    assert _missing("recipes moco_cifar", ("--eval-every",)) == ["moco_cifar: --eval-every"]


# registered methods whose README row is named otherwise than the registry name
ROW_OF = {"distill": "cosncedistillationimages", "imageclassifier": "supervisedclassifiers",
          "textclassifier": "supervisedclassifiers"}


def _methods_table() -> list[list[str]]:
    text = README.read_text()
    section = text[text.index("## Methods"):text.index("\n## ", text.index("## Methods") + 1)]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| method |")]


def test_the_methods_table_names_every_method_and_recipe():
    """Every registered method has a row, and every file of recipes/ is named in a row."""
    from contrastive.methods import list_methods

    rows = _methods_table()
    names = {re.sub(r"\W", "", part).lower() for row in rows for part in re.split(r"[/,]", row[0])}
    missing = [m for m in list_methods()
               if not any(n.startswith(m) for n in names) and ROW_OF.get(m) not in names]
    assert not missing, f"README's methods table has no row for {missing}"
    named = {r for row in rows for r in re.findall(r"`(\w+\.py)`", row[2])}
    files = {p.name for p in (ROOT / "recipes").glob("*.py")}
    assert not files - named, f"README's methods table does not name {sorted(files - named)}"
    assert not named - files, f"README's methods table names missing recipes {sorted(named - files)}"
