"""Static probe (issue 51): how strong LRC-BERT's unit gradient perturbation is for a pretrained
student (MiniLM layers 1,2,4,5) and for a random-init 4 x 312, on SST-2 batches of 16, no
dropout. Per loss term: the embedding output's norm, the gradient's per-sample norm and how
concentrated it is, and what the perturbation does to the loss and to the logits.

    PYTHONPATH=$PWD python benchmarks/lrc_perturbation/probe.py TEACHER_MODEL_DIR
"""

from __future__ import annotations

import json
import sys

import torch

from contrastive.data.text_tasks import load_task
from contrastive.data.tokenizer import load_tokenizer
from contrastive.methods import LRCBert
from contrastive.methods.distill_parts import unit_gradient
from contrastive.methods.text_classifier import load_classifier
from contrastive.nn.text_encoders import build_text_encoder, encoder_from_layers, load_text_encoder

MINILM = "../shared/data/text-models/all-MiniLM-L6-v2"
torch.manual_seed(0)
teacher, _ = load_classifier(sys.argv[1])
tok = load_tokenizer(MINILM)
data = load_task("sst2", "../shared/data/glue", train_rows=512, seed=0).train
batches = [tok.collate([data[i] for i in range(s, s + 16)]) for s in range(0, 64, 16)]


def students():
    yield "pretrained", encoder_from_layers(load_text_encoder(MINILM), [1, 2, 4, 5])
    yield "random", build_text_encoder(num_layers=4, hidden_size=312, num_heads=12,
                                       intermediate_size=1200, vocab_size=tok.vocab_size)


TERMS = {"cosnce": (1.0, 0.0, 0.0), "hard": (0.0, 0.0, 1.0), "stage2": (1.0, 1.0, 3.0)}
out = {}
for name, student in students():
    for term, w in TERMS.items():
        torch.manual_seed(0)
        m = LRCBert(teacher, student, stage_weights=(w, w)).eval()
        rows = []
        for b in batches:
            ids, mask = b["input_ids"], b["attention_mask"]
            types = b.get("token_type_ids")
            t_reps, t_raw, t_logits = m._teacher(ids, mask, types, ids.shape[1])
            ctx = {"ids": ids, "mask": mask, "types": types, "labels": b["labels"],
                   "length": ids.shape[1], "weights": w, "t": t_reps, "t_raw": t_raw,
                   "neg": m._negatives(t_reps), "t_logits": t_logits}
            loss1, p1 = m._student_pass(ctx)
            emb = p1["emb"]
            (g,) = torch.autograd.grad(loss1, emb)
            delta = unit_gradient(g.detach(), 1.0)
            with torch.no_grad():
                loss2, p2 = m._student_pass(ctx, delta)
            tokn = emb.detach().norm(dim=-1)
            gt = g.norm(dim=-1)
            real = mask.bool()
            r = {"loss1": float(loss1), "loss2": float(loss2),
                 "emb_token_norm": float(tokn[real].mean()),
                 "g_sample_norm": float(g.flatten(1).norm(dim=1).mean()),
                 "g_top_token_share": float(((gt.max(1).values / gt.norm(dim=1)) ** 2).mean()),
                 "delta_top_token_over_emb": float((delta.norm(dim=-1) / tokn).max(1).values.mean())}
            if "logits" in p1:
                r["logit_shift"] = float((p2["logits"] - p1["logits"]).norm(dim=1).mean())
                r["logit_norm"] = float(p1["logits"].norm(dim=1).mean())
            rows.append(r)
        out[f"{name}/{term}"] = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        print(name, term, json.dumps({k: round(v, 5) for k, v in out[f"{name}/{term}"].items()}),
              flush=True)
