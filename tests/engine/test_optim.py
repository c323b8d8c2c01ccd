"""Optimisers: parameter groups and one LARS step against a hand-written update."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from contrastive.engine.optim import (
    build_optimizer,
    fused_by_default,
    optimizer_kernel,
    param_groups,
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4, 2))


def test_groups_exclude_bias_and_norm_and_frozen():
    net = _net()
    net[0].bias.requires_grad_(False)  # frozen -> in no group
    groups = {g["name"]: g for g in param_groups(net, 1e-4)}
    decay_ids = {id(p) for p in groups["decay"]["params"]}
    no_decay_ids = {id(p) for p in groups["no_decay"]["params"]}
    assert decay_ids == {id(net[0].weight), id(net[3].weight)}
    assert no_decay_ids == {id(net[1].weight), id(net[1].bias), id(net[3].bias)}
    assert groups["no_decay"]["weight_decay"] == 0.0
    assert groups["decay"]["weight_decay"] == 1e-4
    kept = {g["name"]: g["weight_decay"] for g in param_groups(net, 1e-4, exclude_from_wd=False)}
    assert kept == {"decay": 1e-4, "no_decay": 1e-4}


def test_sgd_norm_params_get_no_weight_decay():
    net = _net()
    opt = build_optimizer(net, "sgd", lr=0.1, weight_decay=0.5, momentum=0.0)
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    w0, g0 = net[0].weight.detach().clone(), net[1].weight.detach().clone()
    opt.step()
    assert torch.allclose(net[0].weight, w0 * (1 - 0.1 * 0.5))  # decayed
    assert torch.equal(net[1].weight, g0)  # BN gamma untouched


def _reference_lars_step(p, grad, buf, lr, wd, momentum, eta, adapt):
    # LARS (You et al. 2017) as in the official MoCo v3 moco/optimizer.py, written plainly
    d = grad.clone()
    if adapt:
        d = d + wd * p
        pn, dn = p.norm(), d.norm()
        if pn > 0 and dn > 0:
            d = d * (eta * pn / dn)
    buf = d if buf is None else buf * momentum + d
    return p - lr * buf, buf


@pytest.mark.parametrize("wd", [1e-6, 0.0])
def test_lars_two_steps_match_reference(wd):
    # float64: LARS's norms and the reference's sum in other orders; in float64 the two steps
    # agree to ~1e-15 relative, so rtol 1e-10 holds anywhere and catches a wrong trust ratio,
    # decay or momentum (> 1e-4). In float32 the old rtol 1e-5 / atol 1e-7 sat near the noise.
    net = _net().double()
    opt = build_optimizer(net, "lars", lr=0.3, weight_decay=wd, momentum=0.9, trust_coeff=0.001)
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    bufs: dict[str, torch.Tensor | None] = {n: None for n in params}
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        grads = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64)
                 for n, p in net.named_parameters()}
        for n, p in net.named_parameters():
            p.grad = grads[n].clone()
        opt.step()
        for n in params:
            adapt = params[n].ndim > 1  # biases / BN never adapted, not even at wd 0
            params[n], bufs[n] = _reference_lars_step(params[n], grads[n], bufs[n], 0.3,
                                                      wd if adapt else 0.0, 0.9, 0.001, adapt)
    for n, p in net.named_parameters():
        assert p.dtype == torch.float64
        torch.testing.assert_close(p.detach(), params[n], rtol=1e-10, atol=1e-13, msg=n)


def test_lars_decays_biases_without_adapting_them_when_asked():
    # exclude_from_wd=False (as the official MoCo v1/v2 recipes decay every parameter): biases
    # and norm parameters take plain decayed SGD, w - lr (g + wd w), never the trust ratio
    net = _net().double()
    opt = build_optimizer(net, "lars", lr=0.3, weight_decay=0.1, momentum=0.9,
                          exclude_from_wd=False)
    bias = net[3].bias
    before = bias.detach().clone()
    bias.grad = torch.full_like(bias, 0.5)
    for p in net.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(bias.detach(), before - 0.3 * (0.5 + 0.1 * before),
                               rtol=1e-12, atol=1e-14)


def test_adamw_and_errors():
    net = _net()
    opt = build_optimizer(net, "adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.95)
    with pytest.raises(ValueError, match="optimizer must be"):
        build_optimizer(net, "adam", lr=1e-3, weight_decay=0.0)
    with pytest.raises(ValueError, match="trust_coeff"):
        build_optimizer(net, "lars", lr=1.0, weight_decay=0.0, trust_coeff=0.0)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(frozen, "sgd", lr=0.1, weight_decay=0.0)


def test_fused_kernel_by_default_for_sgd_and_adamw_on_cpu_and_cuda_only():
    assert fused_by_default("sgd", "cpu") and fused_by_default("AdamW", "cuda")
    assert not fused_by_default("lars", "cpu") and not fused_by_default("adamw", "mps")
    net = _net()
    kernels = {n: optimizer_kernel(build_optimizer(net, n, lr=0.1, weight_decay=0.1))
               for n in ("sgd", "adamw", "lars")}
    assert kernels == {"sgd": "fused", "adamw": "fused", "lars": "for-loop"}
    loop = build_optimizer(net, "adamw", lr=0.1, weight_decay=0.1, fused=False)
    assert optimizer_kernel(loop) == "for-loop" and not loop.defaults["fused"]
    assert optimizer_kernel(build_optimizer(net, "sgd", lr=0.1, weight_decay=0.1,
                                            device_type="mps")) == "for-loop"
    with pytest.raises(ValueError, match="lars has no fused kernel"):
        build_optimizer(net, "lars", lr=0.1, weight_decay=0.1, fused=True)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_steps_equal_the_loop_up_to_float64_rounding(name):
    """Six steps of the engine's groups (decay / no decay, Nesterov momentum or AdamW's betas):
    the fused kernel and torch's loop compute the same update. SGD in float64 differs only by
    rounding (1.1e-16 per operation, a few dozen a step, six steps: < 1e-13 relative). The CPU
    AdamW kernel takes its step's scalars (bias corrections, step size) at float32 precision:
    each update is then exact to ~1.2e-7 relative, and an update is at most ~lr = 0.05, so six
    steps stay within 6 x 0.05 x 1.2e-7 = 3.6e-8 (measured 1.6e-10). A wrong weight decay,
    momentum or bias correction moves a weight by > 1e-4 at once."""
    nets, opts = [], []
    for fused in (True, False):
        net = _net().double()
        nets.append(net)
        opts.append(build_optimizer(net, name, lr=0.05, weight_decay=0.1, nesterov=True,
                                    betas=(0.8, 0.95), fused=fused))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, 3, 4, 4, generator=g, dtype=torch.float64)
    for step in range(6):
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            net(x[step]).square().mean().backward()
            opt.step()
    assert [optimizer_kernel(o) for o in opts] == ["fused", "for-loop"]
    tol = dict(rtol=1e-13, atol=1e-15) if name == "sgd" else dict(rtol=0.0, atol=4e-8)
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b, **tol)
    moved = max(float((a - b).detach().abs().max())
                for a, b in zip(nets[0].parameters(), _net().double().parameters()))
    assert moved > 1e-3  # the steps really moved the weights


class _Declared(nn.Module):
    """A backbone, a head with no weight decay at all, a predictor with a fixed lr, and
    prototypes frozen for 2 steps (a method's declared ParamGroups)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 4)
        self.predictor = nn.Linear(4, 4)
        self.prototypes = nn.Linear(4, 3, bias=False)

    def param_groups(self):
        from contrastive.methods import ParamGroup

        return [ParamGroup("head", list(self.head.parameters()), weight_decay=0.0),
                ParamGroup("predictor", list(self.predictor.parameters()), lr=0.05),
                ParamGroup("prototypes", list(self.prototypes.parameters()), frozen_steps=2)]

    def forward(self, x):
        h = self.body(x)
        return (self.head(h).pow(2).sum() + self.predictor(h).pow(2).sum()
                + self.prototypes(h).pow(2).sum())


@pytest.mark.parametrize("name", ["sgd", "adamw", "lars"])
def test_declared_groups_weight_decay_fixed_lr_and_frozen_steps(name):
    """Each kind of declared group against the same optimiser built by hand on the rest: the
    head never decays, the predictor keeps lr 0.05 while the schedule moves, the prototypes do
    not move (nor gather optimiser state) for their first 2 steps."""
    from contrastive.engine.optim import hold_frozen_groups, set_lr

    net = _Declared()
    opt = build_optimizer(net, name, lr=0.1, weight_decay=0.5, momentum=0.9)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"decay", "no_decay", "head", "head_no_decay", "predictor",
                           "predictor_no_decay", "prototypes"}
    assert {id(p) for p in groups["decay"]["params"]} == {id(net.body.weight)}
    assert groups["head"]["weight_decay"] == groups["head_no_decay"]["weight_decay"] == 0.0
    assert groups["predictor"]["weight_decay"] == 0.5 and groups["prototypes"]["weight_decay"] == 0.5
    x = torch.randn(5, 4)
    protos = [net.prototypes.weight.detach().clone()]
    for step, lr in enumerate([0.1, 0.07, 0.03, 0.01]):
        set_lr(opt, lr)
        assert groups["predictor"]["lr"] == groups["predictor_no_decay"]["lr"] == 0.05
        assert groups["decay"]["lr"] == groups["head"]["lr"] == lr
        opt.zero_grad()
        net(x).backward()
        hold_frozen_groups(opt, step)
        assert (net.prototypes.weight.grad is None) == (step < 2)
        opt.step()
        protos.append(net.prototypes.weight.detach().clone())
        if step < 2:
            assert net.prototypes.weight not in opt.state or not opt.state[net.prototypes.weight]
    assert torch.equal(protos[0], protos[1]) and torch.equal(protos[1], protos[2])
    assert not torch.equal(protos[2], protos[3])


def test_head_without_weight_decay_matches_plain_sgd():
    """The no-decay group is SGD at weight decay 0 (one step, by hand)."""
    net = _Declared()
    before = net.head.weight.detach().clone()
    opt = build_optimizer(net, "sgd", lr=0.1, weight_decay=0.5, momentum=0.0)
    net(torch.ones(2, 4)).backward()
    grad = net.head.weight.grad.clone()
    opt.step()
    torch.testing.assert_close(net.head.weight.detach(), before - 0.1 * grad)


def test_a_parameter_in_two_declared_groups_is_an_error():
    from contrastive.methods import ParamGroup

    net = _Declared()
    net.param_groups = lambda: [ParamGroup("a", [net.head.weight]),
                                ParamGroup("b", [net.head.weight])]
    with pytest.raises(ValueError, match="two declared groups"):
        build_optimizer(net, "sgd", lr=0.1, weight_decay=0.0)
    with pytest.raises(ValueError, match="frozen_steps"):
        ParamGroup("c", [net.head.weight], frozen_steps=-1)


@pytest.mark.parametrize("name", ["sgd", "lars"])
def test_lr_scale_group_follows_the_schedule_times_its_scale(name):
    """Barlow Twins' separate bias lr: 1-d parameters declared with ``lr_scale`` s move by
    exactly s times what they move at the scheduled lr, and every parameter matches the update
    written plainly (torch SGD / the official LARS: biases neither decayed nor adapted), over 3
    steps of a changing lr with momentum. float64 with fixed gradients: the runs differ only by
    the rounding of a few products (~1e-16 relative), so rtol 1e-12 holds and a wrong lr (the
    unscaled one differs by 1 / s = 40x) fails."""
    from contrastive.engine.optim import set_lr
    from contrastive.methods import ParamGroup

    scale, wd, momentum, lrs = 0.024, 1e-3, 0.9, [0.1, 0.07, 0.03]
    gen = torch.Generator().manual_seed(3)
    grads = [{n: torch.randn(p.shape, generator=gen, dtype=torch.float64)
              for n, p in _net().named_parameters()} for _ in lrs]

    def train(s: float) -> tuple[nn.Module, torch.optim.Optimizer]:
        net = _net().double()
        ones = [p for p in net.parameters() if p.ndim <= 1]
        net.param_groups = lambda: [ParamGroup("biases_norms", ones, lr_scale=s)] if s != 1 \
            else []
        opt = build_optimizer(net, name, lr=lrs[0], weight_decay=wd, momentum=momentum)
        for step, lr in enumerate(lrs):
            set_lr(opt, lr)
            for n, p in net.named_parameters():
                p.grad = grads[step][n].clone()
            opt.step()
        return net, opt

    net0 = _net().double()
    scaled, opt = train(scale)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["biases_norms_no_decay"]["lr"] == pytest.approx(scale * lrs[-1], rel=1e-15)
    assert groups["decay"]["lr"] == lrs[-1]
    plain, _ = train(1.0)
    before = dict(net0.named_parameters())
    for n, p in scaled.named_parameters():
        moved, moved_plain = p.detach() - before[n].detach(), \
            dict(plain.named_parameters())[n].detach() - before[n].detach()
        expect = scale * moved_plain if p.ndim <= 1 else moved_plain
        torch.testing.assert_close(moved, expect, rtol=1e-12, atol=1e-15, msg=n)
        # the same, written plainly: momentum SGD (LARS-adapted for the weights)
        ref, buf = before[n].detach().clone(), None
        for step, lr in enumerate(lrs):
            g = grads[step][n]
            if p.ndim <= 1:
                ref, buf = _reference_lars_step(ref, g, buf, lr * scale, 0.0, momentum, 0.001,
                                                adapt=False)
            elif name == "lars":
                ref, buf = _reference_lars_step(ref, g, buf, lr, wd, momentum, 0.001, adapt=True)
            else:
                d = g + wd * ref
                buf = d if buf is None else momentum * buf + d
                ref = ref - lr * buf
        torch.testing.assert_close(p.detach(), ref, rtol=1e-12, atol=1e-15, msg=n)


def test_lr_scale_is_applied_from_the_first_step_and_checked():
    """The group's lr is scaled as soon as the optimiser is built (before any set_lr); a
    negative scale, or a scale with a fixed lr, is an error that names the group."""
    from contrastive.methods import ParamGroup

    net = _Declared()
    net.param_groups = lambda: [ParamGroup("head", list(net.head.parameters()), lr_scale=0.5)]
    opt = build_optimizer(net, "sgd", lr=0.2, weight_decay=0.0)
    assert {g["name"]: g["lr"] for g in opt.param_groups} == {
        "decay": 0.2, "no_decay": 0.2, "head": 0.1, "head_no_decay": 0.1}
    with pytest.raises(ValueError, match="'b'.*lr_scale must be >= 0"):
        ParamGroup("b", [net.head.weight], lr_scale=-1.0)
    with pytest.raises(ValueError, match="'c'.*not both"):
        ParamGroup("c", [net.head.weight], lr=0.1, lr_scale=0.5)


def _adamw_by_hand(p: torch.Tensor, grads: list[torch.Tensor], lrs: list[float], wd: float,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.Tensor:
    """AdamW (Loshchilov & Hutter; torch's update) written out: decay p *= 1 - lr wd, moments,
    bias corrections by the step count t (which counts every step, lr 0 or not)."""
    b1, b2 = betas
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        p = p * (1 - lr * wd)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
    return p


@pytest.mark.parametrize("frozen_by", ["lr", "grad"])
def test_frozen_by_lr_moves_adamws_moments_frozen_by_grad_does_not(frozen_by):
    """DINOv2's last layer (lr 0 for its first steps, ``last_layer_lr_schedule``) against DINO's
    (gradients dropped, ``cancel_gradients_last_layer``), 3 AdamW steps in float64 with weight
    decay, frozen for 2: both stay still for 2 steps; then "lr" moves as AdamW's third step
    (moments over all 3 gradients, bias corrections at t = 3) and "grad" as its first step on
    the third gradient alone (the state was never made), each to the update written out; the
    other parameters are the plain AdamW in both. set_lr gives the frozen group its lr back."""
    from contrastive.engine.optim import hold_frozen_groups, set_lr
    from contrastive.methods import ParamGroup

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 2, bias=False)).double()
    before = [p.detach().clone() for p in net.parameters()]
    net.param_groups = lambda: [ParamGroup("last", [net[1].weight], frozen_steps=2,
                                           frozen_by=frozen_by)]
    wd, lrs = 0.3, [0.1, 0.07, 0.05]
    opt = build_optimizer(net, "adamw", lr=lrs[0], weight_decay=wd)
    last = next(g for g in opt.param_groups if g["name"] == "last")
    assert last.get("frozen_by_lr", False) == (frozen_by == "lr")
    gen = torch.Generator().manual_seed(1)
    grads = [[torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in net.parameters()]
             for _ in lrs]
    for step, lr in enumerate(lrs):
        set_lr(opt, lr)
        assert last["lr"] == lr  # given back after the frozen steps' 0
        for p, g in zip(net.parameters(), grads[step]):
            p.grad = g.clone()
        hold_frozen_groups(opt, step)
        assert (net[1].weight.grad is None) == (frozen_by == "grad" and step < 2)
        assert last["lr"] == (0.0 if frozen_by == "lr" and step < 2 else lr)
        opt.step()
        if step < 2:
            assert torch.equal(net[1].weight.detach(), before[1])
            assert bool(opt.state[net[1].weight]) == (frozen_by == "lr")
    first = _adamw_by_hand(before[0], [g[0] for g in grads], lrs, wd)
    torch.testing.assert_close(net[0].weight.detach(), first, rtol=1e-12, atol=0)
    if frozen_by == "lr":
        want = _adamw_by_hand(before[1], [g[1] for g in grads], [0.0, 0.0, lrs[2]], wd)
    else:
        want = _adamw_by_hand(before[1], [grads[2][1]], [lrs[2]], wd)
    torch.testing.assert_close(net[1].weight.detach(), want, rtol=1e-12, atol=0)
    other = _adamw_by_hand(before[1], [grads[2][1]] if frozen_by == "lr" else
                           [g[1] for g in grads], [lrs[2]] if frozen_by == "lr" else
                           [0.0, 0.0, lrs[2]], wd)
    assert (net[1].weight.detach() - other).abs().max() > 1e-4  # the two ways differ
    with pytest.raises(ValueError, match="frozen_by must be one of"):
        ParamGroup("x", [net[1].weight], frozen_steps=1, frozen_by="zero")


def test_a_fixed_lr_group_frozen_by_lr_gets_its_fixed_lr_back():
    """hold_frozen_groups writes lr 0 into the group; the next set_lr writes the group's fixed
    lr again (not the schedule's, and not left at 0), so a fixed-lr group frozen by lr moves
    from its first unfrozen step; a resumed optimiser state (lr 0 saved at a frozen step) is
    given its lr back by the same set_lr."""
    from contrastive.engine.optim import hold_frozen_groups, set_lr
    from contrastive.methods import ParamGroup

    net = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 2, bias=False))
    net.param_groups = lambda: [ParamGroup("pred", [net[1].weight], lr=0.05, frozen_steps=1,
                                           frozen_by="lr")]
    opt = build_optimizer(net, "sgd", lr=0.1, weight_decay=0.0, momentum=0.0)
    pred = next(g for g in opt.param_groups if g["name"] == "pred")
    set_lr(opt, 0.3)
    hold_frozen_groups(opt, 0)
    assert pred["lr"] == 0.0
    state = opt.state_dict()  # a checkpoint at the frozen step
    opt.load_state_dict(state)
    pred = next(g for g in opt.param_groups if g["name"] == "pred")
    assert pred["lr"] == 0.0
    set_lr(opt, 0.2)
    hold_frozen_groups(opt, 1)
    assert pred["lr"] == 0.05
    before = net[1].weight.detach().clone()
    net[1].weight.grad = torch.ones_like(before)
    opt.step()
    torch.testing.assert_close(net[1].weight.detach(), before - 0.05, rtol=0, atol=1e-7)
