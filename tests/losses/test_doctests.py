"""The loss reference's examples run: every ``>>>`` line in ``contrastive.losses`` passes doctest,
and every registered loss's class shows one (an ``Examples:`` block, rendered in
docs/reference/losses.md)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import contrastive.losses
from contrastive.losses import list_losses, loss_class

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
