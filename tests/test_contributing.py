"""CONTRIBUTING.md: every path it names exists, it covers the seven kinds of extension, the
README links to it and the manual shows it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a backticked repository path: a top-level folder of the project, then a file or folder
PATH = re.compile(r"`((?:contrastive|recipes|tests|benchmarks|tools)/[\w./<>-]+|setup\.cfg)`")


def _paths(text: str) -> list[str]:
    return [p for p in PATH.findall(text) if "<" not in p]  # <name> placeholders are new files


def test_every_file_it_names_exists() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = _paths(text)
    assert len(set(named)) >= 10, named  # the table and its notes name the files to copy
    missing = [p for p in named if not (ROOT / p).exists()]
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"


def test_it_covers_each_kind_of_extension_and_the_readme_links_it() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (an? [\w ]+?) \| (.+) \|$", text, re.M)}
    assert set(rows) == {"a method", "a data format", "a text model", "a tracker", "a loss",
                         "an evaluator", "a modality"}, rows
    for kind, row in rows.items():
        assert _paths(row), f"the {kind!r} row names no file"
    assert "(CONTRIBUTING.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_path_pattern_sees_a_missing_file() -> None:
    """The check above can fail: a made-up path is found and reported missing."""
    named = _paths("copy `contrastive/methods/no_such_method.py` or `setup.cfg`")
    assert named == ["contrastive/methods/no_such_method.py", "setup.cfg"]
    assert not (ROOT / named[0]).exists()


def test_the_manual_shows_it_as_its_contributing_page() -> None:
    """docs/hooks.py brings CONTRIBUTING.md into the site as contributing.md (read in place, no
    copy in docs/ to drift), and the site's nav lists that page."""
    import importlib.util

    import pytest

    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    pages = hooks.outside_pages()
    assert pages["contributing.md"] == ROOT / "CONTRIBUTING.md"
    assert not (ROOT / "docs" / "contributing.md").exists()
    assert "results/methods.md" in pages
    assert re.search(r"^\s+- Contributing: contributing\.md$",
                     (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
