"""The README stays true: its methods table names every registered method and every recipe;
every recipe its quick-start commands name exists and accepts their flags and values (parsed
into the recipe's configuration, nothing trained; the commands were run as written, with the
times benchmarks/results/demo.md gives). Claims that a flag exists on a group of recipes, in the
README and the manual: tests/recipes/test_doc_claims.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _commands() -> list[list[str]]:
    text = README.read_text()
    marker = "<!-- train-anything"
    assert marker in text, "the README lost its train-anything section marker"
    block = re.search(r"```bash\n(.*?)```", text[text.index(marker):], re.S)
    assert block is not None
    return [shlex.split(line) for line in block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


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
    cfg = parse_config(rx.config_class(mod), cmd[at + 1:])
    assert cfg.output_dir.startswith("runs/any-")


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
