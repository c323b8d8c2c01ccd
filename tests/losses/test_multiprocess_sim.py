"""Multi-process designs, checked in one process by simulating the ranks.

Rank r holds rows [r * n, (r + 1) * n) of the global batch. It computes its local loss against
the tensors gathered from every rank (here: the full tensors themselves, so the gradients reach
every rank's rows as a gather-with-gradient does). DDP averages the gradients over the ranks, so
the objective is the mean of the per-rank losses; it must equal the one-process loss on the whole
batch, value and gradients.
"""

from __future__ import annotations

import pytest
import torch

from contrastive.losses import functional as LF
from contrastive.losses import get_loss


def leaves(*shapes: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


def grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fn", [LF.ntxent, LF.dcl], ids=["ntxent", "dcl"])
def test_two_view_losses_over_simulated_ranks_equal_one_process(fn, world):
    total, dim, tau = 8, 5, 0.3
    z1, z2 = leaves((total, dim), (total, dim), seed=world)
    single = fn(z1, z2, temperature=tau)
    n = total // world
    per_rank = [
        fn(
            z1[r * n : (r + 1) * n],
            z2[r * n : (r + 1) * n],
            z1_all=z1,
            z2_all=z2,
            positive_offset=r * n,
            temperature=tau,
        )
        for r in range(world)
    ]
    multi = torch.stack(per_rank).mean()
    torch.testing.assert_close(multi, single)
    for g_multi, g_single in zip(grads(multi, [z1, z2]), grads(single, [z1, z2])):
        torch.testing.assert_close(g_multi, g_single)


def test_ntxent_without_gathering_is_not_the_one_process_loss():
    """The check above can fail: local-only negatives (the silent multi-GPU bug) differ."""
    z1, z2 = leaves((8, 5), (8, 5), seed=0)
    single = LF.ntxent(z1, z2)
    local_only = torch.stack([LF.ntxent(z1[:4], z2[:4]), LF.ntxent(z1[4:], z2[4:])]).mean()
    assert not torch.allclose(local_only, single)


def test_ntxent_per_anchor_values_of_each_rank_are_rows_of_the_global_ones():
    z1, z2 = leaves((6, 4), (6, 4), seed=1)
    full = LF.ntxent(z1, z2, reduction="none")
    for r in range(3):
        rows = slice(2 * r, 2 * r + 2)
        local = LF.ntxent(
            z1[rows], z2[rows], z1_all=z1, z2_all=z2, positive_offset=2 * r, reduction="none"
        )
        torch.testing.assert_close(local, full[rows])


@pytest.mark.parametrize("world", [2, 3])
def test_infonce_positive_offset_over_simulated_ranks_equals_one_process(world):
    """MoCo v3: local queries against keys gathered from all ranks, labels arange(n) + n * rank."""
    total, dim, tau = 6, 4, 0.2
    q, k = leaves((total, dim), (total, dim), seed=10 + world)
    single = LF.infonce(q, k, temperature=tau)
    n = total // world
    loss_fn = get_loss("infonce", temperature=tau)
    multi = torch.stack(
        [loss_fn(q[r * n : (r + 1) * n], k, positive_offset=r * n) for r in range(world)]
    ).mean()
    torch.testing.assert_close(multi, single)
    for g_multi, g_single in zip(grads(multi, [q, k]), grads(single, [q, k])):
        torch.testing.assert_close(g_multi, g_single)


def test_mocov3_symmetrised_loss_composes_two_infonce_calls():
    """ctr(q1, k2) + ctr(q2, k1), each times 2 * tau, over 2 simulated ranks == 1 process."""
    q1, q2, k1, k2 = leaves(*[(4, 3)] * 4, seed=20)
    tau = 0.2

    def ctr(q, k, offset=0):
        return LF.infonce(q, k.detach(), temperature=tau, positive_offset=offset) * 2 * tau

    single = ctr(q1, k2) + ctr(q2, k1)
    multi = torch.stack(
        [
            ctr(q1[2 * r : 2 * r + 2], k2, 2 * r) + ctr(q2[2 * r : 2 * r + 2], k1, 2 * r)
            for r in range(2)
        ]
    ).mean()
    torch.testing.assert_close(multi, single)
    for g_multi, g_single in zip(grads(multi, [q1, q2]), grads(single, [q1, q2])):
        torch.testing.assert_close(g_multi, g_single)
