"""SimCSE (contrastive.methods.simcse): the loss as the paper writes it, pooling / MLP at test, the
two dropout passes, presets and registry, export, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from contrastive.methods import get_method  # noqa: E402
from contrastive.methods.simcse import SimCSE  # noqa: E402
from contrastive.nn.text_encoders import load_text_encoder  # noqa: E402

VOCAB, T = 30, 6


def _method(dropout: float = 0.0, **kw) -> SimCSE:
    torch.manual_seed(0)
    enc = dict(num_layers=1, hidden_size=8, num_heads=2, intermediate_size=16, vocab_size=VOCAB,
               max_position_embeddings=16, dropout=dropout, attention_dropout=dropout)
    return SimCSE("bert", encoder_kwargs=enc, **kw).double()


def _batch(b: int = 5, s: int = 3, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (b, s, T), generator=g)
    mask = (torch.arange(T) < torch.randint(2, T + 1, (b, s, 1), generator=g)).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def _cls_mlp(m: SimCSE, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[CLS] of the last layer through dense + tanh, straight from the Hugging Face model."""
    last = m.encoder.model(input_ids=ids, attention_mask=mask).last_hidden_state
    return torch.tanh(last[:, 0] @ m.mlp[0].weight.T + m.mlp[0].bias)


def test_supervised_loss_is_eq5_with_hard_negatives():
    """Paper eq. 5: -log e^{sim(h_i, h_i+)/t} / sum_j (e^{sim(h_i, h_j+)/t} + e^{sim(h_i, h_j-)/t})."""
    m = _method()
    batch = _batch()
    out = m(batch)
    b = batch["input_ids"].shape[0]
    with torch.no_grad():
        h = [_cls_mlp(m, batch["input_ids"][:, j], batch["attention_mask"][:, j]) for j in range(3)]
    cos = lambda x, y: F.cosine_similarity(x[:, None], y[None], dim=-1)  # noqa: E731
    expected = 0.0
    for i in range(b):
        den = sum(math.exp(cos(h[0], h[1])[i, j] / 0.05) + math.exp(cos(h[0], h[2])[i, j] / 0.05)
                  for j in range(b))
        expected += -math.log(math.exp(cos(h[0], h[1])[i, i] / 0.05) / den) / b
    assert out["loss"].dtype == torch.float64
    torch.testing.assert_close(out["loss"].item(), expected, rtol=1e-12, atol=0)
    # pairs without hard negatives: the contradiction column is ignored
    pairs = {k: v[:, :2] for k, v in batch.items()}
    expected_pairs = F.cross_entropy(cos(h[0], h[1]) / 0.05, torch.arange(b)).item()
    torch.testing.assert_close(m(pairs)["loss"].item(), expected_pairs, rtol=1e-12, atol=0)
    assert set(out) == {"loss", "pos_acc", "pos_sim", "neg_sim", "embeddings"}
    assert not out["embeddings"].requires_grad and out["embeddings"].shape == (b, 8)


def test_every_parameter_is_trained_and_the_encoder_pooler_is_gone():
    m = _method()
    assert m.encoder.model.pooler is None  # as BertModel(add_pooling_layer=False) in BertForCL
    m(_batch())["loss"].backward()
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing  # DDP needs no find_unused_parameters


def test_unsupervised_is_two_dropout_passes_of_the_same_sentence():
    one = {k: v[:, :1] for k, v in _batch().items()}
    m = _method(dropout=0.0, mlp_only_train=True)
    same = {k: v.repeat(1, 2, 1) for k, v in one.items()}
    torch.testing.assert_close(m(one)["loss"], m(same)["loss"], rtol=1e-12, atol=0)
    # (B, T) is the same as (B, 1, T)
    flat = {k: v[:, 0] for k, v in one.items()}
    torch.testing.assert_close(m(flat)["loss"], m(one)["loss"], rtol=1e-12, atol=0)
    assert m(one)["pos_sim"] == pytest.approx(1.0)  # no dropout: the two passes agree
    noisy = _method(dropout=0.1, mlp_only_train=True).train()
    assert noisy(one)["pos_sim"] < 0.999  # dropout on: two different views of each sentence


def test_mlp_at_test_and_the_exported_encoder(tmp_path: Path):
    batch = _batch(s=1)
    ids, mask = batch["input_ids"][:, 0], batch["attention_mask"][:, 0]
    for mlp_only_train in (False, True):
        m = _method(mlp_only_train=mlp_only_train).eval()
        cls = m.encoder.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        want = cls if mlp_only_train else _cls_mlp(m, ids, mask)
        torch.testing.assert_close(m.embed(ids, mask), want, rtol=1e-12, atol=1e-14)
        enc = m.sentence_encoder()
        assert enc.pooling == ("cls" if mlp_only_train else "pooler")
        torch.testing.assert_close(enc(ids, mask), want, rtol=1e-12, atol=1e-14)
        # the folder a user receives: safetensors, loaded back as a plain text encoder
        folder = tmp_path / f"mlp_only_train_{mlp_only_train}"
        enc.model.save_pretrained(folder, safe_serialization=True)
        assert (folder / "model.safetensors").is_file()
        back = load_text_encoder(folder, pooling=enc.pooling).double().eval()
        torch.testing.assert_close(back(ids, mask), want, rtol=1e-12, atol=1e-14)
    avg = _method(pooling="avg").eval()
    m_ = mask.double().unsqueeze(-1)
    last = avg.encoder.model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(avg.embed(ids, mask), (last * m_).sum(1) / m_.sum(1))
    assert avg.mlp is None


def test_presets_and_registry():
    enc = dict(num_layers=1, hidden_size=8, num_heads=2, vocab_size=VOCAB)
    unsup = get_method("simcse", preset="unsup", encoder_kwargs=enc)
    sup = get_method("SimCSE", preset="sup", encoder_kwargs=enc)
    assert isinstance(unsup, SimCSE) and isinstance(sup, SimCSE)
    assert (unsup.temperature, unsup.pooling, unsup.mlp_only_train) == (0.05, "cls", True)
    assert (sup.temperature, sup.pooling, sup.mlp_only_train) == (0.05, "cls", False)
    assert sup.criterion.temperature == 0.05
    assert SimCSE.needs == ("input_ids", "attention_mask") and SimCSE.uses_in_batch_negatives


def test_bad_input_fails_clearly():
    m = _method()
    with pytest.raises(KeyError, match="attention_mask"):
        m({"input_ids": _batch()["input_ids"]})
    with pytest.raises(ValueError, match="4 sentences per example"):
        m(_batch(s=4))
    with pytest.raises(ValueError, match="int token ids"):
        m({"input_ids": torch.zeros(2, 3, 4), "attention_mask": torch.ones(2, 3, 4)})
    with pytest.raises(ValueError, match="shape of input_ids"):
        m({"input_ids": _batch()["input_ids"], "attention_mask": torch.ones(2, 2)})
    with pytest.raises(ValueError, match="pooling must be one of"):
        _method(pooling="max")
    with pytest.raises(ValueError, match="mlp_only_train needs pooling='cls'"):
        _method(pooling="avg", mlp_only_train=True)
    with pytest.raises(ValueError, match="temperature"):
        _method(temperature=0.0)
    with pytest.raises(TypeError, match="text encoder"):
        SimCSE("small_cnn")
