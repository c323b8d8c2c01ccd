"""benchmarks/RESULTS.md is the assembly of benchmarks/results/*.md (no hand edits lost), and the
headline tables (RESULTS.md's header, README.md's results, docs/results.md) are generated from the
``<!-- headline: ... -->`` lines the area files record."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _assembler():
    spec = importlib.util.spec_from_file_location("assemble_results",
                                                  ROOT / "benchmarks" / "assemble_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_assembled_from_the_area_files():
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == _assembler().assemble(), (
        "benchmarks/RESULTS.md is out of date: edit benchmarks/results/<area>.md (its headline "
        "line, or the header above the first '## '), then run python benchmarks/assemble_results.py")


def test_headline_tables_match_the_area_files():
    """README.md and docs/results.md, where they have the results markers, hold the generated
    tables (a file without the markers is the generator's to skip, not a failure here)."""
    for path, expected in _assembler().outputs(ROOT).items():
        if expected is not None:
            assert path.read_text() == expected, (
                f"{path.relative_to(ROOT)}'s headline table differs from the area files' "
                "headline lines: run python benchmarks/assemble_results.py")


def test_every_area_records_a_headline():
    rows = _assembler().headlines()
    assert {row.area for row in rows} == set(_assembler().ORDER)
    assert any(row.front for row in rows), "no headline is marked for the front page"


def test_a_stale_table_is_found(tmp_path):
    """The check can fail: a README whose block disagrees with the area files is out of date."""
    a = _assembler()
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for name in a.ORDER:
        front = " | front: short" if name == "nn" else ""
        (results / f"{name}.md").write_text(
            f"# {name}\n\n<!-- headline: {name} row (details) | figures{front} -->\n\nbody\n")
    (tmp_path / "benchmarks" / "RESULTS.md").write_text(
        f"# Results\n\n{a.BEGIN}\n{a.END}\n\n## old\n")
    (tmp_path / "README.md").write_text(f"intro\n{a.BEGIN}\n| stale |\n{a.END}\nend\n")
    out = a.outputs(tmp_path)
    readme = out[tmp_path / "README.md"]
    assert readme != (tmp_path / "README.md").read_text()
    assert readme == (f"intro\n{a.BEGIN}\n| area | headline (details in the area's page) |\n|---|---|\n"
                      f"| [nn row](benchmarks/results/nn.md) | short |\n{a.END}\nend\n")
    assert out[tmp_path / "docs" / "results.md"] is None  # no such file: skipped
    assert "| nn row (details) | figures |" in out[tmp_path / "benchmarks" / "RESULTS.md"]


def test_a_malformed_or_missing_headline_is_refused():
    a = _assembler()
    with pytest.raises(ValueError, match="no '<!-- headline"):
        a.parse_headlines("x", "# x\n\nno headline here\n")
    with pytest.raises(ValueError, match="line 3"):
        a.parse_headlines("x", "# x\n\n<!-- headline: label without figures -->\n")


def test_demote_adds_one_level_outside_code_blocks():
    text = "# Area\n## Sub\n```\n# a comment in code\n```\nplain # text"
    assert _assembler().demote(text) == "## Area\n### Sub\n```\n# a comment in code\n```\nplain # text"
