"""The README's "Train anything" commands stay valid: every recipe they name exists and accepts
their flags and values (parsed into the recipe's configuration, nothing trained; the commands
themselves were run as written, with the times the README gives)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


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
