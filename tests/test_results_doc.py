"""benchmarks/RESULTS.md is the assembly of benchmarks/results/*.md (no hand edits lost)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _assembler():
    spec = importlib.util.spec_from_file_location("assemble_results",
                                                  ROOT / "benchmarks" / "assemble_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_assembled_from_the_area_files():
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == _assembler().assemble(), (
        "benchmarks/RESULTS.md is out of date: edit benchmarks/results/<area>.md (or the header "
        "above the first '## '), then run python benchmarks/assemble_results.py")


def test_demote_adds_one_level_outside_code_blocks():
    text = "# Area\n## Sub\n```\n# a comment in code\n```\nplain # text"
    assert _assembler().demote(text) == "## Area\n### Sub\n```\n# a comment in code\n```\nplain # text"
