"""MkDocs hook: pages that live outside docs/, read where they are (nothing is copied).

- ``CONTRIBUTING.md`` becomes ``contributing.md``;
- each area file ``benchmarks/results/<area>.md`` becomes ``results/<area>.md``, the page that
  ``results.md`` and the concept pages link for a figure's command, machine and date.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def outside_pages() -> dict[str, Path]:
    """Site path -> source file of every page brought in from outside docs/."""
    pages = {"contributing.md": ROOT / "CONTRIBUTING.md"}
    for area in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        pages[f"results/{area.name}"] = area
    return pages


def on_files(files: Files, config: Any) -> Files:
    for uri, source in outside_pages().items():
        if files.get_file_from_path(uri) is not None:
            raise ValueError(f"docs/{uri} would hide {source.relative_to(ROOT)}: delete it, the "
                             "hook brings that page in")
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    for source in outside_pages().values():
        server.watch(str(source))
    return server
