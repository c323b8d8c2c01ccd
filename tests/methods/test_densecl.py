"""DenseCL: the dense loss against its formula, the correspondence, optimiser steps against a
float64 transcription of the authors' ``DenseCL.forward_train`` (WXinlong/DenseCL), presets,
and the engine's refusal of gradient caching and accumulation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.grad_cache import GradCacheError, check_grad_cache
from contrastive.losses import get_loss
from contrastive.losses.dense import dense_correspondence
from contrastive.methods import DenseCL, MoCo

STEP_TOL = dict(rtol=1e-9, atol=1e-12)  # float64, as tests/methods/test_moco.py argues


class MapEncoder(nn.Module):
    """Two strided convs with BN; its one stage is a (N, 8, H/4, W/4) map."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4),
                                  nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU())
        self.num_features = 8

    def forward_stages(self, x):
        return [self.body(x)]

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


def test_dense_loss_matches_its_formula_by_hand():
    # one image, two query locations, two key locations, one queued negative; tau 0.5
    e0, e1 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    s = math.sqrt(0.5)
    query = torch.stack([e0, e1])[None]  # (1, 2, 2)
    key = torch.stack([torch.tensor([s, s]), e1])[None]
    match = torch.tensor([[0, 1]])  # location 0 -> key 0, location 1 -> key 1
    neg = torch.stack([-e0])
    # location 0: pos q.k = s, neg = -1; location 1: pos 1, neg 0
    l0 = -math.log(math.exp(s / 0.5) / (math.exp(s / 0.5) + math.exp(-1 / 0.5)))
    l1 = -math.log(math.exp(1 / 0.5) / (math.exp(1 / 0.5) + math.exp(0.0)))
    out = get_loss("densecl", temperature=0.5)(query, key, match, neg)
    torch.testing.assert_close(out, torch.tensor((l0 + l1) / 2))
    swapped = get_loss("densecl", temperature=0.5)(query, key, match.flip(1), neg)
    assert not torch.allclose(swapped, out)  # the match is what pairs them


def test_dense_loss_gradcheck_float64_with_a_queue():
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    neg = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    match = torch.randint(0, 4, (3, 4), generator=g)
    fn = get_loss("densecl", temperature=0.2, reduction="none")
    assert torch.autograd.gradcheck(lambda a, b, c: fn(a, b, match, c), (q, k, neg))


def test_correspondence_is_the_argmax_of_backbone_cosine():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 16, generator=g)
    perm = torch.stack([torch.randperm(5, generator=g) for _ in range(2)])
    # key location perm[n, s] holds query location s, scaled (cosine ignores the scale)
    k = torch.empty_like(q).scatter_(1, perm[..., None].expand(-1, -1, 16), q * 0.1)
    # a distractor with the largest dot product but a worse cosine: must not be chosen
    k = torch.cat([k, 100 * (q[:, :1] + 0.8 * torch.randn(2, 1, 16, generator=g))], dim=1)
    torch.testing.assert_close(dense_correspondence(q, k), perm)


def _authors_step(enc_q, enc_k, neck_q, neck_k, queue, queue2, x_q, x_k, m, t, lam, opt):
    """The code's ``forward_train`` (one process: no shuffle) and a step; queues (C, K)."""
    with torch.no_grad():
        for pq, pk in zip([*enc_q.parameters(), *neck_q.parameters()],
                          [*enc_k.parameters(), *neck_k.parameters()]):
            pk.data = pk.data * m + pq.data * (1. - m)

    def neck(parts, x):  # DenseCLNeck.forward, num_grid=None
        mlp, mlp2 = parts
        pooled = mlp(F.adaptive_avg_pool2d(x, 1).flatten(1))
        x = mlp2(x)
        return pooled, x.view(x.size(0), x.size(1), -1), F.adaptive_avg_pool2d(x, 1).flatten(1)

    q_b = enc_q.forward_stages(x_q)[-1]
    q, q_grid, _ = neck(neck_q, q_b)
    q_b = F.normalize(q_b.view(q_b.size(0), q_b.size(1), -1), dim=1)
    q, q_grid = F.normalize(q, dim=1), F.normalize(q_grid, dim=1)
    with torch.no_grad():
        k_b = enc_k.forward_stages(x_k)[-1]
        k, k_grid, k2 = neck(neck_k, k_b)
        k_b = F.normalize(k_b.view(k_b.size(0), k_b.size(1), -1), dim=1)
        k, k2, k_grid = F.normalize(k, dim=1), F.normalize(k2, dim=1), F.normalize(k_grid, dim=1)
    l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
    l_neg = torch.einsum("nc,ck->nk", [q, queue.clone().detach()])
    ind = torch.matmul(q_b.permute(0, 2, 1), k_b).max(dim=2)[1]
    indexed = torch.gather(k_grid, 2, ind.unsqueeze(1).expand(-1, k_grid.size(1), -1))
    l_pos_dense = (q_grid * indexed).sum(1).view(-1).unsqueeze(-1)
    q_grid = q_grid.permute(0, 2, 1).reshape(-1, q_grid.size(1))
    l_neg_dense = torch.einsum("nc,ck->nk", [q_grid, queue2.clone().detach()])

    def head(pos, neg):  # ContrastiveHead: cross-entropy, target 0
        logits = torch.cat([pos, neg], dim=1) / t
        return F.cross_entropy(logits, torch.zeros(logits.size(0), dtype=torch.long))

    loss = head(l_pos, l_neg) * (1 - lam) + head(l_pos_dense, l_neg_dense) * lam
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach(), k, k2


def test_steps_match_a_transcription_of_the_authors_forward(views):
    torch.manual_seed(0)
    K, m, t, lam, lr = 10, 0.9, 0.2, 0.5, 0.5  # K not a multiple of the batch size 4
    method = DenseCL(MapEncoder(), dim=6, mlp_hidden=12, queue_size=K, momentum=m,
                     temperature=t, dense_weight=lam, shuffle_bn=False).double()
    enc_q = copy.deepcopy(method.encoder)
    neck_q = copy.deepcopy(nn.ModuleList([method.head, method.dense_head]))
    enc_k, neck_k = copy.deepcopy(enc_q), copy.deepcopy(neck_q)
    queue, queue2 = method.queue.keys.clone(), method.dense_queue.keys.clone()
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=lr)
    opt_ref = torch.optim.SGD([*enc_q.parameters(), *neck_q.parameters()], lr=lr)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x_q, x_k = (torch.randn(4, 3, 12, 12, generator=g, dtype=torch.float64) for _ in range(2))
        out = method({"views": [x_q, x_k], "momentum": m})
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        loss, k, k2 = _authors_step(enc_q, enc_k, neck_q, neck_k, queue.T, queue2.T, x_q, x_k,
                                    m, t, lam, opt_ref)
        queue, queue2 = torch.cat([queue, k])[-K:], torch.cat([queue2, k2])[-K:]
        torch.testing.assert_close(out["loss"].detach(), loss, **STEP_TOL)
        torch.testing.assert_close(method.queue.ordered_keys(), queue, **STEP_TOL)
        torch.testing.assert_close(method.dense_queue.ordered_keys(), queue2, **STEP_TOL)
    ours = [*method.encoder.parameters(), *method.head.parameters(),
            *method.dense_head.parameters()]
    for a, b in zip(ours, [*enc_q.parameters(), *neck_q.parameters()], strict=True):
        torch.testing.assert_close(a, b, **STEP_TOL)
    for a, b in zip(method.key_net.parameters(), [*enc_k.parameters(), *neck_k.parameters()],
                    strict=True):
        torch.testing.assert_close(a, b, **STEP_TOL)


def test_zero_dense_weight_is_moco_v2(views):
    x1, x2 = views(n=4, size=12)
    torch.manual_seed(0)
    dense = DenseCL(MapEncoder(), dim=6, mlp_hidden=12, queue_size=8, dense_weight=0.0,
                    shuffle_bn=False)
    torch.manual_seed(0)
    moco = MoCo(MapEncoder(), version=2, dim=6, mlp_hidden=12, queue_size=8, temperature=0.2,
                shuffle_bn=False)
    moco.queue.load_state_dict(dense.queue.state_dict())
    batch = {"views": [x1, x2], "momentum": 0.9}
    torch.testing.assert_close(dense(batch)["loss"], moco(batch)["loss"])


def test_grid_pools_the_map_and_bad_settings_raise(views):
    x1, x2 = views(n=4, size=16)  # 4 x 4 map
    method = DenseCL(MapEncoder(), dim=6, mlp_hidden=12, queue_size=8, grid=2, shuffle_bn=False)
    _, dense, feats = method._outputs([method.encoder, method.head, method.dense_head], x1)
    assert dense.shape == (4, 4, 6) and feats.shape == (4, 4, 8)
    assert torch.isfinite(method({"views": [x1, x2], "momentum": 0.9})["loss"])
    with pytest.raises(ValueError, match="dense_weight"):
        DenseCL(MapEncoder(), dense_weight=1.5)
    with pytest.raises(ValueError, match="grid"):
        DenseCL(MapEncoder(), grid=-1)


def test_presets_are_the_authors_imagenet_setting():
    p = DenseCL.presets["r50"]
    assert (p["queue_size"], p["momentum"], p["temperature"], p["dense_weight"], p["dim"],
            p["mlp_hidden"], p["grid"]) == (65536, 0.999, 0.2, 0.5, 128, 2048, 0)


def test_engine_refuses_grad_cache_and_accumulation():
    method = DenseCL(MapEncoder(), dim=6, mlp_hidden=12, queue_size=8)
    with pytest.raises(GradCacheError, match="--grad-accum-steps 2 with DenseCL: each micro"):
        check_grad_cache(method, 0, 2)
    with pytest.raises(GradCacheError, match="no backbone the engine can cache"):
        check_grad_cache(method, 2, 1)
    assert check_grad_cache(method, 0, 1) == "plain"
