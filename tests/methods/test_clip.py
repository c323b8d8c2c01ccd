"""CLIP (contrastive.methods.clip): the loss against the formula written plainly (float64), the
logit scale's initial value and clamp, the no-decay group, bad input, the registry and a BERT
text encoder through the encoder registry."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from contrastive.engine.optim import build_optimizer
from contrastive.methods import CLIP, get_method, list_methods

sys.path.insert(0, str(Path(__file__).parent))
from dist_case_clip import TinyImage, TinyText  # noqa: E402

sys.path.pop(0)


def _model(**kw) -> CLIP:
    torch.manual_seed(0)
    return CLIP(TinyImage(), TinyText(), dim=5, **kw).double()


def _batch(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 11, (n, 4), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, -1] = 0
    return {"views": [torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64)],
            "input_ids": ids, "attention_mask": mask}


def test_loss_is_the_symmetric_infonce_of_the_paper():
    model, batch = _model(), _batch()
    out = model(batch)
    zi = F.normalize(model.image_proj(model.encoder(batch["views"][0])), dim=1)
    zt = F.normalize(model.text_proj(model.text_encoder(batch["input_ids"],
                                                        batch["attention_mask"])), dim=1)
    logits = zi @ zt.T * model.logit_scale.exp()  # Radford et al. 2021, Fig. 3 (t = 1 / 0.07)
    target = torch.arange(6)
    want = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    torch.testing.assert_close(out["loss"], want, rtol=1e-12, atol=1e-12)
    assert out["embeddings"].shape == (6, 5) and not out["embeddings"].requires_grad
    assert out["logit_scale"].item() == pytest.approx(1 / 0.07)


def test_logit_scale_starts_at_1_over_0_07_in_log_space_and_learns():
    model = _model()
    assert model.logit_scale.item() == pytest.approx(math.log(1 / 0.07))
    model(_batch())["loss"].backward()
    assert model.logit_scale.grad is not None and model.logit_scale.grad.abs() > 0


@pytest.mark.parametrize("start, want", [(7.0, math.log(100.0)), (-2.0, 0.0), (3.0, 3.0)])
def test_the_scale_is_clamped_to_0_log100_before_every_forward(start, want):
    model, batch = _model(), _batch()
    with torch.no_grad():
        model.logit_scale.fill_(start)
    out = model(batch)
    assert model.logit_scale.item() == pytest.approx(want, abs=1e-15)
    assert out["logit_scale"].item() == pytest.approx(math.exp(want))
    # the clamp is in place and not part of the graph: the gradient reaches the parameter
    out["loss"].backward()
    assert model.logit_scale.grad.abs() > 0


def test_no_weight_decay_on_the_scale_biases_and_norms_even_without_the_ndim_rule():
    model = _model()
    opt = build_optimizer(model, "adamw", lr=0.1, weight_decay=0.3, exclude_from_wd=False)
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    flat = {"logit_scale", "text_encoder.norm.weight", "text_encoder.norm.bias",
            "encoder.body.0.bias"}
    for name, p in model.named_parameters():
        assert wd[id(p)] == (0.0 if name in flat or p.ndim < 2 else 0.3), name
    # one AdamW step with zero gradients: decayed weights shrink, the scale does not
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = model.logit_scale.item()
    opt.step()
    assert model.logit_scale.item() == before


def test_bad_input_names_the_problem():
    model, batch = _model(), _batch()
    with pytest.raises(KeyError, match="input_ids"):
        model({"views": batch["views"], "attention_mask": batch["attention_mask"]})
    with pytest.raises(ValueError, match="input_ids and attention_mask"):
        model({**batch, "attention_mask": batch["attention_mask"][:3]})
    with pytest.raises(ValueError, match="temperature"):
        CLIP(TinyImage(), TinyText(), temperature=0.005)


def test_registered_and_builds_a_bert_text_encoder():
    pytest.importorskip("transformers")
    assert "clip" in list_methods()
    model = get_method("clip", encoder=TinyImage(), dim=8, text_kwargs=dict(
        num_layers=1, hidden_size=16, num_heads=2, vocab_size=20, max_position_embeddings=8))
    ids = torch.randint(0, 20, (3, 6))
    out = model({"views": [torch.randn(3, 3, 8, 8)], "input_ids": ids,
                 "attention_mask": torch.ones_like(ids)})
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    assert model.text_encoder.model.embeddings.word_embeddings.weight.grad is not None
    assert importlib.util.find_spec("contrastive.methods.clip") is not None
