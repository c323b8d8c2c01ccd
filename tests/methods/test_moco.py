"""MoCo reproduces, number for number, the paper's pseudo-code (Algorithm 1) written plainly
here, with the same weights and inputs, over several optimisation steps.

The multi-step comparison runs in float64 (``STEP_TOL``): in float32 the two sides round
differently (sums in other orders), and four SGD steps at lr 0.5 grow those 1e-7 roundings
into differences that depend on the machine and its thread count."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.losses import get_loss
from contrastive.methods import MoCo

# float64: 1.1e-16 per operation, ~1e3 operations a step, four steps at lr 0.5 and a 0.2
# temperature amplify reorderings at most ~1e2 -> honest differences stay below ~1e-11 relative.
# rtol 1e-9 sits 100x above that and 1e6 below a real defect (a wrong momentum, queue order or
# temperature moves values by > 1e-3).
STEP_TOL = dict(rtol=1e-9, atol=1e-12)


def _paper_step(f_q, f_k, queue, x_q, x_k, m, t, opt, first_update=True):
    """One iteration of MoCo's Algorithm 1 (He et al. 2020), queue (K, C) oldest first.

    The official code applies the EMA at the start of the step (before computing keys), which
    equals Algorithm 1's end-of-step update of the previous iteration."""
    with torch.no_grad():
        for pk, pq in zip(f_k.parameters(), f_q.parameters()):
            pk.data = pk.data * m + pq.data * (1.0 - m)
    q = F.normalize(f_q(x_q), dim=1)  # N x C
    k = F.normalize(f_k(x_k), dim=1).detach()  # N x C
    n, c = q.shape
    l_pos = torch.bmm(q.view(n, 1, c), k.view(n, c, 1)).view(n, 1)
    l_neg = torch.mm(q, queue.T)  # N x K
    logits = torch.cat([l_pos, l_neg], dim=1)
    loss = nn.CrossEntropyLoss()(logits / t, torch.zeros(n, dtype=torch.long))
    opt.zero_grad()
    loss.backward()
    opt.step()
    stats = {
        "pos_acc": (logits.argmax(dim=1) == 0).float().mean() * 100,
        "pos_sim": l_pos.mean(),
        "neg_sim": l_neg.mean(),
    }
    return loss.detach(), q.detach(), k, stats


@pytest.mark.parametrize("version", [1, 2])
def test_moco_matches_paper_pseudo_code(tiny, version):
    torch.manual_seed(0)
    K, m, t, lr = 10, 0.9, 0.2, 0.5  # K not a multiple of the batch size 4
    method = MoCo(
        tiny(), version=version, dim=8, queue_size=K, momentum=m, temperature=t, mlp_hidden=16
    ).double()
    f_q = copy.deepcopy(nn.Sequential(method.encoder, method.head))
    f_k = copy.deepcopy(f_q)
    queue = method.queue.keys.clone()
    opt_ref = torch.optim.SGD(f_q.parameters(), lr=lr)
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=lr)
    assert len(opt.param_groups[0]["params"]) == len(list(f_q.parameters()))

    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x_q, x_k = (torch.randn(4, 3, 12, 12, generator=g, dtype=torch.float64) for _ in range(2))
        out = method({"views": [x_q, x_k], "momentum": m})
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        loss, q, k, stats = _paper_step(f_q, f_k, queue, x_q, x_k, m, t, opt_ref)
        queue = torch.cat([queue, k])[-K:]  # enqueue the newest N, dequeue the oldest

        assert out["loss"].dtype == torch.float64  # computed in float64 throughout
        torch.testing.assert_close(out["loss"].detach(), loss, **STEP_TOL)
        torch.testing.assert_close(out["embeddings"], q, **STEP_TOL)
        for name, value in stats.items():
            torch.testing.assert_close(out[name], value.to(out[name].dtype), **STEP_TOL)
        torch.testing.assert_close(method.queue.ordered_keys(), queue, **STEP_TOL)
    for a, b in zip([*method.encoder.parameters(), *method.head.parameters()], f_q.parameters()):
        torch.testing.assert_close(a, b, **STEP_TOL)
    for a, b in zip(method.key_net.parameters(), f_k.parameters()):
        torch.testing.assert_close(a, b, **STEP_TOL)
    for a, b in zip(method.key_net.buffers(), f_k.buffers()):  # BN stats from key forwards
        torch.testing.assert_close(a, b, **STEP_TOL)


def test_symmetric_moco_matches_demo_formula(tiny, views):
    """Symmetric loss of the MoCo CIFAR demo: L(q1, k2) + L(q2, k1), both key batches queued."""
    torch.manual_seed(0)
    method = MoCo(
        tiny(), version=1, dim=8, queue_size=16, momentum=0.5, temperature=0.1, symmetric=True
    )
    x1, x2 = views(4)
    net = nn.Sequential(copy.deepcopy(method.encoder), copy.deepcopy(method.head))
    key_net = copy.deepcopy(method.key_net.module)
    queue = method.queue.keys.clone()
    out = method({"views": [x1, x2], "momentum": 0.5})

    def ce(q, k):
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / 0.1
        return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))

    q1, q2 = F.normalize(net(x1), dim=1), F.normalize(net(x2), dim=1)
    with torch.no_grad():
        k1, k2 = F.normalize(key_net(x1), dim=1), F.normalize(key_net(x2), dim=1)
    torch.testing.assert_close(out["loss"], ce(q1, k2) + ce(q2, k1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(method.queue.ordered_keys()[-8:], torch.cat([k1, k2]))


def test_moco_presets_and_defaults(tiny):
    assert MoCo.presets["v1"]["temperature"] == 0.07 and MoCo.presets["v2"]["temperature"] == 0.2
    for preset in MoCo.presets.values():
        assert preset["queue_size"] in (65536, 4096) and preset["dim"] == 128
    v1 = MoCo(tiny(), version=1, queue_size=8)
    assert v1.temperature == 0.07 and isinstance(v1.head[0], nn.Linear) and len(v1.head) == 1
    v2 = MoCo.from_preset("v2", encoder=tiny(), queue_size=8)
    assert v2.temperature == 0.2 and len(v2.head) == 3 and v2.head[0].out_features == 2048
    assert v2.base_momentum == 0.999 and v2.queue.size == 8
    cifar = MoCo.from_preset("cifar", encoder=tiny(), queue_size=8)
    assert cifar.split_bn == 8 and cifar.temperature == 0.1 and cifar.base_momentum == 0.99
    assert type(v2.criterion) is type(get_loss("infonce"))
    assert not MoCo.uses_in_batch_negatives
    assert cifar.schedule_values(0, 10) == cifar.schedule_values(9, 10) == {"momentum": 0.99}
    with pytest.raises(ValueError, match="version"):
        MoCo(tiny(), version=3)
    with pytest.raises(KeyError, match="v2"):
        MoCo.from_preset("v9")


def test_key_encoder_gets_no_gradient_and_momentum_override(tiny, views):
    torch.manual_seed(0)
    method = MoCo(tiny(), dim=8, queue_size=8, mlp_hidden=8)
    assert all(not p.requires_grad for p in method.key_net.parameters())
    out = method(method.make_batch(views(4)))
    out["loss"].backward()
    assert all(p.grad is None for p in method.key_net.parameters())
    assert all(p.grad is not None for p in method.encoder.parameters())
    with torch.no_grad():
        for p in method.encoder.parameters():
            p.add_(1.0)
    method({"views": views(4, seed=1), "momentum": 0.0})  # m = 0: the key encoder becomes the query one
    for a, b in zip(method.key_net.module[0].parameters(), method.encoder.parameters()):
        torch.testing.assert_close(a, b)


def test_split_bn_and_local_shuffle(tiny, views):
    torch.manual_seed(0)
    method = MoCo(tiny(), dim=8, queue_size=8, mlp_hidden=8, split_bn=2)
    from contrastive.nn import SplitBatchNorm2d

    assert isinstance(method.encoder.body[1], SplitBatchNorm2d)
    assert isinstance(method.key_net.module[0].body[1], SplitBatchNorm2d)
    out = method(method.make_batch(views(4)))
    assert torch.isfinite(out["loss"])
    method.eval()  # per-sample outputs: the local shuffle must be undone exactly
    x = views(6)[0]
    torch.testing.assert_close(method._keys(x), F.normalize(method.key_net(x), dim=1))


def test_queue_labels(tiny, views):
    method = MoCo(tiny(), dim=8, queue_size=8, mlp_hidden=8, queue_labels=True)
    assert method.needs == ("views", "indices")
    method(method.make_batch(views(3), indices=torch.tensor([5, 6, 7])))
    assert method.queue.labels[:3].tolist() == [5, 6, 7]
