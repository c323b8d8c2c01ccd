"""Loaders: the same seed gives the same batches and views, whatever the number of workers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from contrastive.augment import get_pipeline
from contrastive.data import SeededSampler, build_loader, default_num_workers, get_dataset
from contrastive.data.loader import sample_seeds


def _batches(loader, epochs=1):
    out = []
    for _ in range(epochs):
        for views, labels in loader:
            out.append(([v.clone() for v in views], labels.clone()))
    return out


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(
        len(va) == len(vb) and all(torch.equal(x, y) for x, y in zip(va, vb)) and torch.equal(la, lb)
        for (va, la), (vb, lb) in zip(a, b)
    )


@pytest.mark.parametrize("batched", [False, True], ids=["per_image", "batched"])
def test_same_views_across_runs_and_worker_counts(batched):
    pipe = get_pipeline("mocov2", 32)
    worker_fn, _ = pipe.split()
    ds = get_dataset("shapes:n=48", transform=worker_fn if batched else pipe)
    runs = {
        w: _batches(build_loader(ds, 16, shuffle=True, num_workers=w, seed=7, persistent_workers=False), epochs=2)
        for w in (0, 2)
    }
    again = _batches(build_loader(ds, 16, shuffle=True, num_workers=0, seed=7), epochs=2)
    assert _equal(runs[0], runs[2]) and _equal(runs[0], again)
    other = _batches(build_loader(ds, 16, shuffle=True, num_workers=0, seed=8), epochs=1)
    assert not _equal(runs[0][:3], other)
    # epochs differ: new order, new views
    assert not torch.equal(runs[0][0][1], runs[0][3][1]) or not torch.equal(runs[0][0][0][0], runs[0][3][0][0])


def test_sampler_epochs_and_seeds():
    s = SeededSampler(10, shuffle=True, seed=1)
    e0, e1 = list(s), list(s)  # the epoch advances at each iteration
    assert sorted(i for i, _ in e0) == list(range(10)) and e0 != e1
    s.set_epoch(0)
    assert list(s) == e0
    assert [i for i, _ in SeededSampler(5, shuffle=False, seed=1)] == [0, 1, 2, 3, 4]
    # an item's seed depends on (seed, epoch, index), not on its position in the order
    seeds0 = dict(e0)
    assert seeds0[3] == int(sample_seeds(1, 0, np.array([3]))[0])
    assert all(0 <= v < 2**63 for v in seeds0.values())
    assert len(set(seeds0.values())) == 10


def test_main_process_generators_are_left_alone():
    ds = get_dataset("shapes:n=8", transform=get_pipeline("mocov2", 32))
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    expected = (torch.rand(1), random.random(), np.random.rand())
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    _batches(build_loader(ds, 4, num_workers=0, seed=0))
    assert (torch.rand(1), random.random(), np.random.rand()) == expected


def test_loader_settings():
    ds = get_dataset("shapes:n=10")
    train = build_loader(ds, 4, shuffle=True, num_workers=0)
    assert train.drop_last and len(train) == 2 and train.pin_memory == torch.cuda.is_available()
    evaluation = build_loader(ds, 4, shuffle=False, num_workers=0)
    assert not evaluation.drop_last and len(evaluation) == 3
    assert [y.tolist() for _, y in evaluation] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    w = build_loader(ds, 4, num_workers=2)
    assert w.num_workers == 2 and w.persistent_workers
    assert 1 <= default_num_workers() <= 8
    assert train.dataset.num_classes == 10  # attributes reach through the seeding wrapper
    with pytest.raises(ValueError, match="batch_size"):
        build_loader(ds, 0)
