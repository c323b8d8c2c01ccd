"""Data order and augmentation randomness: independent of processes, workers and resumes."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import Dataset

from contrastive.engine.loader import (
    GlobalBatchSampler,
    SeededDataset,
    build_train_loader,
    mix_seed,
)


class _RandomViews(Dataset):
    """Item i: ([a random "view"], label i % 3): stands for a random augmentation."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        return [torch.rand(2) + random.random()], i % 3


def test_processes_split_each_global_batch():
    one = list(GlobalBatchSampler(40, 8, seed=3))
    two = [list(GlobalBatchSampler(40, 8, rank=r, world_size=2, seed=3)) for r in range(2)]
    assert len(one) == 5 and all(len(b) == 8 for b in one)
    for b, (h0, h1) in enumerate(zip(*two)):
        assert h0 == one[b][0::2] and h1 == one[b][1::2]  # interleaved, as split BN groups
    flat = [i for batch in one for _, i in batch]
    assert sorted(flat) == list(range(40))


def test_order_is_a_function_of_seed_and_epoch():
    s = GlobalBatchSampler(40, 8, seed=3)
    e0, e0_again = list(s), list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 == e0_again and e0 != e1
    assert all(ep == 1 for batch in e1 for ep, _ in batch)
    assert list(GlobalBatchSampler(40, 8, seed=4)) != e0
    assert len(GlobalBatchSampler(40, 8, num_batches=4)) == 4


def test_sampler_errors():
    with pytest.raises(ValueError, match="divisible"):
        GlobalBatchSampler(40, 9, world_size=2)
    with pytest.raises(ValueError, match="lower --batch-size"):
        GlobalBatchSampler(4, 8)


def _epoch(loader):
    return [(torch.cat(v), y, i) for v, y, i in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_views_do_not_depend_on_workers_or_skipping(workers):
    from accelerate.data_loader import skip_first_batches

    ref = _epoch(build_train_loader(_RandomViews(), GlobalBatchSampler(40, 4, seed=1), seed=1,
                                    num_workers=0, pin_memory=False))
    loader = build_train_loader(_RandomViews(), GlobalBatchSampler(40, 4, seed=1), seed=1,
                                num_workers=workers, pin_memory=False)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
               for a, b in zip(ref, _epoch(loader)))
    skipped = _epoch(skip_first_batches(loader, 3))  # a resume: no re-loading of batches 0-2
    assert len(skipped) == len(ref) - 3
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ref[3:], skipped))


def test_main_process_random_stream_untouched():
    loader = build_train_loader(_RandomViews(), GlobalBatchSampler(40, 4, seed=1), seed=1,
                                num_workers=0, pin_memory=False)
    torch.manual_seed(5)
    random.seed(5)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(5)
    random.seed(5)
    _epoch(loader)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_seeded_dataset_item_and_mix():
    ds = SeededDataset(_RandomViews(), seed=0)
    a, b = ds[(0, 5)], ds[(0, 5)]
    assert torch.equal(a[0][0], b[0][0]) and a[1:] == (2, 5)
    assert not torch.equal(ds[(1, 5)][0][0], a[0][0])  # another epoch, other views
    seeds = {mix_seed(0, e, i) for e in range(3) for i in range(100)}
    assert len(seeds) == 300 and all(0 <= s < 2 ** 63 for s in seeds)
