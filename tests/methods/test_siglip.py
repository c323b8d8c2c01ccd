"""SigLIP (Zhai et al. ICCV 2023, arXiv 2303.15343) against Algorithm 1 written plainly here, over
3 SGD steps in float64 with the same towers and inputs; the scale t' and bias b are learnt."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from contrastive.methods import CLIP, DualEncoder, Method, SigLIP, get_method

from .dist_case_clip import TinyImage, TinyText, batches

STEP_TOL = dict(rtol=1e-9, atol=1e-12)


def _algorithm1(img_emb, txt_emb, t_prime, b):
    """The paper's Algorithm 1: every pair a binary classification, summed over texts, averaged
    over images: -sum(log_sigmoid(labels * logits)) / n."""
    n = img_emb.shape[0]
    zimg, ztxt = F.normalize(img_emb, dim=1), F.normalize(txt_emb, dim=1)
    logits = zimg @ ztxt.T * t_prime.exp() + b
    labels = 2 * torch.eye(n, dtype=logits.dtype) - 1
    return -F.logsigmoid(labels * logits).sum() / n


def test_matches_algorithm_1_over_three_sgd_steps():
    torch.manual_seed(0)
    method = SigLIP(TinyImage(), TinyText(), dim=5).double()
    assert float(method.criterion.log_scale.detach()) == pytest.approx(math.log(10.0))
    assert float(method.criterion.bias.detach()) == -10.0
    ref = copy.deepcopy(method)  # only its towers and (t', b) are used, by the plain formula
    t_prime, b = ref.criterion.log_scale, ref.criterion.bias
    opt = torch.optim.SGD(method.parameters(), lr=0.5)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    for images, ids, mask in batches():
        out = method({"views": [images], "input_ids": ids, "attention_mask": mask})
        x = ref.image_proj(ref.encoder(images))
        y = ref.text_proj(ref.text_encoder(ids, mask))
        loss = _algorithm1(x, y, t_prime, b)
        assert out["loss"].dtype == torch.float64
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
        for o, value in ((opt, out["loss"]), (opt_ref, loss)):
            o.zero_grad()
            value.backward()
            o.step()
        method.after_optimizer_step()  # no clamp: t' and b move freely
    assert float(method.criterion.bias.detach()) != -10.0  # b is learnt
    for p, q in zip(method.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, **STEP_TOL)


def test_is_not_clip_and_has_no_softmax_scale():
    """CLIP's sibling on the shared towers: neither CLIP's scale nor its clamp; the state_dict
    keys are CLIP's but for the scale (what run folders and checkpoints record)."""
    torch.manual_seed(0)
    s = get_method("siglip", encoder=TinyImage(), text_encoder=TinyText(), dim=5)
    clip = get_method("clip", encoder=TinyImage(), text_encoder=TinyText(), dim=5)
    assert isinstance(s, DualEncoder) and not isinstance(s, CLIP)
    assert not hasattr(s, "logit_scale") and not hasattr(s, "clamp_logit_scale")
    assert type(s).after_optimizer_step is Method.after_optimizer_step  # nothing after a step
    assert SigLIP.needs == CLIP.needs and SigLIP.backbones == CLIP.backbones
    assert [k for k in s.state_dict() if not k.startswith("criterion.")] == [
        k for k in clip.state_dict() if k != "logit_scale"]
    names = {n for n, _ in s.named_parameters()}
    assert {"criterion.log_scale", "criterion.bias"} <= names
    groups = {id(p) for g in s.param_groups() for p in g.params}
    assert id(s.criterion.log_scale) in groups and id(s.criterion.bias) in groups  # no decay
    with pytest.raises(ValueError, match="SigLIP: input_ids"):
        s({"views": [torch.randn(3, 3, 8, 8)], "input_ids": torch.ones(2, 4, dtype=torch.long),
           "attention_mask": torch.ones(2, 4, dtype=torch.long)})


def test_the_paper_preset_is_the_papers_init():
    """presets["paper"]: t' = log 10, b = -10 (sec. 3.2 and Table 4), and the defaults agree."""
    s = SigLIP.from_preset("paper", encoder=TinyImage(), text_encoder=TinyText(), dim=5)
    assert s.criterion.log_scale.item() == pytest.approx(math.log(10.0))
    assert s.criterion.bias.item() == -10.0
    default = SigLIP(encoder=TinyImage(), text_encoder=TinyText(), dim=5)
    assert default.criterion.log_scale.item() == s.criterion.log_scale.item()
    assert default.criterion.bias.item() == s.criterion.bias.item()


def test_scale_and_bias_get_no_weight_decay_and_the_scheduled_lr():
    """t' and b through the engine's optimiser (issue 32): weight decay 0 even with
    ``exclude_from_wd=False`` (open_clip excludes ``logit_scale`` / ``logit_bias``; big_vision
    decays only ``.*/kernel$``) and the weights' scheduled lr (both references give them the one
    schedule); one AdamW step on zero gradients leaves them where they were."""
    from contrastive.engine.optim import build_optimizer, set_lr

    torch.manual_seed(0)
    s = SigLIP(encoder=TinyImage(), text_encoder=TinyText(), dim=5)
    opt = build_optimizer(s, "adamw", lr=0.1, weight_decay=0.3, exclude_from_wd=False)
    set_lr(opt, 0.05)  # a point of the schedule
    group = {id(p): g for g in opt.param_groups for p in g["params"]}
    scalars = (s.criterion.log_scale, s.criterion.bias)
    for p in scalars:
        assert group[id(p)]["weight_decay"] == 0.0 and group[id(p)]["lr"] == 0.05
    assert group[id(s.image_proj.weight)]["weight_decay"] == 0.3
    assert group[id(s.image_proj.weight)]["lr"] == 0.05
    before = [p.item() for p in scalars]
    for p in s.parameters():
        p.grad = torch.zeros_like(p)
    w = s.image_proj.weight.detach().clone()
    opt.step()
    assert [p.item() for p in scalars] == before
    torch.testing.assert_close(s.image_proj.weight.detach(), w * (1 - 0.05 * 0.3))
