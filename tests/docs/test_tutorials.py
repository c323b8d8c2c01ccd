"""Every command of the tutorials (docs/tutorials/*.md) runs, in order, on a tiny budget.

The convention a tutorial follows, so that this test can run it:

- Every fenced ``bash`` and ``python`` block of a page runs, top to bottom, in one temporary
  working folder per page (the reader's project root): a block uses what the blocks before it
  left (pretrain -> evaluate -> fine-tune -> embed -> export). ``text`` blocks are not run.
- A ``bash`` block holds commands, one a line (``\\`` continues it, ``#`` starts a comment),
  each ``python recipes/NAME.py ARGS`` or ``contrastive-TOOL ARGS``. They run in this process: a
  recipe as its program runs (``run_recipe_here``), a tool through its entry point in
  setup.cfg; an interpreter start costs seconds of imports, more than a tiny run trains.
  ``BUDGET``'s flags for that program go after the page's (argparse: the last occurrence wins):
  they shrink steps, batch, workers and evaluation sizes, never the command's data or paths.
- A ``python`` block is executed as written (it makes the page's example data: ``my_images/``,
  a caption folder, a sentence file), so a reader replaces it by their own data.
- ``recipes/...`` names the repository's recipes; ``../shared/data/...`` (the real data and
  models beside the project) is replaced by that folder. Blocks that name it come last in a page
  and run in :func:`test_tutorial_on_the_shared_data` (slow): the default suite runs each page
  up to its first such block.
- ``<!-- after: PAGE.md -->`` on its own line makes a page continue in PAGE's working folder
  (after PAGE's blocks).
- ``<!-- not run: REASON -->`` right before a block leaves it out (ImageNet-scale runs, several
  GPUs, downloads); its recipe and tool commands are still checked: every flag they use is in
  that program's ``--help``.
"""

from __future__ import annotations

import configparser
import importlib
import importlib.util
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
SHARED = "../shared/data"
SHARED_DATA = ROOT.parent / "shared" / "data"
PAGES = ["image-folder", "pretrained-weights", "after-pretraining", "clip", "simcse", "lrc-bert"]

# the recipe helpers of tests/recipes/conftest.py (tests import nothing under importlib mode)
_spec = importlib.util.spec_from_file_location(
    "_recipe_helpers", ROOT / "tests" / "recipes" / "conftest.py")
assert _spec is not None and _spec.loader is not None
rx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rx)

_RECIPE = ["--max-steps", "2", "--num-workers", "0", "--progress", "false", "--log-every", "1",
           "--mixed-precision", "no", "--save-every-steps", "0"]
_TEXT = ["--layers", "1", "--hidden", "16", "--heads", "2", "--intermediate-size", "32"]
# Per program: the flags that make a page's command tiny (appended: they win).
BUDGET: dict[str, list[str]] = {
    "recipes/moco_cifar.py": [*_RECIPE, "--batch-size", "16", "--queue-size", "32",
                              "--split-bn", "2", "--knn-max-train", "64", "--knn-max-test", "32"],
    "recipes/byol_cifar.py": [*_RECIPE, "--batch-size", "16", "--knn-max-train", "64",
                              "--knn-max-test", "32", "--mlp-hidden", "32"],
    "recipes/clip.py": [*_RECIPE, "--batch-size", "16", "--eval-max", "32", "--layers", "1",
                        "--hidden", "16", "--heads", "2"],
    "recipes/simcse.py": [*_RECIPE, "--batch-size", "8", "--n-eval", "32"],
    "recipes/bert_finetune.py": [*_RECIPE, "--batch-size", "8", "--n-dev", "32"],
    "recipes/lrc_bert.py": [*_RECIPE, "--batch-size", "8", "--n-dev", "32"],
    "recipes/moco_r50.py": [*_RECIPE, "--batch-size", "8", "--queue-size", "16",
                            "--mlp-hidden", "32"],
    "contrastive-plot": ["--max-samples", "40"],
    "contrastive-plot retrieval": [],
    "contrastive-knn-eval": ["--num-workers", "0", "--batch-size", "64", "--mixed-precision", "no"],
    "contrastive-linear-eval": ["--num-workers", "0", "--batch-size", "64", "--epochs", "2",
                                "--mixed-precision", "no"],
    "contrastive-finetune": ["--max-steps", "2", "--batch-size", "16", "--num-workers", "0",
                             "--progress", "false", "--mixed-precision", "no",
                             "--eval-batch-size", "64"],
    "contrastive-embed": ["--num-workers", "0", "--no-progress"],
    "contrastive-export": ["--check-count", "2"],
    "contrastive-zeroshot": ["--n-test", "32"],
    "contrastive-sts-eval": ["--n", "64"],
}
SUBCOMMANDS = {"contrastive-plot": {"attention", "mae", "retrieval"}}
_TEXT_RECIPES = {"recipes/simcse.py", "recipes/bert_finetune.py", "recipes/lrc_bert.py"}


@dataclass
class Block:
    """A fenced block of a page: its language, text, line and what the comment before says."""
    lang: str
    text: str
    line: int
    not_run: str | None = None

    @property
    def shared(self) -> bool:
        return SHARED in self.text

    def commands(self) -> list[list[str]]:
        """The block's commands, split as a shell splits them."""
        joined = self.text.replace("\\\n", " ")
        return [cmd for cmd in (shlex.split(line, comments=True) for line in joined.splitlines())
                if cmd]


@dataclass
class Page:
    name: str
    blocks: list[Block] = field(default_factory=list)
    after: str | None = None


def read_page(name: str) -> Page:
    """The page's fenced blocks and its markers (module docstring)."""
    text = (TUTORIALS / f"{name}.md").read_text(encoding="utf-8")
    page = Page(name)
    after = re.search(r"^<!-- after: ([\w-]+)\.md -->$", text, re.M)
    page.after = after.group(1) if after else None
    pending, lines, i = None, text.splitlines(), 0
    while i < len(lines):
        marker = re.fullmatch(r"<!-- not run: (.*?) -->", lines[i].strip())
        fence = re.fullmatch(r"```(\w*)", lines[i].strip())
        if marker:
            pending = marker.group(1).strip()
            assert pending, f"{name}.md:{i + 1}: a not-run block needs its reason"
        elif fence:
            end = lines.index("```", i + 1)
            page.blocks.append(Block(fence.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1,
                                     pending))
            pending, i = None, end
        elif lines[i].strip():
            pending = None
        i += 1
    return page


def _program(cmd: list[str]) -> tuple[str, list[str]]:
    """``(program, args)``: ``recipes/NAME.py`` or ``contrastive-TOOL``, with its arguments."""
    if cmd[0] == "accelerate":  # accelerate launch [launcher flags] recipes/NAME.py ARGS
        at = next(i for i, a in enumerate(cmd) if a.startswith("recipes/"))
        return cmd[at], cmd[at + 1:]
    if cmd[0] == "python" and len(cmd) > 1 and cmd[1].startswith("recipes/"):
        return cmd[1], cmd[2:]
    assert cmd[0].startswith("contrastive-"), f"not a recipe or tool command: {shlex.join(cmd)}"
    if cmd[1:2] and cmd[1] in SUBCOMMANDS.get(cmd[0], ()):
        return f"{cmd[0]} {cmd[1]}", cmd[2:]
    return cmd[0], cmd[1:]


def _call_tool(program: str, args: list[str]) -> int | None:
    """A console script's entry point (setup.cfg) called with ``args``."""
    tool, *mode = program.split()
    module, func = _entry_points()[tool].split(":")
    return getattr(importlib.import_module(module), func)([*mode, *args])


def _entry_points() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return dict(line.split(" = ") for line in
                cfg["options.entry_points"]["console_scripts"].strip().splitlines())


def _shared(args: list[str]) -> list[str]:
    return [a.replace(SHARED, str(SHARED_DATA)) for a in args]


def run_command(cmd: list[str]) -> None:
    """One command of a page, in this process, with its program's budget."""
    program, args = _program(cmd)
    assert cmd[0] != "accelerate", f"several processes: mark the block not run ({shlex.join(cmd)})"
    assert program in BUDGET, f"no tiny budget for {program}: add it to BUDGET"
    args = _shared(args) + BUDGET[program]
    if program in _TEXT_RECIPES and not any(a.startswith("hf:") for a in args):
        args += _TEXT  # a BERT from sizes (a pretrained folder has its own)
    if "--glue-dir" in args:
        args += ["--train-rows", "32"]
    if program.startswith("recipes/"):
        rx.run_recipe_here(Path(program).stem, *args, tiny=False)
        return
    code = _call_tool(program, args)
    assert code in (0, None), f"{shlex.join(cmd)} exited with {code}"


def program_flags(program: str) -> frozenset[str]:
    """The ``--flags`` of ``program --help`` (a recipe's or a tool's)."""
    if program.startswith("recipes/"):
        return rx.recipe_flags(Path(program).stem)
    return rx.help_flags(lambda: _call_tool(program, ["--help"]))


@dataclass
class Walk:
    """How far this session has run a page, in its working folder."""
    folder: Path
    done: int = 0


_WALKS: dict[str, Walk] = {}


def walk(name: str, stop_at_shared: bool, tmp_path_factory) -> Walk:
    """Run ``name``'s blocks (after its ``after`` page's) from where this session left it: up to
    its first block on the shared data, or to its end."""
    page = read_page(name)
    if name not in _WALKS:
        folder = (walk(page.after, stop_at_shared, tmp_path_factory).folder if page.after
                  else tmp_path_factory.mktemp(name))
        _WALKS[name] = Walk(folder)
    state = _WALKS[name]
    cwd = os.getcwd()
    os.chdir(state.folder)
    try:
        while state.done < len(page.blocks):
            block = page.blocks[state.done]
            if block.shared and stop_at_shared:
                break
            if block.shared and not SHARED_DATA.is_dir():
                pytest.skip(f"{name}.md:{block.line} needs {SHARED_DATA} (the real data and "
                            "models beside the project), absent here")
            if block.not_run is None and block.lang == "python":
                exec(compile(block.text, f"{name}.md:{block.line}", "exec"), {"__name__": name})
            elif block.not_run is None and block.lang == "bash":
                for cmd in block.commands():
                    run_command(cmd)
            state.done += 1
    finally:
        os.chdir(cwd)
    return state


def _shared_last(page: Page) -> None:
    first = next((i for i, b in enumerate(page.blocks) if b.shared), len(page.blocks))
    assert all(b.shared or b.not_run for b in page.blocks[first:]), (
        f"{page.name}.md: the blocks after the first on {SHARED} must use it too (or not run)")


@pytest.mark.parametrize("name", PAGES)
def test_tutorial(name, tmp_path_factory):
    """A page runs up to its blocks on the shared data, each command with its tiny budget."""
    page = read_page(name)
    assert page.blocks, f"{name}.md has no block to run"
    _shared_last(page)
    walk(name, True, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES)
def test_tutorial_on_the_shared_data(name, tmp_path_factory):
    """The rest of a page: its blocks on the real data and models of ../shared/data."""
    page = read_page(name)
    if not any(b.shared for b in page.blocks):
        pytest.skip(f"{name}.md names nothing in {SHARED}")
    _shared_last(page)
    walk(name, False, tmp_path_factory)


@pytest.mark.parametrize("name", PAGES)
def test_blocks_not_run_use_real_flags(name):
    """A block left out still names real programs and flags: each flag is in the --help of the
    recipe or tool it is given to."""
    for block in read_page(name).blocks:
        if block.not_run is None or block.lang != "bash":
            continue
        for cmd in block.commands():
            program, args = _program(cmd)
            known = program_flags(program)
            unknown = [a.split("=")[0] for a in args
                       if a.startswith("--") and a.split("=")[0] not in known]
            assert not unknown, f"{name}.md:{block.line}: {program} has no {unknown}"
