"""What README.md and docs/**/*.md say about recipe flags holds against the recipes' ``--help``.

Two kinds of statement are checked (outside them nothing is parsed):

- **Commands**: every line of a fenced code block that runs ``recipes/<name>.py`` (after
  ``python``, ``accelerate launch ...``, ``torchrun ...``, ``srun ...``; ``\\`` continuations
  joined; the command ends at ``|``, ``&&``, ``;``, ``>``): the recipe exists and every
  ``--flag`` after it (``--flag=value`` too; after a launcher's own options, those after
  ``--``, as ``contrastive-slurm submit recipes/x.py --nodes 2 -- --steps 5``) is in that
  recipe's ``--help``. A name with ``<``,
  ``*``, ``{`` or ``$`` is a placeholder and skipped, as are flags after a ``$VARIABLE``.
- **Prose claims**: a clause (a sentence of a paragraph or list item, or a table row, cut at
  ``. ``, ``; `` and ``: ``; code blocks left out) that holds backticked flags (a code span
  starting with ``--``) and names the recipes they are on, in one of these ways:
    1. "every / each / all (the) recipe(s)" or "(the) recipes all": every recipe;
    2. "every / each / all (the) (N) image / text / image-text recipe(s)" or "(the) N image
       recipes": the recipes of that kind (image: no ``make()``; image-text: ``make()`` and
       ``--image-size``; text: the other ``make()`` recipes);
    3. backticked recipe names (``moco_cifar``, ``moco_cifar.py`` or ``recipes/moco_cifar.py``):
       those recipes.
  Every flag of the clause must be in the ``--help`` of every recipe it names. A clause with
  a negation ("no", "not", "without", "never", "refuse(s/d)", "instead of", "except") is not
  a claim that a flag exists and is skipped.

The docs are written as the code changes: a failure names the file, the line and the flag.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.py"))
FLAG = re.compile(r"--[a-z][a-z0-9_-]*")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
EVERY = re.compile(r"\b(?:every|each|all(?: the)?|the)\s+(?:\d+\s+)?"
                   r"(?:(?P<kind>image-text|image|text)\s+)?recipes?\b(?!['’]s)", re.I)
ALL_RECIPES = re.compile(r"\brecipes all\b", re.I)
NEGATION = re.compile(r"\b(?:no|not|without|never|refuse[sd]?|instead of|except)\b", re.I)
CUT = re.compile(r"(?<=[.;:])\s+")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def fenced_commands(text: str) -> list[tuple[int, str, list[str]]]:
    """(line number, recipe name, the arguments after it) of each fenced command line that runs
    a recipe."""
    out, fenced, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        if not pending:
            start = number
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        command, pending = pending, ""
        try:
            words = shlex.split(command, comments=True)
        except ValueError:
            continue  # not shell (a Python or YAML block)
        for stop in ("|", "||", "&&", ";", ">", ">>", "2>", "&"):
            if stop in words:
                words = words[:words.index(stop)]
        at = next((i for i, w in enumerate(words) if re.fullmatch(r"(\./)?recipes/[^/\s]+\.py", w)),
                  None)
        if at is None:
            continue
        name = Path(words[at]).stem
        if any(c in words[at] for c in "<*{$"):
            continue
        args = words[at + 1:]
        if "--" in args:  # a launcher's options, then the recipe's after "--"
            args = args[args.index("--") + 1:]
        args = args[:next((i for i, w in enumerate(args) if w.startswith("$") or w == "..."),
                          len(args))]
        out.append((start, name, args))
    return out


def _clauses(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each prose clause outside code blocks."""
    blocks: list[tuple[int, str]] = []
    fenced, current, start = False, [], 0
    for number, line in enumerate(text.splitlines() + [""], 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            current = []
            continue
        if fenced or line.startswith("    "):
            continue
        new_item = re.match(r"\s*([-*]|\d+\.)\s|\s*\|", line) is not None
        if not line.strip() or new_item or line.startswith("#"):
            if current:
                blocks.append((start, " ".join(current)))
            current = []
        if line.strip():
            if not current:
                start = number
            current.append(line.strip())
    clauses = []
    for start, block in blocks:
        if block.startswith("|"):
            clauses.append((start, block))
            continue
        # cut outside code spans only: mask them first
        masked = CODE_SPAN.sub(lambda m: "`" + "x" * len(m.group(1)) + "`", block)
        at = 0
        for m in CUT.finditer(masked):
            clauses.append((start, block[at:m.start()]))
            at = m.end()
        clauses.append((start, block[at:]))
    return clauses


def prose_claims(text: str, kind_of) -> list[tuple[int, str, list[str], list[str]]]:
    """(line, clause, recipes claimed, flags claimed) of each clause matching a pattern of the
    module docstring; ``kind_of(name)`` gives a recipe's kind."""
    claims = []
    for line, clause in _clauses(text):
        spans = CODE_SPAN.findall(clause)
        flags = sorted({FLAG.match(s).group(0) for s in spans if FLAG.match(s)})
        if not flags or NEGATION.search(CODE_SPAN.sub("", clause)):
            continue
        named = sorted({Path(s).stem for s in spans
                        if re.fullmatch(r"(recipes/)?[a-z0-9_]+(\.py)?", s) and Path(s).stem in RECIPES})
        prose = CODE_SPAN.sub("", clause)
        every = EVERY.search(prose) or ALL_RECIPES.search(prose)
        if every is not None and "recipe" in every.group(0).lower():
            kind = every.groupdict().get("kind")
            if every.group(0).lower().startswith("the ") and not (kind or re.search(r"\d", every.group(0))):
                every = None  # "the recipe" / "the recipes": not a claim about all of them
            else:
                recipes = [r for r in RECIPES if kind is None or kind_of(r) == kind.lower()]
                claims.append((line, clause, recipes, flags))
                continue
        if named:
            claims.append((line, clause, named, flags))
    return claims


def problems(text: str, where: str, flags_of, kind_of) -> list[str]:
    """Every command flag and prose claim of ``text`` that the recipes' ``--help`` contradicts."""
    found = []
    for line, name, args in fenced_commands(text):
        if name not in RECIPES:
            found.append(f"{where}:{line}: recipes/{name}.py does not exist")
            continue
        for arg in args:
            flag = FLAG.match(arg)
            if flag and flag.group(0) not in flags_of(name):
                found.append(f"{where}:{line}: recipes/{name}.py has no {flag.group(0)} "
                             "(see its --help)")
    for line, clause, recipes, flags in prose_claims(text, kind_of):
        for flag in flags:
            missing = [r for r in recipes if flag not in flags_of(r)]
            if missing:
                found.append(f"{where}:{line}: says {flag} is on {len(recipes)} recipe(s), but "
                             f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''} "
                             f"({len(missing)}) lack it: {clause[:120]!r}")
    return found


@pytest.fixture(scope="module")
def check(rx):
    """``check(text, where)``: the problems of ``text`` against the recipes' ``--help``."""
    kinds: dict[str, str] = {}

    def kind_of(name: str) -> str:
        if name not in kinds:
            image = not hasattr(rx.load_recipe(name), "make")
            text = "image-text" if "--image-size" in rx.recipe_flags(name) else "text"
            kinds[name] = "image" if image else text
        return kinds[name]

    return lambda text, where: problems(text, where, rx.recipe_flags, kind_of)


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_flags_exist(doc, check):
    found = check(doc.read_text(), str(doc.relative_to(ROOT)))
    assert not found, "documented flags the recipes lack:\n" + "\n".join(found)


def test_a_false_claim_fails(check):
    """The check can fail: false claims of each pattern are found, true ones pass."""
    false = (
        "Every recipe has `--eval-every`.\n\n"             # image recipes have --knn-every
        "`--hard-negatives` (every image recipe) adds negatives.\n\n"
        "`recipes/moco_cifar.py` takes `--text-encoder`.\n\n"
        "```bash\npython recipes/clip.py --steps 2 \\\n  --no-such-flag 1\n```\n\n"
        "```bash\npython recipes/nonexistent_recipe.py --steps 2\n```\n")
    found = check(false, "false.md")
    assert [f.split(" ", 1)[0] for f in found] == [
        "false.md:8:", "false.md:13:", "false.md:1:", "false.md:3:", "false.md:5:"], found
    assert "--no-such-flag" in found[0] and "nonexistent_recipe" in found[1]
    true = (
        "Every recipe has `--max-steps` and `--output-dir`.\n\n"
        "`--knn-every` (every image recipe) sets the monitor. The 2 image-text recipes take "
        "`--lock-image`.\n\n"
        "`moco_cifar` has no `--eval-every`.\n\n"           # a negation: not a claim
        "```bash\naccelerate launch --num_processes 2 recipes/moco_cifar.py --steps 5 $COMMON --x\n"
        "python recipes/<name>.py --anything\n"
        "contrastive-slurm submit recipes/moco_r50.py --nodes 2 -- --steps 5 ...\n```\n")
    assert check(true, "true.md") == []
