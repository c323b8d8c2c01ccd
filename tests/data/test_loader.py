"""Loaders: the same seed gives the same batches and views, whatever the number of workers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from contrastive.augment import get_pipeline
from contrastive.data import SeededSampler, build_loader, default_num_workers, get_dataset
from contrastive.data.loader import SeededDataset, mix_seed, seed_item_generators


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
    assert [e for e, _ in e0] == [0] * 10 and [e for e, _ in e1] == [1] * 10
    assert sorted(i for _, i in e0) == list(range(10)) and [i for _, i in e0] != [i for _, i in e1]
    s.set_epoch(0)
    assert list(s) == e0
    assert [i for _, i in SeededSampler(5, shuffle=False, seed=1)] == [0, 1, 2, 3, 4]
    seeds = {mix_seed(1, e, i) for e in range(3) for i in range(100)}
    assert len(seeds) == 300 and all(0 <= v < 2**63 for v in seeds)


class _Draws(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i):
        return torch.rand(3), torch.randn(2), torch.randperm(5), random.random(), np.random.rand()


def test_an_items_draws_depend_on_seed_epoch_and_index_only():
    """The key is (epoch, index): the same key gives the same draws whatever came before."""
    ds = SeededDataset(_Draws(), seed=3)
    a = ds[(1, 4)]
    ds[(0, 2)]
    b = ds[(1, 4)]
    assert all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))
    assert a[-1] == 4  # the index travels with the item (the engine's `indices`)
    assert not torch.equal(ds[(2, 4)][0], a[0]) and not torch.equal(ds[(1, 5)][0], a[0])
    assert len(SeededDataset(_Draws(), with_index=False)[(0, 1)]) == 5


def test_items_without_randomness_skip_the_seeding():
    """``seeded_items = False`` (text examples): the item is loaded as it is, no generator is
    seeded (the draws follow the caller's stream; with seeding they would repeat per key)."""
    class Unseeded(_Draws):
        seeded_items = False

    ds = SeededDataset(Unseeded(), seed=3)
    torch.manual_seed(0)
    a, b = ds[(1, 4)], ds[(1, 4)]
    assert not torch.equal(a[0], b[0]) and a[-1] == b[-1] == 4
    torch.manual_seed(0)
    assert torch.equal(ds[(0, 4)][0], a[0])  # the caller's stream, whatever the key


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 - 1, 2**32 + 7, 2**62 + 3, 2**63 - 1])
def test_cheap_item_seeding_gives_the_torch_manual_seed_stream(seed):
    """``torch.default_generator.manual_seed`` (~3 us) leaves the CPU generator in the very state
    ``torch.manual_seed`` (which also seeds every CUDA device) leaves it in: same draws."""
    torch.manual_seed(seed)
    expected_state = torch.get_rng_state()
    expected = (torch.rand(4), torch.randn(3), torch.randint(0, 1000, (3,)), torch.randperm(7))
    torch.manual_seed(seed + 1)  # somewhere else
    seed_item_generators(seed)
    assert torch.equal(torch.get_rng_state(), expected_state)
    got = (torch.rand(4), torch.randn(3), torch.randint(0, 1000, (3,)), torch.randperm(7))
    assert all(torch.equal(x, y) for x, y in zip(got, expected))


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
