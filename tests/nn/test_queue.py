"""KeyQueue: FIFO ring buffer with any batch size, labels, state-dict round trip, and the
deferred write that lets a step use the bank without cloning it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from contrastive.nn import KeyQueue


def _reference_ring(size: int, dim: int, initial: torch.Tensor, batches):
    """Plain FIFO written row by row: returns the bank, the write position, labels."""
    bank = initial.clone()
    labels = [-1] * size
    pos = 0
    for keys, labs in batches:
        for i in range(keys.shape[0]):
            bank[pos] = keys[i]
            labels[pos] = int(labs[i]) if labs is not None else -1
            pos = (pos + 1) % size
    return bank, pos, torch.tensor(labels)


@pytest.mark.parametrize("sizes", [[3, 3, 3, 3], [4, 7, 2, 9, 5], [13], [25, 1]])
def test_fifo_with_batch_sizes_that_do_not_divide_k(sizes):
    torch.manual_seed(0)
    K, D = 10, 4
    q = KeyQueue(D, K, store_labels=True)
    initial = q.queue.clone()
    batches = []
    start = 0
    for n in sizes:
        keys = F.normalize(torch.randn(n, D), dim=1)
        labels = torch.arange(start, start + n)
        start += n
        batches.append((keys, labels))
        q.enqueue(keys, labels)
    bank, pos, labels = _reference_ring(K, D, initial, batches)
    torch.testing.assert_close(q.keys, bank)
    assert int(q.ptr) == pos and q.ptr.dtype == torch.long and q.ptr.dim() == 0
    assert torch.equal(q.labels, labels)
    # oldest -> newest are the last K keys enqueued (or initial ones before them)
    all_keys = torch.cat([initial] + [k for k, _ in batches])
    torch.testing.assert_close(q.ordered_keys(), all_keys[-K:])


def test_keys_are_normalised_and_cast():
    q = KeyQueue(3, 5)
    q.enqueue(torch.tensor([[3.0, 4.0, 0.0]], dtype=torch.bfloat16))
    assert q.keys.dtype == torch.float32
    torch.testing.assert_close(q.keys[0], torch.tensor([0.6, 0.8, 0.0]), atol=1e-2, rtol=0)
    torch.testing.assert_close(q.keys.norm(dim=1), torch.ones(5))


def test_state_dict_round_trip_includes_pending_keys():
    torch.manual_seed(0)
    q = KeyQueue(4, 6, store_labels=True)
    q.enqueue(torch.randn(4, 4), torch.arange(4))
    q.enqueue(torch.randn(5, 4), torch.arange(5))  # still pending when state_dict is taken
    sd = q.state_dict()
    assert set(sd) == {"queue", "ptr", "key_labels"}
    assert int(sd["ptr"]) == 3
    r = KeyQueue(4, 6, store_labels=True)
    r.enqueue(torch.randn(2, 4), torch.arange(2))  # pending keys of r are dropped on load
    r.load_state_dict(sd)
    assert torch.equal(r.keys, q.keys) and torch.equal(r.ptr, q.ptr)
    assert torch.equal(r.labels, q.labels)
    # both continue identically
    k = torch.randn(2, 4)
    q.enqueue(k, torch.tensor([7, 8]))
    r.enqueue(k, torch.tensor([7, 8]))
    assert torch.equal(r.keys, q.keys) and torch.equal(r.ptr, q.ptr)


def test_step_uses_bank_without_clone_and_gradient_is_exact():
    """A MoCo step: logits against the bank, enqueue, then backward. The gradient must be the
    one of the bank BEFORE the enqueue (reference: a clone of the bank)."""
    torch.manual_seed(0)
    q = KeyQueue(8, 12)
    bank_before = q.keys.clone()
    query = torch.randn(5, 8, requires_grad=True)
    loss = torch.logsumexp(query @ q.keys.T, dim=1).sum()
    q.enqueue(torch.randn(5, 8))  # before backward, as the methods do
    loss.backward()
    ref_query = query.detach().clone().requires_grad_(True)
    torch.logsumexp(ref_query @ bank_before.T, dim=1).sum().backward()
    torch.testing.assert_close(query.grad, ref_query.grad)
    assert not torch.equal(q.keys, bank_before)  # and the keys did land


def test_enqueue_argument_errors():
    q = KeyQueue(4, 6)
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        q.enqueue(torch.randn(3, 5))
    with pytest.raises(ValueError, match="store_labels"):
        q.enqueue(torch.randn(3, 4), torch.arange(3))
    with pytest.raises(RuntimeError, match="store_labels"):
        q.labels  # noqa: B018
    ql = KeyQueue(4, 6, store_labels=True)
    with pytest.raises(ValueError, match="store_labels"):
        ql.enqueue(torch.randn(3, 4))
    with pytest.raises(ValueError, match="labels must be"):
        ql.enqueue(torch.randn(3, 4), torch.arange(2))
    with pytest.raises(ValueError, match="size"):
        KeyQueue(4, 0)
