"""The loss reference's examples run: every ``>>>`` line in ``contrastive.losses`` passes doctest,
every registered loss's class shows one (an ``Examples:`` block, rendered in
docs/reference/losses.md, which has a section for every registered loss), and the Python
blocks of docs/concepts/loss-registry.md run."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import contrastive.losses
from contrastive.losses import list_losses, loss_class
from contrastive.losses.registry import _REGISTRY

MODULES = sorted(m.name for m in pkgutil.iter_modules(contrastive.losses.__path__,
                                                       "contrastive.losses."))


@pytest.mark.parametrize("module_name", ["contrastive.losses", *MODULES])
def test_examples_pass_doctest(module_name):
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, module_name):
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{module_name}: {failed} of {attempted} doctest examples failed (above)"


@pytest.mark.parametrize("name", list_losses())
def test_every_registered_loss_has_an_example(name):
    doc = loss_class(name).__doc__ or ""
    assert "Examples:" in doc and ">>>" in doc.split("Examples:", 1)[1], (
        f"loss {name!r} ({loss_class(name).__qualname__}) needs an 'Examples:' block with '>>>' "
        "lines in its class docstring: build it by name and call it on small tensors")


def test_a_wrong_example_fails():
    """The runner can fail: an example whose printed output is wrong is counted."""
    wrong = '"""\n>>> import torch\n>>> torch.tensor(1.0) + 1\ntensor(3.)\n"""'
    test = doctest.DocTestParser().get_doctest(wrong, {}, "wrong", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test, out=lambda _: None)
    assert runner.summarize(verbose=False).failed == 1


DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_reference_page_shows_every_registered_loss():
    page = (DOCS / "reference" / "losses.md").read_text()
    missing = [name for name in list_losses() if f"### `{name}`" not in page
               or f"::: {loss_class(name).__module__}.{loss_class(name).__qualname__}\n" not in page]
    assert not missing, f"docs/reference/losses.md lacks a section (### `name` and ::: Class) for {missing}"


def test_the_registry_page_examples_run():
    """docs/concepts/loss-registry.md's Python blocks run as written (their asserts included)."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "concepts" / "loss-registry.md").read_text(),
                        re.S)
    assert blocks
    added = set()
    try:
        for block in blocks:
            before = set(list_losses())
            exec(compile(block, "docs/concepts/loss-registry.md", "exec"), {})
            added |= set(list_losses()) - before
    finally:
        for name in added:  # the page registers its own loss: leave the registry as it was
            _REGISTRY.remove(name)
    assert added == {"my_l2"}
