"""The online kNN monitor against a hand-written weighted kNN."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from contrastive.engine.monitor import KNNMonitor, extract_sharded, weighted_knn_top1


def _hand_knn(bank, bank_y, queries, query_y, k, t, c):
    correct = 0
    for q, y in zip(queries, query_y):
        sims = [(float(q @ b) / (q.norm() * b.norm()).item(), int(lab)) for b, lab in zip(bank, bank_y)]
        sims.sort(key=lambda s: -s[0])
        scores = [0.0] * c
        for s, lab in sims[:k]:
            scores[lab] += math.exp(s / t)
        correct += int(max(range(c), key=lambda i: scores[i]) == int(y))
    return 100.0 * correct / len(queries)


@pytest.mark.parametrize("k", [1, 5, 50])
def test_weighted_knn_equals_hand_loop(k):
    g = torch.Generator().manual_seed(0)
    bank, queries = torch.randn(40, 6, generator=g), torch.randn(15, 6, generator=g)
    bank_y, query_y = torch.randint(0, 4, (40,), generator=g), torch.randint(0, 4, (15,), generator=g)
    got = weighted_knn_top1(bank, bank_y, queries, query_y, k=k, t=0.1, num_classes=4, chunk=4)
    assert got == pytest.approx(_hand_knn(bank, bank_y, queries, query_y, min(k, 40), 0.1, 4))


def test_monitor_separable_data_single_process():
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(1)
    centers = torch.eye(3) * 5
    y = torch.arange(60) % 3
    x = centers[y] + torch.randn(60, 3, generator=g)
    data = TensorDataset(x, y)
    feats, labels = extract_sharded(lambda v: v * 2, data, list(range(0, 60, 2)),
                                    accelerator=acc, batch_size=7, num_workers=0)
    assert torch.equal(labels.cpu(), y[::2])
    torch.testing.assert_close(feats, torch.nn.functional.normalize(x[::2] * 2, dim=1))
    mon = KNNMonitor(data, data, k=5, t=0.1, max_bank=30, num_classes=3)
    assert mon(lambda v: v, acc) > 90.0
    assert mon(lambda v: torch.ones_like(v), acc) < 50.0  # a collapsed encoder
