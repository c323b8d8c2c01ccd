"""Weighted kNN against a brute-force reference written with explicit loops."""

from __future__ import annotations

import math

import pytest
import torch

from contrastive.eval.knn import WeightedKNN, knn_accuracy, knn_predict, topk_accuracy


def reference_knn(bank, bank_labels, queries, k, t, num_classes):
    """Per query: cosine similarity to every bank row, k largest, sum exp(s/t) per class.

    Returns the class scores (M, C); the prediction is their argmax."""
    preds = []
    for q in queries.tolist():
        qn = math.sqrt(sum(v * v for v in q))
        sims = []
        for j, b in enumerate(bank.tolist()):
            bn = math.sqrt(sum(v * v for v in b))
            sims.append((sum(x * y for x, y in zip(q, b)) / (qn * bn), j))
        sims.sort(reverse=True)
        scores = [0.0] * num_classes
        for s, j in sims[:k]:
            scores[int(bank_labels[j])] += math.exp(s / t)
        preds.append(scores)
    return torch.tensor(preds, dtype=torch.float64)  # (M, C) class scores


@pytest.fixture
def clusters():
    g = torch.Generator().manual_seed(0)
    num_classes, d = 7, 16
    centres = torch.randn(num_classes, d, generator=g)
    bank_labels = torch.randint(0, num_classes, (300,), generator=g)
    bank = centres[bank_labels] + 1.5 * torch.randn(300, d, generator=g)
    q_labels = torch.randint(0, num_classes, (40,), generator=g)
    queries = centres[q_labels] + 1.5 * torch.randn(40, d, generator=g)
    return bank, bank_labels, queries, q_labels, num_classes


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("k,t", [(20, 0.1), (5, 0.5), (300, 0.07)])
def test_matches_brute_force(clusters, backend, k, t):
    bank, bank_labels, queries, _, c = clusters
    ref = reference_knn(bank, bank_labels, queries, k, t, c)
    # small chunks so that both the add and the search loops run several times
    knn = WeightedKNN(bank, bank_labels, num_classes=c, backend=backend, chunk_size=16)
    scores = knn.scores(queries, k=k, temperature=t)
    assert torch.allclose(scores.double(), ref, rtol=1e-4)
    got = knn.predict(queries, k=k, temperature=t, topk=2)
    assert torch.equal(got[:, 0], ref.argmax(dim=1))
    second = ref.topk(2, dim=1)
    has_second = second.values[:, 1] > 0  # a class with no neighbour ties at score 0
    assert torch.equal(got[has_second, 1], second.indices[has_second, 1])


def test_random_data_faiss_equals_torch_topk_exactly():
    g = torch.Generator().manual_seed(1)
    bank, queries = torch.randn(5000, 64, generator=g), torch.randn(500, 64, generator=g)
    labels = torch.randint(0, 10, (5000,), generator=g)
    a = knn_predict(bank, labels, queries, backend="faiss", chunk_size=128)
    b = knn_predict(bank, labels, queries, backend="torch", chunk_size=128)
    assert torch.equal(a[:, 0], b[:, 0])
    ref = reference_knn(bank[:800], labels[:800], queries[:30], 200, 0.1, 10)
    got = knn_predict(bank[:800], labels[:800], queries[:30], backend="faiss")
    assert torch.equal(got[:, 0], ref.argmax(dim=1))


def test_search_returns_true_neighbours(clusters):
    bank, bank_labels, queries, _, _ = clusters
    sims, idx = WeightedKNN(bank, bank_labels, chunk_size=50).search(queries, 10)
    bn = torch.nn.functional.normalize(bank, dim=1)
    qn = torch.nn.functional.normalize(queries, dim=1)
    full = qn @ bn.T
    assert torch.allclose(sims, full.gather(1, idx), atol=1e-5)
    assert torch.allclose(sims, full.topk(10, dim=1).values, atol=1e-5)


def test_float16_store_is_close(clusters):
    bank, bank_labels, queries, q_labels, c = clusters
    exact = knn_accuracy(bank, bank_labels, queries, q_labels, k=20)
    approx = knn_accuracy(bank, bank_labels, queries, q_labels, k=20, store="float16")
    assert abs(exact["top1"] - approx["top1"]) <= 5.0
    sims32, _ = WeightedKNN(bank, bank_labels).search(queries, 5)
    sims16, _ = WeightedKNN(bank, bank_labels, store="float16").search(queries, 5)
    assert torch.allclose(sims32, sims16, atol=5e-3)


def test_accuracy_on_separable_clusters():
    g = torch.Generator().manual_seed(2)
    centres = torch.eye(4) * 10
    labels = torch.arange(4).repeat(50)
    bank = centres[labels] + 0.1 * torch.randn(200, 4, generator=g)
    acc = knn_accuracy(bank, labels, bank[:20], labels[:20], k=10)
    assert acc == {"top1": 100.0, "top5": 100.0}


def test_a_one_class_bank_is_flagged(clusters, caplog):
    bank, bank_labels, queries, _, c = clusters
    one = bank_labels == 0
    with caplog.at_level("WARNING", logger="contrastive.eval.knn"):
        acc = knn_accuracy(bank[one], bank_labels[one], queries[:5], torch.zeros(5, dtype=torch.long), k=5)
    assert acc["top1"] == 100.0 and "bank of one class" in caplog.text  # the number alone would mislead


def test_k_larger_than_bank_is_clipped(clusters):
    bank, bank_labels, queries, _, c = clusters
    got = knn_predict(bank[:10], bank_labels[:10], queries, k=200, num_classes=c)
    ref = reference_knn(bank[:10], bank_labels[:10], queries, 10, 0.1, c)
    assert torch.equal(got[:, 0], ref.argmax(dim=1))


def test_topk_accuracy_by_hand():
    preds = torch.tensor([[0, 1, 2], [2, 0, 1], [1, 2, 0]])
    labels = torch.tensor([0, 0, 0])
    assert topk_accuracy(preds, labels, ks=(1, 2, 3)) == pytest.approx(
        {"top1": 100 / 3, "top2": 200 / 3, "top3": 100.0}
    )


def test_bad_input_is_a_clear_error(clusters):
    bank, bank_labels, queries, q_labels, _ = clusters
    with pytest.raises(ValueError, match="unlabelled"):
        WeightedKNN(bank, torch.full_like(bank_labels, -1))
    with pytest.raises(ValueError, match="num_classes=3"):
        WeightedKNN(bank, bank_labels, num_classes=3)
    with pytest.raises(ValueError, match="empty"):
        WeightedKNN(bank[:0], bank_labels[:0])
    with pytest.raises(ValueError, match="queries"):
        WeightedKNN(bank, bank_labels).search(queries[:, :3], 5)
    with pytest.raises(ValueError, match="do not share"):
        knn_accuracy(bank, bank_labels, queries, q_labels + 100)
    with pytest.raises(ValueError, match="float16"):
        WeightedKNN(bank, bank_labels, backend="torch", store="float16")


def test_torch_backend_bounds_its_similarity_chunks(clusters, monkeypatch):
    import contrastive.eval.knn as knn_module

    bank, bank_labels, queries, _, c = clusters
    full = WeightedKNN(bank, bank_labels, backend="torch").scores(queries, k=20)
    calls = []
    original = WeightedKNN._search_chunk

    def spy(self, q, k):
        calls.append(q.shape[0])
        return original(self, q, k)

    monkeypatch.setattr(knn_module, "_TORCH_SIM_ELEMENTS", 3 * 300)  # 3 query rows x 300 bank rows
    monkeypatch.setattr(WeightedKNN, "_search_chunk", spy)
    chunked = WeightedKNN(bank, bank_labels, backend="torch").scores(queries, k=20)
    assert max(calls) == 3 and sum(calls) == queries.shape[0]
    assert torch.allclose(chunked, full)


def test_torch_search_returns_faiss_neighbours():
    """The kNN monitor of a ``--resident`` run searches with torch on the device (the GPU machine
    has no faiss): the same 200 neighbours in the same order as faiss's exact search."""
    g = torch.Generator().manual_seed(2)
    bank, queries = torch.randn(3000, 128, generator=g), torch.randn(300, 128, generator=g)
    labels = torch.randint(0, 10, (3000,), generator=g)
    s_f, i_f = WeightedKNN(bank, labels, backend="faiss").search(queries, 200)
    s_t, i_t = WeightedKNN(bank, labels, backend="torch", chunk_size=64).search(queries, 200)
    i_t, s_t = i_t.cpu(), s_t.cpu()
    assert torch.allclose(s_f, s_t, atol=1e-6)
    # float32 dot products summed in another order: only neighbours whose similarities tie to
    # rounding (1e-6) may swap places; the sets agree (no tie sits at the 200th place here)
    rows, cols = (i_f != i_t).nonzero(as_tuple=True)
    assert len(rows) < 0.001 * i_f.numel()
    for r, c in zip(rows.tolist(), cols.tolist()):
        near = s_f[r, max(c - 1, 0):c + 2]
        assert (near - s_f[r, c]).abs().sort().values[1] < 1e-6  # a tie with a neighbour
    assert torch.equal(i_f.sort(1).values, i_t.sort(1).values)
