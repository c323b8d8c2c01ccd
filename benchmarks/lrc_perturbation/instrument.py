#!/usr/bin/env python
"""Instrumented recipes/lrc_bert.py run: records, every training step, what the gradient
perturbation does (issue 51, step 2: why a pretrained student stays at chance).

    PYTHONPATH=$PWD python benchmarks/lrc_perturbation/instrument.py OUT.jsonl [SCOPE] -- RECIPE ARGS

SCOPE: sample (the implementation: eps * g_i / ||g_i|| per sample), batch (eps * g / ||g||
over the whole batch), none (g recorded, the perturbation not applied: the trained loss is
pass 1's, as --perturb false, with the statistics of g recorded).
"""

from __future__ import annotations

import json
import sys

import torch

from contrastive.methods import distill_parts
from contrastive.methods._common import wide

out_path, scope = sys.argv[1], sys.argv[2]
argv = sys.argv[sys.argv.index("--") + 1:]
log = open(out_path, "w")
state = {"step": 0}


def batch_unit(g: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return g * (scale / g.norm().clamp(min=1e-12))


def stats(parts: dict, prefix: str) -> dict:
    r: dict = {}
    for k in ("hard", "soft", "intermediate"):
        if k in parts:
            r[f"{prefix}{k}"] = float(parts[k].detach())
    if "logits" in parts:
        z = parts["logits"].detach()
        r[f"{prefix}logit_gap_mean"] = float((z[:, 1] - z[:, 0]).mean())
        r[f"{prefix}logit_gap_std"] = float((z[:, 1] - z[:, 0]).std())
        y = state["labels"]
        gap = z[:, 1] - z[:, 0]
        if (y == 1).any() and (y == 0).any():  # class separation of the gap, positive: right
            r[f"{prefix}class_sep"] = float(gap[y == 1].mean() - gap[y == 0].mean())
        r[f"{prefix}acc"] = float(((gap > 0).long() == y).float().mean())
        state[f"{prefix}gap"] = gap
    return r


def perturbed_pass(self, student_pass, scale, pass1_context=None):
    loss1, parts1 = student_pass(None)
    emb = parts1.pop("emb")
    rec = {"step": state["step"], "loss1": float(loss1.detach()), **stats(parts1, "p1_")}
    g = None
    if loss1.requires_grad and emb.requires_grad:
        (g,) = torch.autograd.grad(loss1, emb, retain_graph=scope == "none", allow_unused=True)
    g = wide(torch.zeros_like(emb)) if g is None else wide(g.detach())
    e = emb.detach()
    mask = (e.abs().sum(-1) > 0).float()
    gs = g.flatten(1).norm(dim=1)
    tok = g.norm(dim=-1)  # (B, T)
    rec.update(emb_sample_norm=float(e.flatten(1).norm(dim=1).mean()),
               emb_token_norm=float((e.norm(dim=-1) * mask).sum() / mask.sum()),
               g_sample_norm_mean=float(gs.mean()), g_sample_norm_min=float(gs.min()),
               g_sample_norm_max=float(gs.max()),
               g_top_token_share=float((tok.max(1).values / tok.norm(dim=1).clamp(min=1e-30))
                                       .pow(2).mean()),
               g_cls_share=float((tok[:, 0] / tok.norm(dim=1).clamp(min=1e-30)).pow(2).mean()))
    if scope == "none":
        loss, parts = loss1, parts1
    else:
        delta = distill_parts.unit_gradient(g, scale) if scope == "sample" else batch_unit(g, scale)
        d_tok = delta.norm(dim=-1)
        rec.update(delta_sample_norm=float(delta.flatten(1).norm(dim=1).mean()),
                   delta_top_token_norm=float(d_tok.max(1).values.mean()),
                   delta_over_emb_top_token=float((d_tok / e.norm(dim=-1).clamp(min=1e-12))
                                                  .max(1).values.mean()))
        loss, parts = student_pass(delta)
        rec.update(loss2=float(loss.detach()), **stats(parts, "p2_"))
        if "p1_gap" in state and "p2_gap" in state and "logits" in parts:
            rec["gap_shift"] = float((state["p2_gap"] - state["p1_gap"]).abs().mean())
    head = self.head
    rec.update(head_w_norm=float(head.weight.detach().norm()),
               head_b=[float(b) for b in head.bias.detach()])
    log.write(json.dumps(rec) + "\n")
    log.flush()
    state["step"] += 1
    return loss, parts, loss1.detach()


distill_parts.ContrastiveDistillation._perturbed_pass = perturbed_pass  # type: ignore[method-assign]

from contrastive.methods.lrc_bert import LRCBert  # noqa: E402

_forward = LRCBert.forward


def forward(self, batch):
    state["labels"] = batch["labels"]
    state.pop("p1_gap", None)
    state.pop("p2_gap", None)
    return _forward(self, batch)


LRCBert.forward = forward  # type: ignore[method-assign]

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "recipes"))
import lrc_bert  # noqa: E402

lrc_bert.main(argv)
