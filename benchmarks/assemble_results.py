#!/usr/bin/env python
"""Rebuild ``benchmarks/RESULTS.md`` and the headline tables from ``benchmarks/results/``.

Each area keeps its own file (written next to the benchmark that produced it); RESULTS.md is
the one page readers open: its hand-written header (everything above the first ``## ``
heading), whose headline table between ``<!-- results:begin -->`` and ``<!-- results:end -->``
is generated, followed by the area files in a fixed order, their headings demoted by one level
so that each area is a ``##`` section.

The headline figures live in the area files, one HTML comment per row (right under the
title; in ``init_cifar.md``, whose top is rewritten by its driver, under ``## Reading``)::

    <!-- headline: LABEL | THE FIGURES | front: A SHORTER TEXT FOR THE FRONT PAGE -->

(``| front: ...`` is optional: the rows that have it go to the README's table too, with that
text and the label without its closing parenthesis.) From them
come three tables, each between the same two markers: RESULTS.md's header (every row),
``docs/results.md`` (every row, linked to its area page) and ``README.md`` (the front rows,
linked to their area files). A README without the markers is skipped with a note.

    python benchmarks/assemble_results.py            # rewrite RESULTS.md, README.md, docs/results.md
    python benchmarks/assemble_results.py --check    # exit 1 if any of them is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ORDER = ("demo", "nn", "augment", "decode", "train", "issue15", "methods", "grad_cache", "grad_checkpointing", "eval", "distill", "init", "init_cifar", "after_cifar", "simcse", "lrc_bert", "lrc_glue", "clip", "peer_losses", "gpu")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEADLINE = re.compile(r"<!-- headline: (?P<label>.+?) \| (?P<text>.+?)(?: \| front: (?P<front>.+?))? -->")


class Headline(NamedTuple):
    """One row of the headline tables, as its area file records it."""

    area: str
    label: str
    text: str
    front: str | None  # the README's shorter text; None: not on the front page


def demote(markdown: str) -> str:
    """Add one ``#`` to every heading outside code blocks."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#+ ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out)


def _area_texts(parts: Path) -> dict[str, str]:
    missing = [name for name in ORDER if not (parts / f"{name}.md").is_file()]
    if missing:
        raise FileNotFoundError(f"missing area files in {parts}: {missing}")
    return {name: (parts / f"{name}.md").read_text() for name in ORDER}


def parse_headlines(area: str, markdown: str) -> list[Headline]:
    """The ``<!-- headline: ... -->`` rows of one area file, in file order (at least one)."""
    rows = []
    for number, line in enumerate(markdown.splitlines(), 1):
        if not line.startswith("<!-- headline"):
            continue
        m = HEADLINE.fullmatch(line.strip())
        if m is None:
            raise ValueError(f"results/{area}.md line {number}: a headline must read "
                             "'<!-- headline: LABEL | FIGURES -->' (optionally ' | front: SHORT' "
                             f"before ' -->'), got {line[:80]!r}")
        rows.append(Headline(area, m["label"], m["text"], m["front"]))
    if not rows:
        raise ValueError(f"results/{area}.md has no '<!-- headline: LABEL | FIGURES -->' line: "
                         "add one under its title")
    return rows


def headlines(parts: Path = HERE / "results") -> list[Headline]:
    """Every area's headline rows, areas in ``ORDER``."""
    texts = _area_texts(parts)
    return [row for name in ORDER for row in parse_headlines(name, texts[name])]


def table(rows: list[Headline], link: Callable[[str], str] | None = None,
          front: bool = False) -> str:
    """A markdown table of ``rows`` (``front``: only the front rows, their short text, their
    label without a closing parenthesis); ``link`` maps an area to the address its label links
    to (None: no links)."""
    lines = ["| area | headline (details in the area's page) |", "|---|---|"]
    for row in rows:
        if front and row.front is None:
            continue
        label = re.sub(r"\s*\([^()]*\)$", "", row.label) if front else row.label
        label = f"[{label}]({link(row.area)})" if link else label
        lines.append(f"| {label} | {row.front if front else row.text} |")
    return "\n".join(lines)


def fill(document: str, block: str, name: str) -> str | None:
    """``document`` with ``block`` between its results markers; None when it has none."""
    if BEGIN not in document and END not in document:
        return None
    before, sep, rest = document.partition(BEGIN)
    _, sep2, after = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{name}: needs {BEGIN} before {END}, each once")
    return f"{before}{BEGIN}\n{block}\n{END}{after}"


def assemble(results: Path = HERE / "RESULTS.md", parts: Path = HERE / "results") -> str:
    """The text RESULTS.md should have: its header with the headline table, then every area."""
    current = results.read_text() if results.exists() else f"# Benchmark results\n\n{BEGIN}\n{END}\n"
    header = current.split("\n## ", 1)[0].rstrip() + "\n"
    header = fill(header, table(headlines(parts)), "benchmarks/RESULTS.md")
    if header is None:
        raise ValueError(f"benchmarks/RESULTS.md's header needs the markers {BEGIN} and {END}")
    sections = [demote(text).strip() for text in _area_texts(parts).values()]
    return header + "\n\n" + "\n\n".join(sections) + "\n"


def outputs(root: Path = ROOT) -> dict[Path, str | None]:
    """Every generated file and the text it should have (None: a file without the markers)."""
    rows = headlines(root / "benchmarks" / "results")
    out: dict[Path, str | None] = {
        root / "benchmarks" / "RESULTS.md": assemble(root / "benchmarks" / "RESULTS.md",
                                                     root / "benchmarks" / "results")}
    for path, block in (
            (root / "README.md", table(rows, lambda a: f"benchmarks/results/{a}.md", front=True)),
            (root / "docs" / "results.md", table(rows, lambda a: f"results/{a}.md"))):
        out[path] = fill(path.read_text(), block, path.name) if path.is_file() else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only check that the files are current")
    args = p.parse_args()
    stale = []
    for path, text in outputs().items():
        name = path.relative_to(ROOT)
        if text is None:
            print(f"{name}: no {BEGIN} ... {END} markers (or no file): skipped")
        elif path.read_text() != text:
            if args.check:
                stale.append(str(name))
            else:
                path.write_text(text)
                print(f"wrote {name} ({len(text.splitlines())} lines)")
    if stale:
        print(f"out of date: {', '.join(stale)}: run python benchmarks/assemble_results.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
