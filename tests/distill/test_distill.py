"""Distiller: COS-NCE per layer, frozen teacher, stage schedule, gradient perturbation.

Every reference below is written out by hand (explicit loops over samples and negatives, the
models run module by module), never by calling the code under test.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.methods import distill as distill_mod
from contrastive.methods.distill import (
    Distiller,
    default_layers,
    default_stem,
    uniform_layer_map,
)


class Tiny(nn.Module):
    """stem conv -> blocks (conv + [BN] + ReLU, 2x2 pool between blocks) -> global average pool."""

    def __init__(self, widths: tuple[int, ...], stem: int = 4, bn: bool = False) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, stem, 3, padding=1)
        blocks, c = [], stem
        for w in widths:
            layers = [nn.Conv2d(c, w, 3, padding=1)]
            layers += [nn.BatchNorm2d(w)] if bn else []
            blocks.append(nn.Sequential(*layers, nn.ReLU()))
            c = w
        self.blocks = nn.ModuleList(blocks)
        self.num_features = c

    def run(self, x: torch.Tensor, add: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        """Hand-written forward: (stem output, pooled output of every block)."""
        emb = self.stem(x)
        h = emb if add is None else emb + add
        pooled = []
        for i, block in enumerate(self.blocks):
            if i > 0:
                h = F.max_pool2d(h, 2)
            h = block(h)
            pooled.append(h.mean(dim=(2, 3)))
        return emb, pooled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for i, block in enumerate(self.blocks):
            h = block(F.max_pool2d(h, 2) if i > 0 else h)
        return h.mean(dim=(2, 3))


def g(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angular distance 1 - cos(a, b) of two vectors, written out."""
    return 1 - (a @ b) / (a.norm() * b.norm())


def cosnce_ref(s: torch.Tensor, t: torch.Tensor, negatives: list[list[torch.Tensor]]) -> torch.Tensor:
    """LRC-BERT's COS-NCE, sample by sample: (2K - (sum_k g(n_k, s) - K g(t, s))) / 2K + g(t, s)."""
    total = 0.0
    for i in range(s.shape[0]):
        k = len(negatives[i])
        pos = g(t[i], s[i])
        neg = sum(g(n, s[i]) for n in negatives[i])
        total = total + (2 * k - (neg - k * pos)) / (2 * k) + pos
    return total / s.shape[0]


def in_batch(t: torch.Tensor) -> list[list[torch.Tensor]]:
    return [[t[j] for j in range(t.shape[0]) if j != i] for i in range(t.shape[0])]


STEP_TOL = dict(rtol=1e-9, atol=1e-12)  # float64 comparisons, see the tests that use it


def make(seed: int = 0, bn: bool = False, **kw) -> Distiller:
    torch.manual_seed(seed)
    teacher, student = Tiny((5, 7, 8), bn=bn), Tiny((5, 6), bn=bn)
    return Distiller(teacher, student, **kw)


def batch(d: Distiller, x: torch.Tensor, step: int = 0, total: int = 1,
          labels: torch.Tensor | None = None) -> dict:
    """What the training loop passes: the view, the stage schedule at ``step`` and the labels."""
    return d.make_batch([x], step=step, total_steps=total,
                        **({} if labels is None else {"labels": labels}))


def test_uniform_layer_map() -> None:
    assert uniform_layer_map(4, 12) == [2, 5, 8, 11]  # LRC-BERT: layers 3, 6, 9, 12
    assert uniform_layer_map(4, 4) == [0, 1, 2, 3]
    assert uniform_layer_map(4, 2) == [0, 0, 1, 1]
    assert uniform_layer_map(2, 3) == [1, 2]
    with pytest.raises(ValueError):
        uniform_layer_map(0, 3)


def test_default_layers_and_stem() -> None:
    from contrastive.nn import create_encoder

    r18 = create_encoder("cifar_resnet18")
    assert default_layers(r18) == ["layer1", "layer2", "layer3", "layer4"]
    assert default_stem(r18) == "maxpool"
    cnn = create_encoder("small_cnn")
    assert default_layers(cnn) == [f"blocks.{i}" for i in range(4)]
    assert default_stem(cnn) == "blocks.0"
    assert default_stem(Tiny((4,))) == "stem"
    with pytest.raises(ValueError, match="student_layers"):
        default_layers(nn.Linear(2, 2))


def test_cosnce_per_layer_equals_formula() -> None:
    d = make(perturb=False)
    assert d.student_layers == ["blocks.0", "blocks.1"]
    assert d.teacher_layers == ["blocks.1", "blocks.2"]  # uniform map [1, 2] of 3 teacher blocks
    x = torch.randn(5, 3, 8, 8)
    out = d(batch(d, x))
    with torch.no_grad():
        _, t_pooled = d.teacher.run(x)
    _, s_pooled = d.encoder.run(x)
    layers = []
    for i, j in enumerate([1, 2]):
        s = s_pooled[i] @ d.projections[i].weight.T
        layers.append(cosnce_ref(s, t_pooled[j], in_batch(t_pooled[j])))
    torch.testing.assert_close(out["cosnce_layers"], torch.stack(layers).detach())
    torch.testing.assert_close(out["loss"], (layers[0] + layers[1]) / 2)
    assert out["loss"].requires_grad and "loss_soft" not in out and "loss_hard" not in out


def test_cosnce_explicit_layer_map_and_queue_negatives() -> None:
    d = make(perturb=False, layer_map=[0, 2], queue_size=6)
    assert d.teacher_layers == ["blocks.0", "blocks.2"] and not d.uses_in_batch_negatives
    x1, x2 = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    bank = [q.keys.clone() for q in d.queues]  # the initial (random) keys
    d(batch(d, x1))
    with torch.no_grad():
        _, t1 = d.teacher.run(x1)
        _, t2 = d.teacher.run(x2)
    # FIFO: the 4 new keys (unit) replace the 4 oldest slots 0..3
    expect = [torch.cat([F.normalize(t1[j], dim=1), b[4:]]) for j, b in zip([0, 2], bank)]
    out = d(batch(d, x2))
    _, s2 = d.encoder.run(x2)
    for i, j in enumerate([0, 2]):
        s = s2[i] @ d.projections[i].weight.T
        negs = [list(expect[i])] * 4  # every sample sees the whole queue, K = 6
        torch.testing.assert_close(out["cosnce_layers"][i], cosnce_ref(s, t2[j], negs).detach())


def test_teacher_frozen_and_bit_identical() -> None:
    torch.manual_seed(0)
    head = nn.Linear(8, 3)
    d = make(bn=True, teacher_head=head, stage1_fraction=0.5)
    assert d.head is not None and d.head.out_features == 3
    before = copy.deepcopy(d.teacher.state_dict())
    head_before = copy.deepcopy(head.state_dict())
    student_before = copy.deepcopy(d.encoder.state_dict())
    params = [p for p in d.parameters() if p.requires_grad]
    frozen = {id(p) for p in list(d.teacher.parameters()) + list(head.parameters())}
    assert frozen and not frozen & {id(p) for p in params}
    opt = torch.optim.SGD(params, lr=0.5, momentum=0.9, weight_decay=0.1)
    d.train()
    assert not d.teacher.training and not d.teacher_head.training and d.encoder.training
    for step in range(6):  # both stages: KD and CE terms use the teacher's logits
        out = d(batch(d, torch.randn(6, 3, 8, 8), step, 6, labels=torch.randint(0, 3, (6,))))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    assert "loss_soft" in out and "loss_hard" in out
    for p in d.teacher.parameters():
        assert not p.requires_grad and p.grad is None
    after = d.teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN running stats included
    assert all(torch.equal(head_before[k], v) for k, v in head.state_dict().items())
    assert any(not torch.equal(student_before[k], v) for k, v in d.encoder.state_dict().items())


def test_stage_switch_at_configured_step() -> None:
    d = make(perturb=False, num_classes=3, stage1_fraction=0.8)
    assert d.switch_at(10) == 8 and d.needs_find_unused_parameters
    assert d.needs == ("views", "labels")  # a head for the CE loss: the loader's labels
    assert [d.stage_at(s, 10) for s in (0, 7, 8, 9)] == [1, 1, 2, 2]
    assert [d.schedule_values(s, 10) for s in (7, 8)] == [{"stage": 1.0}, {"stage": 2.0}]
    assert d.weights_at(1) == (1.0, 0.0, 0.0) and d.weights_at(2) == (1.0, 1.0, 3.0)
    d.train()
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, -1])
    for step in range(10):
        d.zero_grad()
        out = d(batch(d, x, step, 10, labels=y))
        out["loss"].backward()
        stage = 2 if step >= 8 else 1
        assert out["stage"].item() == stage
        assert ("loss_hard" in out) == (stage == 2)
        # stage 1 keeps the student head out of the graph: no gradient at all
        assert (d.head.weight.grad is None) == (stage == 1)
        if stage == 2:  # the unlabelled sample (-1) is left out of the CE mean
            ce = F.cross_entropy(d.head(d.encoder(x))[:3], y[:3])
            torch.testing.assert_close(out["loss_hard"], ce.detach())
            torch.testing.assert_close(out["loss"], (out["loss_cosnce"] + 3 * ce).detach())
    # the stage is a function of the step: nothing for it in the state dict, and a resumed run
    # (any module with the same weights) keeps the schedule from the step the loop passes
    assert not any("step" in k for k in d.state_dict())
    e = make(perturb=False, num_classes=3, switch_step=3)
    e.load_state_dict(copy.deepcopy(d.state_dict()))
    assert e(batch(e, x, 10, 10, labels=y))["stage"].item() == 2
    e.eval()
    assert e(batch(e, x, 0, 10, labels=y))["stage"].item() == 1
    with pytest.raises(KeyError, match="'stage'"):  # no fallback: the schedule value is needed
        e({"views": [x], "labels": y})


def test_custom_stage_weights_and_no_switch() -> None:
    d = make(perturb=False, stage_weights=((0.5, 0, 0), (2.0, 0, 0)), switch_step=1)
    x = torch.randn(4, 3, 8, 8)
    o1, o2 = d(batch(d, x, 0, 10)), d(batch(d, x, 1, 10))
    torch.testing.assert_close(o1["loss"], 0.5 * o1["loss_cosnce"])
    torch.testing.assert_close(o2["loss"], 2.0 * o2["loss_cosnce"])
    assert make(perturb=False, stage1_fraction=1.0).stage_at(9, 10) == 1  # stage 1 throughout


@pytest.mark.parametrize("stage2", [False, True])
def test_gradient_perturbation_equals_two_pass_reference(stage2: bool) -> None:
    kw = dict(num_classes=3, switch_step=0) if stage2 else {}
    # float64: the hand-written reference sums in other orders than the Distiller, and the
    # second pass amplifies the first pass's rounding through the unit gradient; in float64 that
    # stays below ~1e-13 relative, so STEP_TOL (1e-9) holds on any machine while a wrong
    # perturbation (scale, direction, BN statistics) moves values by > 1e-3
    d = make(seed=1, bn=True, perturb=True, **kw).double()
    ref = copy.deepcopy(d)  # same weights; used only through hand-written code below
    d.train()
    x, y = torch.randn(6, 3, 8, 8, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, -1])
    out = d(batch(d, x, labels=y if stage2 else None))
    out["loss"].backward()

    teacher, student = ref.teacher.eval(), ref.encoder.train()
    with torch.no_grad():
        _, t = teacher.run(x)
    t = [t[1], t[2]]
    bn = [m for m in student.modules() if isinstance(m, nn.BatchNorm2d)]
    stats0 = [(m.running_mean.clone(), m.running_var.clone()) for m in bn]

    def total(add: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        emb, s_pooled = student.run(x, add)
        loss = sum(cosnce_ref(s_pooled[i] @ ref.projections[i].weight.T, t[i], in_batch(t[i]))
                   for i in range(2)) / 2
        if stage2:
            logits = ref.head(s_pooled[-1])
            loss = loss + 3 * F.cross_entropy(logits[:5], y[:5])
        return emb, loss

    emb, loss1 = total(None)  # pass 1
    (grad,) = torch.autograd.grad(loss1, emb)
    delta = torch.stack([gi / gi.norm() for gi in grad])  # per-sample unit gradient
    for m, (mean, var) in zip(bn, stats0):  # pass 1 must leave the running statistics alone
        m.running_mean.copy_(mean)
        m.running_var.copy_(var)
        m.num_batches_tracked.zero_()
    _, loss2 = total(delta)  # pass 2 at emb + delta
    loss2.backward()

    assert out["loss"].dtype == torch.float64
    torch.testing.assert_close(out["loss_pass1"], loss1.detach(), **STEP_TOL)
    torch.testing.assert_close(out["loss"], loss2, **STEP_TOL)
    assert out["loss"].item() != pytest.approx(loss1.item(), abs=1e-7)  # the perturbation acts
    for (name, p), (_, q) in zip(d.named_parameters(), ref.named_parameters()):
        if p.requires_grad:
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, **STEP_TOL, msg=name)
    for a, b in zip(d.encoder.modules(), student.modules()):  # BN updated once, by pass 2
        if isinstance(a, nn.BatchNorm2d):
            torch.testing.assert_close(a.running_mean, b.running_mean, **STEP_TOL)
            torch.testing.assert_close(a.running_var, b.running_var, **STEP_TOL)
            assert int(a.num_batches_tracked) == 1


def test_stem_hook_runs_before_a_layer_hook_on_the_same_module() -> None:
    d = make(perturb=True, stem="blocks.0")  # blocks.0 is also the first distilled layer
    x = torch.randn(2, 3, 8, 8)
    add = torch.randn(2, 5, 8, 8)
    with distill_mod.armed_taps(d._s_taps + [d._stem_tap], {2: add}):
        d.encoder(x)
    with torch.no_grad():
        h = d.encoder.blocks[0](d.encoder.stem(x)) + add  # the layer sees the perturbed output
        torch.testing.assert_close(d._s_taps[0].take(), h.mean(dim=(2, 3)))
        h = d.encoder.blocks[1](F.max_pool2d(h, 2))
        torch.testing.assert_close(d._s_taps[1].take(), h.mean(dim=(2, 3)))


def test_perturbation_scale_and_off() -> None:
    d0 = make(seed=2, perturb=False)
    d1 = make(seed=2, perturb=True, perturb_scale=0.0)  # eps 0: pass 2 equals pass 1
    x = torch.randn(4, 3, 8, 8)
    o0, o1 = d0(batch(d0, x)), d1(batch(d1, x))
    torch.testing.assert_close(o1["loss"], o0["loss"])
    torch.testing.assert_close(o1["loss_pass1"], o0["loss"].detach())
    assert "loss_pass1" not in o0
    with torch.no_grad():  # no gradient available: one pass, no perturbation
        assert "loss_pass1" not in d1(batch(d1, x))


def test_unlabelled_batch_and_representation_only() -> None:
    d = make(perturb=True, num_classes=3, switch_step=0)
    out = d(batch(d, torch.randn(4, 3, 8, 8), labels=torch.full((4,), -1)))
    assert out["loss_hard"].item() == 0.0 and torch.isfinite(out["loss"])
    e = make(perturb=True)
    assert e.needs == ("views",)
    out = e(batch(e, torch.randn(4, 3, 8, 8)))  # no head, no labels: COS-NCE only
    assert set(out) >= {"loss", "pos_acc", "pos_sim", "neg_sim", "embeddings", "loss_cosnce"}
    assert out["embeddings"].shape == (4, 8) and not out["embeddings"].requires_grad
    torch.testing.assert_close(out["embeddings"].norm(dim=1), torch.ones(4))


def test_kd_soft_loss_matches_formula() -> None:
    torch.manual_seed(3)
    head = nn.Linear(8, 4)
    d = make(perturb=False, teacher_head=head, switch_step=0, temperature=2.0, use_labels=False)
    x = torch.randn(5, 3, 8, 8)
    out = d(batch(d, x))
    with torch.no_grad():
        p_t = F.softmax(head(d.teacher(x)) / 2.0, dim=1)
    log_p_s = F.log_softmax(d.head(d.encoder(x)) / 2.0, dim=1)
    kl = sum((p_t[i] * (p_t[i].log() - log_p_s[i])).sum() for i in range(5)) / 5 * 2.0**2
    torch.testing.assert_close(out["loss_soft"], kl.detach())
    torch.testing.assert_close(out["loss"], (out["loss_cosnce"] + kl).detach())


def test_multi_process_negatives_exclude_own_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import contrastive.methods.distill_parts as parts_mod  # the negatives' one home

    other = F.normalize(torch.randn(3, 8), dim=1)  # rank 0's unit rows; this process is rank 1
    monkeypatch.setattr(parts_mod, "world_size", lambda: 2)
    monkeypatch.setattr(parts_mod, "rank", lambda: 1)
    monkeypatch.setattr(parts_mod, "gather", lambda f: torch.cat([other, f]))
    d = make(perturb=False)
    mine = F.normalize(torch.randn(3, 8), dim=1)
    (neg,) = d._negatives([mine])
    assert neg.shape == (3, 5, 8)  # K = 2 x 3 - 1
    rows = torch.cat([other, mine])
    for i in range(3):
        own = 3 + i
        others = [rows[j] for j in range(6) if j != own]
        got = sorted(neg[i].tolist())
        torch.testing.assert_close(torch.tensor(got), torch.tensor(sorted(r.tolist() for r in others)))


def test_vit_teacher_tokens_and_vit_student_perturbation() -> None:
    from contrastive.nn import create_encoder

    torch.manual_seed(0)
    vit = dict(img_size=16, patch_size=8, embed_dim=16, depth=4, num_heads=2)
    teacher = create_encoder("timm:vit_tiny_patch16_224", **vit)
    d = Distiller(teacher, Tiny((5, 6)), perturb=False)
    assert d.teacher_layers == ["blocks.1", "blocks.3"]  # uniform map of 2 onto 4 blocks
    x = torch.randn(3, 3, 16, 16)
    d(batch(d, x))
    feats, _ = d._teacher_forward(x)
    with torch.no_grad():  # the class token after block j, by hand
        h = teacher.patch_embed(x)
        h = torch.cat([teacher.cls_token.expand(3, -1, -1), h], dim=1) + teacher.pos_embed
        cls = []
        for block in teacher.blocks:
            h = block(h)
            cls.append(h[:, 0])
    torch.testing.assert_close(feats[0], F.normalize(cls[1], dim=1))  # unit rows
    torch.testing.assert_close(feats[1], F.normalize(cls[3], dim=1))
    mean = Distiller(teacher, Tiny((5, 6)), perturb=False, token_pool="mean")
    torch.testing.assert_close(mean._teacher_forward(x)[0][1], F.normalize(h[:, 1:].mean(dim=1), dim=1))

    student = create_encoder("timm:vit_tiny_patch16_224", **{**vit, "depth": 2})
    d = Distiller(teacher, student, perturb=True)
    assert d.stem == "patch_embed"
    d.train()
    out = d(batch(d, x))
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and student.patch_embed.proj.weight.grad is not None


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="no submodule 'nope'"):
        make(student_layers=["nope"])
    with pytest.raises(ValueError, match="layer_map"):
        make(layer_map=[0, 3])
    with pytest.raises(ValueError, match="token_pool"):
        make(token_pool="max")
    with pytest.raises(ValueError, match="stage_weights"):
        make(stage_weights=((1, 0), (1, 1, 3)))
    with pytest.raises(ValueError, match="num_classes"):
        make(teacher_head=nn.Linear(8, 3), num_classes=4)
    d = make()
    with pytest.raises(ValueError, match="one"):
        d(d.make_batch([torch.randn(2, 3, 8, 8)] * 2))
    with pytest.raises(RuntimeError, match="ran 2 times"):
        shared = Tiny((5, 6))
        shared.blocks[1] = shared.blocks[0] = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())
        shared.num_features = 4
        Distiller(Tiny((5, 7, 8)), shared, perturb=False, student_layers=["blocks.0"])


def test_tap_read_once_after_an_armed_forward() -> None:
    """A tap holds one forward's output: a second read, or a read without an armed forward, is
    a clear error naming the layer (not a None that fails later)."""
    d = make(perturb=True, stem="blocks.0")
    tap, stem = d._s_taps[0], d._stem_tap
    assert stem is not None
    with distill_mod.armed_taps([tap, stem]):
        d.encoder(torch.randn(2, 3, 8, 8))
    assert tap.take().shape == (2, 5) and stem.take_raw().shape == (2, 5, 8, 8)
    for read in (tap.take, stem.take_raw, stem.take):
        with pytest.raises(RuntimeError, match="layer 'blocks.0': no output recorded"):
            read()


def test_lrc_bert_and_the_image_distiller_share_one_implementation() -> None:
    """Stages, frozen teacher, negatives and perturbation have one home (issue 28)."""
    from contrastive.methods.distill_parts import ContrastiveDistillation
    from contrastive.methods.lrc_bert import LRCBert

    for name in ("switch_at", "stage_at", "weights_at", "schedules", "train", "_perturbed_pass",
                 "_init_stages", "needs_find_unused_parameters", "_negatives"):
        assert getattr(LRCBert, name) is getattr(ContrastiveDistillation, name), name
        if name != "_negatives":  # the Distiller adds its queue in front of the shared one
            assert getattr(Distiller, name) is getattr(ContrastiveDistillation, name), name
