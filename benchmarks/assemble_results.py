#!/usr/bin/env python
"""Rebuild ``benchmarks/RESULTS.md`` from the per-area sources in ``benchmarks/results/``.

Each area keeps its own file (written next to the benchmark that produced it); RESULTS.md is
the one page readers open: its header and headline table (everything above the first ``## ``
heading, edited by hand) followed by the area files in a fixed order, their headings demoted
by one level so that each area is a ``##`` section.

    python benchmarks/assemble_results.py            # rewrite RESULTS.md
    python benchmarks/assemble_results.py --check    # exit 1 if RESULTS.md is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("nn", "augment", "decode", "train", "issue15", "methods", "grad_cache", "grad_checkpointing", "eval", "distill", "init", "init_cifar", "simcse", "lrc_bert", "lrc_glue", "clip", "peer_losses", "gpu")


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


def assemble(results: Path = HERE / "RESULTS.md", parts: Path = HERE / "results") -> str:
    current = results.read_text() if results.exists() else "# Benchmark results\n"
    header = current.split("\n## ", 1)[0].rstrip() + "\n"
    missing = [name for name in ORDER if not (parts / f"{name}.md").is_file()]
    if missing:
        raise FileNotFoundError(f"missing area files in {parts}: {missing}")
    sections = [demote((parts / f"{name}.md").read_text()).strip() for name in ORDER]
    return header + "\n\n" + "\n\n".join(sections) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only check that RESULTS.md is current")
    args = p.parse_args()
    text = assemble()
    path = HERE / "RESULTS.md"
    if args.check:
        if path.read_text() != text:
            print(f"{path} is out of date: run python benchmarks/assemble_results.py")
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
