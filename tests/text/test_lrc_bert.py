"""LRC-BERT on text (contrastive.methods.lrc_bert): the loss against a hand-written float64 version,
the representation of a layer output, the two stages, regression, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from contrastive.methods.lrc_bert import LRCBert, layer_representation  # noqa: E402
from contrastive.methods.text_classifier import TextClassifier  # noqa: E402
from contrastive.nn.text_encoders import build_text_encoder  # noqa: E402

B, T, VOCAB = 4, 7, 40


def _enc(layers: int, hidden: int, seed: int):
    torch.manual_seed(seed)
    return build_text_encoder(num_layers=layers, hidden_size=hidden, num_heads=2,
                              vocab_size=VOCAB, max_position_embeddings=32, dropout=0.0,
                              attention_dropout=0.0)


def _method(num_labels: int = 3, regression: bool = False, **kw) -> LRCBert:
    teacher = TextClassifier(_enc(4, 16, 0), num_labels, regression=regression, dropout=0.0)
    return LRCBert(teacher, _enc(2, 8, 1), **kw).double()


def _batch(pad_to: int = T, seed: int = 2, regression: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 5, 3, 6])
    mask = (torch.arange(pad_to)[None] < lengths[:, None]).long()
    ids = F.pad(torch.randint(5, VOCAB, (B, T), generator=g), (0, pad_to - T)) * mask
    labels = torch.rand(B, generator=g) * 5 if regression else torch.tensor([0, 2, 1, 2])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _hand_loss(m: LRCBert, batch: dict, stage: int, delta=None):
    """The paper's loss written out: COS-NCE (Fu et al. eq. 1 with the 2K normalisation of
    REFERENCES.md) on the zero-padded, flattened token matrices, KD at t = 1.1, CE."""
    ids, mask, y = batch["input_ids"], batch["attention_mask"], batch["labels"]
    t_out = m.teacher.encoder.encode(ids, mask)
    s_out = m.encoder.encode(ids, mask, embedding_delta=delta)
    mk = mask.double()[..., None]
    layer_losses = []
    for i, j in enumerate(m.layer_map):
        s = ((s_out.hidden_states[i] @ m.projections[i].weight.T) * mk).reshape(B, -1)
        t = (t_out.hidden_states[j] * mk).reshape(B, -1)
        cos = (s @ t.T) / (s.norm(dim=1)[:, None] * t.norm(dim=1)[None])
        k = B - 1
        g_pos = 1 - cos.diagonal()
        g_neg = (1 - cos).sum(1) - g_pos
        layer_losses.append(((2 * k - (g_neg - k * g_pos)) / (2 * k) + g_pos).mean())
    loss = torch.stack(layer_losses).mean()
    if stage == 2:
        z_s, z_t = m.head(s_out.pooled), m.teacher.head(t_out.pooled)
        p_t = F.softmax(z_t / 1.1, 1)
        kd = (1.1 ** 2) * (p_t * (p_t.log() - F.log_softmax(z_s / 1.1, 1))).sum(1).mean()
        ce = -F.log_softmax(z_s, 1)[torch.arange(B), y].mean()
        loss = loss + kd + 3 * ce
    return loss


@pytest.mark.parametrize("stage", [1, 2])
def test_perturbed_loss_and_gradients_match_hand_written_float64(stage: int) -> None:
    m = _method().train()
    batch = {**_batch(), "stage": stage}
    out = m(batch)
    grads = torch.autograd.grad(out["loss"], [p for p in m.parameters() if p.requires_grad],
                                allow_unused=True)
    # by hand: g = dL/d emb at emb (a zero delta), emb' = emb + g / ||g|| per sample
    zero = torch.zeros(B, T, 8, dtype=torch.float64, requires_grad=True)
    loss1 = _hand_loss(m, batch, stage, zero)
    (g,) = torch.autograd.grad(loss1, zero)
    assert g.abs().sum() > 0
    delta = g / g.flatten(1).norm(dim=1)[:, None, None]
    loss2 = _hand_loss(m, batch, stage, delta)
    ref = torch.autograd.grad(loss2, [p for p in m.parameters() if p.requires_grad],
                              allow_unused=True)
    torch.testing.assert_close(out["loss_pass1"], loss1.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out["loss"], loss2, rtol=1e-10, atol=1e-12)
    assert (loss2 - loss1).abs() > 1e-6  # the perturbation changes the loss that trains
    for a, b in zip(grads, ref):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    head_grad = dict(zip([n for n, p in m.named_parameters() if p.requires_grad], grads))
    assert (head_grad["head.weight"] is None) == (stage == 1)  # stage 1: alpha:beta:gamma = 1:0:0
    assert all(p.grad is None for p in m.teacher.parameters())


def test_accuracy_pass1_is_the_unperturbed_pass() -> None:
    m = _method().train()
    batch = {**_batch(), "stage": 2}
    out = m(batch)
    m.perturb = False
    clean = m(batch)
    assert "accuracy_pass1" not in clean
    torch.testing.assert_close(out["accuracy_pass1"], clean["accuracy"])
    torch.testing.assert_close(out["loss_pass1"], clean["loss"].detach())
    assert "accuracy_pass1" not in m({**batch, "stage": 1})  # stage 1: no prediction layer


def test_tokens_representation_ignores_padding() -> None:
    m = _method().train()
    a = m({**_batch(T), "stage": 2})
    b = m({**_batch(T + 5), "stage": 2})  # the same sentences, 5 more padding tokens
    torch.testing.assert_close(a["loss"], b["loss"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a["loss_pass1"], b["loss_pass1"], rtol=1e-10, atol=1e-12)


def test_layer_representations() -> None:
    h = torch.randn(2, 4, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    tok = layer_representation(h, mask, "tokens", length=6)
    assert tok.shape == (2, 18)
    assert tok[0, 6:].abs().sum() == 0 and torch.equal(tok[0, :6], h[0, :2].flatten())
    torch.testing.assert_close(layer_representation(h, mask, "mean")[0], h[0, :2].mean(0))
    assert torch.equal(layer_representation(h, mask, "cls"), h[:, 0])
    with pytest.raises(ValueError, match="representation"):
        layer_representation(h, mask, "max")


def test_uniform_layer_map_and_widths() -> None:
    m = _method()
    assert m.layer_map == [1, 3]  # 2 of 4 teacher layers: the paper's ceil(i N / M)
    assert [tuple(p.weight.shape) for p in m.projections] == [(16, 8), (16, 8)]
    assert m.schedules()["stage"](79, 100) == 1 and m.schedules()["stage"](80, 100) == 2
    assert not any(p.requires_grad for p in m.teacher.parameters())


def test_regression_uses_mse_for_soft_and_hard_losses() -> None:
    m = _method(1, regression=True, perturb=False).train()
    batch = {**_batch(regression=True), "stage": 2}
    out = m(batch)
    with torch.no_grad():
        z_s = m.predict(batch)[:, 0]
        z_t = m.teacher.predict(batch)[:, 0]
    torch.testing.assert_close(out["loss_soft"], F.mse_loss(z_s, z_t))
    torch.testing.assert_close(out["loss_hard"], F.mse_loss(z_s, batch["labels"].double()))
    assert "accuracy" not in out


def test_mse_ablation_matches_masked_mse() -> None:
    m = _method(intermediate="mse", perturb=False).train()
    batch = {**_batch(), "stage": 1}
    out = m(batch)
    mask = batch["attention_mask"].double()[..., None]
    with torch.no_grad():
        s = m.encoder.encode(batch["input_ids"], batch["attention_mask"]).hidden_states
        t = m.teacher.encoder.encode(batch["input_ids"], batch["attention_mask"]).hidden_states
        ref = torch.stack([(((s[i] @ m.projections[i].weight.T - t[j]) * mask) ** 2).sum()
                           / (mask.sum() * 16) for i, j in enumerate(m.layer_map)]).mean()
    torch.testing.assert_close(out["loss"], ref)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="layer_map"):
        _method(layer_map=[0, 4])
    with pytest.raises(ValueError, match="representation"):
        _method(representation="pooled")
    with pytest.raises(TypeError, match="TextClassifier"):
        LRCBert(torch.nn.Linear(2, 2), _enc(2, 8, 1))  # type: ignore[arg-type]
    m = _method()
    with pytest.raises(KeyError, match="stage"):
        m(_batch())
    with pytest.raises(ValueError, match="input_ids"):
        m({"input_ids": torch.zeros(3, dtype=torch.long), "labels": torch.zeros(3), "stage": 1})


def test_plain_kd_stage_skips_the_layers_and_is_soft_plus_hard() -> None:
    """alpha = 0 (issue 30's KD variant: --stage2-weights 0 1 1 --no-two-stage --no-perturb):
    beta * KD(t = 1.1) + gamma * CE, written out; no intermediate term is computed."""
    m = _method(stage_weights=((0.0, 1.0, 1.0), (0.0, 1.0, 1.0)), perturb=False).train()
    batch = {**_batch(), "stage": 2}
    out = m(batch)
    assert "loss_intermediate" not in out and "embeddings" not in out
    ids, mask, y = batch["input_ids"], batch["attention_mask"], batch["labels"]
    z_s = m.head(m.encoder.encode(ids, mask).pooled)
    z_t = m.teacher.head(m.teacher.encoder.encode(ids, mask).pooled)
    p_t = F.softmax(z_t / 1.1, 1)
    kd = (1.1 ** 2) * (p_t * (p_t.log() - F.log_softmax(z_s / 1.1, 1))).sum(1).mean()
    ce = -F.log_softmax(z_s, 1)[torch.arange(B), y].mean()
    torch.testing.assert_close(out["loss"], kd + ce)
    grads = torch.autograd.grad(out["loss"], list(m.projections.parameters()), allow_unused=True)
    assert all(g is None for g in grads)  # the layer maps take no part


def test_cross_entropy_only_stage_does_not_run_the_teacher() -> None:
    """0:0:gamma (issue 30's cross-entropy variant) reads nothing of the teacher: it is not run
    (about 40 % of such a step's time) and the loss is gamma * CE, written out; with the teacher's
    soft loss on it runs again."""
    m = _method(stage_weights=((0.0, 0.0, 1.0), (0.0, 1.0, 1.0)), perturb=False).train()
    calls, encode = [], m.teacher.encoder.encode
    m.teacher.encoder.encode = lambda *a, **k: calls.append(1) or encode(*a, **k)
    batch = _batch()
    out = m({**batch, "stage": 1})
    assert not calls and "loss_soft" not in out
    z_s = m.head(m.encoder.encode(batch["input_ids"], batch["attention_mask"]).pooled)
    ce = -F.log_softmax(z_s, 1)[torch.arange(B), batch["labels"]].mean()
    torch.testing.assert_close(out["loss"], ce)
    out = m({**batch, "stage": 2})
    assert calls and "loss_soft" in out
