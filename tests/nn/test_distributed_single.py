"""The distributed helpers are exact no-ops in one process (the 2-process checks are in
tests/methods/test_distributed.py, one launch for nn and methods)."""

from __future__ import annotations

import torch

from contrastive.nn import distributed as D


def test_single_process_helpers_are_identity():
    assert not D.is_distributed()
    assert D.world_size() == 1 and D.rank() == 0
    x = torch.randn(4, 3, requires_grad=True)
    g = D.gather(x)
    assert torch.equal(g, x) and not g.requires_grad
    assert D.gather_with_grad(x) is x
    xs, idx = D.batch_shuffle(x)
    assert xs is x and torch.equal(idx, torch.arange(4))
    assert D.batch_unshuffle(xs, idx) is xs
