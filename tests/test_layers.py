"""The package's layer order (CONTRIBUTING.md, "Layers"): no import from a lower layer to a
higher one and no import cycle between subpackages.

Every module's imports are read with ``ast`` (inside functions too: a lazy import is still a
dependency) together with the lazy re-export tables (a dict of ``"contrastive.x.y"`` strings, as
``contrastive/text/__init__.py`` has). The order itself is read from CONTRIBUTING.md, so the
document and the check cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "contrastive"
OUTSIDE = ("recipes", "tools", "benchmarks", "tests")  # the top: the package never imports them


def read_layers(text: str) -> list[set[str]]:
    """The layers of CONTRIBUTING.md's "Layers" list, lowest first: each a set of units
    (``engine``, ``records``...), the top one (commands, outside the package) empty."""
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    layers = []
    for item in re.split(r"^\d+\. ", section, flags=re.M)[1:]:  # an item may wrap lines
        head = item.split(": ", 1)[0]
        layers.append({Path(p).stem for p in re.findall(rf"`{PACKAGE}/([\w.]+)/?`", head)})
    return layers[::-1]


def unit_of(module: str) -> str:
    """``contrastive.eval.sts`` -> ``eval``; ``contrastive.records`` -> ``records``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every import of the package in ``path``, lazy ones included."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] \
                if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            # `from contrastive import nn`: the names may be modules
            names = [target] if unit_of(target) or not node.names else \
                [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Dict):  # a lazy re-export table
            names = [v.value for v in node.values if isinstance(v, ast.Constant)
                     and isinstance(v.value, str) and re.fullmatch(rf"{PACKAGE}(\.\w+)+", v.value)]
        else:
            continue
        for name in names:
            if name.split(".")[0] in (PACKAGE, *OUTSIDE):
                yield node.lineno, name


def violations(root: Path, layers: list[set[str]]) -> list[str]:
    """Each import from a lower layer to a higher one, into the commands, from an unplaced unit,
    and each pair of units importing each other, named by file, line and import."""
    rank = {unit: i for i, units in enumerate(layers) for unit in units}
    found, edges = [], {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root)
        module = ".".join(rel.with_suffix("").parts)
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")]
        src = unit_of(module)
        if not src:
            continue  # contrastive/__init__.py: the lazy front door, above the order
        if src not in rank:
            found.append(f"{rel}: {src!r} is in no layer of CONTRIBUTING.md's list; place it")
            continue
        for line, name in imports(path, module):
            if name.split(".")[0] in OUTSIDE:
                found.append(f"{rel}:{line} imports {name} (a command: above the package)")
                continue
            dst = unit_of(name)
            if dst in ("", src):
                continue
            edges.setdefault((src, dst), f"{rel}:{line} imports {name}")
            if rank.get(dst, len(layers)) > rank[src]:
                found.append(f"{rel}:{line} imports {name}: {dst} is above {src}")
    for (a, b), where in sorted(edges.items()):
        if a < b and (b, a) in edges:
            found.append(f"cycle between {a} and {b}: {where}; {edges[(b, a)]}")
    return found


def test_the_package_follows_the_layer_order() -> None:
    layers = read_layers((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    units = set().union(*layers)
    assert {"engine", "eval", "methods", "nn", "data", "losses", "records", "text"} <= units
    found = violations(ROOT, layers)
    assert not found, "imports against the layer order (CONTRIBUTING.md, Layers):\n" + \
        "\n".join(found)


def test_the_check_sees_an_upward_import_a_lazy_one_and_a_cycle(tmp_path: Path) -> None:
    """The check can fail: a made-up package with an upward import inside a function, a lazy
    re-export table naming a higher layer, a cycle within one layer and an unplaced unit."""
    pkg = tmp_path / PACKAGE
    files = {
        "__init__.py": "",
        "nn/__init__.py": "",
        "nn/folders.py": "def f():\n    from contrastive.eval.sts import x\n",
        "nn/pair.py": "from contrastive.augment import y\n",
        "augment/__init__.py": "from . import z\nfrom ..nn import pair\n",
        "data/__init__.py": '_LAZY = {"a": "contrastive.methods.m"}\n',
        "eval/sts.py": "import contrastive.records\nfrom contrastive.nn import folders\n",
        "extra/__init__.py": "",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    layers = [{"records"}, {"data"}, {"nn", "augment"}, {"methods"}, {"eval"}, set()]
    found = violations(tmp_path, layers)
    assert found == [
        "contrastive/data/__init__.py:1 imports contrastive.methods.m: methods is above data",
        "contrastive/extra/__init__.py: 'extra' is in no layer of CONTRIBUTING.md's list; place it",
        "contrastive/nn/folders.py:2 imports contrastive.eval.sts: eval is above nn",
        "cycle between augment and nn: contrastive/augment/__init__.py:2 imports "
        "contrastive.nn; contrastive/nn/pair.py:1 imports contrastive.augment",
        "cycle between eval and nn: contrastive/eval/sts.py:2 imports contrastive.nn; "
        "contrastive/nn/folders.py:2 imports contrastive.eval.sts",
    ], found


def test_the_layers_read_from_contributing() -> None:
    text = "intro\n## Layers\n1. `recipes/`: all\n2. `contrastive/eval`: x\n" \
           "3. `contrastive/nn`,\n   `contrastive/augment`: y `contrastive/data`\n" \
           "4. `contrastive/records.py`: z\n## Next"
    assert read_layers(text) == [{"records"}, {"nn", "augment"}, {"eval"}, set()]
