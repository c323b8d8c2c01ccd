"""Two real gloo CPU processes (per-process batch B, DDP) against one process with batch 2B.

One launch (case ``dist_case.py``) runs every check; the tests below read its results:
- SimCLR and MoCo v3, with two views and multi-crop (2 x 8 px + 2 x 4 px): loss and
  gradients equal the one-process ones (BN in eval mode), over
  two optimisation steps (the bug users of other libraries hit most: negatives gathered
  without gradient, or labels not offset by rank);
- MoCo and DenseCL with shuffle BN: the queues hold both processes' keys, losses and gradients
  match (and a DenseCL whose dense queue keeps only local keys does not);
- the helpers of ``contrastive.nn.distributed``: gather, gather_with_grad (forward and
  backward), batch_shuffle / batch_unshuffle, KeyQueue.enqueue from two processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

CASE = Path(__file__).with_name("dist_case.py")
B = 4


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_two_ranks):
    return run_two_ranks(CASE, tmp_path_factory.mktemp("dist"))




@pytest.mark.parametrize("name", ["simclr", "mocov3", "moco", "simclr_multicrop",
                                  "mocov3_multicrop", "densecl"])
def test_two_processes_equal_one_process(results, name, close_f64):
    ref = results[0]["reference"][name]
    per_rank = [r["distributed"][name] for r in results]
    assert ref["loss"][0].dtype == ref["params"][0].dtype == torch.float64  # see close_f64()
    for step in range(len(ref["loss"])):
        # DDP averages gradients: the 2-process objective is the mean of the local losses
        close_f64((per_rank[0]["loss"][step] + per_rank[1]["loss"][step]) / 2, ref["loss"][step])
        close_f64(
            (per_rank[0]["pos_acc"][step] + per_rank[1]["pos_acc"][step]) / 2, ref["pos_acc"][step]
        )
        for rank in range(2):
            for g, g_ref in zip(per_rank[rank]["grads"][step], ref["grads"][step]):
                close_f64(g, g_ref)
    for rank in range(2):
        for p, p_ref in zip(per_rank[rank]["params"], ref["params"]):
            close_f64(p, p_ref)


@pytest.mark.parametrize("name", ["moco", "densecl"])  # DenseCL: its dense queue
def test_moco_queue_holds_keys_of_both_processes(results, close_f64, name):
    ref = results[0]["reference"][name]["queue"]
    for r in results:
        close_f64(r["distributed"][name]["queue"], ref)  # rank 0's keys then rank 1's, per step


def test_densecl_with_a_process_local_dense_queue_differs(results):
    ref = results[0]["reference"]["densecl"]
    bad = results[0]["distributed"]["densecl_local_queue"]
    gap = max(float((p - q).abs().max()) for p, q in zip(bad["params"], ref["params"]))
    assert gap > 1e-6


def test_world_size_and_gather(results):
    for r in results:
        assert r["world_size"] == 2
        h = r["helpers"]
        assert torch.equal(h["gather"], torch.tensor([0.0] * 2 + [1.0] * 2)[:, None].expand(4, 3))
        assert torch.equal(
            h["gather_with_grad_value"], torch.tensor([1.0] * 2 + [2.0] * 2)[:, None].expand(4, 3)
        )


def test_gather_with_grad_sums_gradients_of_all_processes(results):
    w = torch.arange(12.0).view(4, 3)
    for rank, r in enumerate(results):
        # d/dx_rank of sum_r' (gathered * w_r'), with w_r' = (r' + 1) * w
        expected = (1 + 2) * w[rank * 2 : rank * 2 + 2]
        assert torch.equal(r["helpers"]["gather_with_grad_grad"], expected)


def test_batch_shuffle_is_a_global_permutation_and_unshuffle_restores(results):
    shuffled = results[0]["helpers"]["shuffled_all"]
    assert torch.equal(shuffled, results[1]["helpers"]["shuffled_all"])
    assert torch.equal(shuffled.flatten().sort().values, torch.arange(2.0 * B))
    for r in results:
        assert torch.equal(r["helpers"]["unshuffled"], r["helpers"]["local"])


def test_key_queue_enqueues_both_processes(results):
    e = torch.eye(3)
    for r in results:
        h = r["helpers"]
        assert torch.equal(h["queue_keys"][-4:], torch.stack([e[0], e[0], e[1], e[1]]))
        assert h["queue_labels"].tolist() == [0, 0, 1, 1, -1] and int(h["queue_ptr"]) == 4
