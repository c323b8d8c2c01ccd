"""Static probe 2 (issue 51): the pooled feature (what the prediction layer reads) of a
pretrained student (MiniLM layers 1,2,4,5) and of a random-init 4 x 312: its spread across the
sentences of a batch against how far the unit gradient perturbation of the hard loss moves it,
per-sample (eps g_i / ||g_i||) and per-batch (eps g / ||g||) norms; no dropout.

    PYTHONPATH=$PWD python benchmarks/lrc_perturbation/probe2.py
"""

import json

import torch

from contrastive.data.text_tasks import load_task
from contrastive.data.tokenizer import load_tokenizer
from contrastive.methods.distill_parts import unit_gradient
from contrastive.nn.text_encoders import build_text_encoder, encoder_from_layers, load_text_encoder

MINILM = "../shared/data/text-models/all-MiniLM-L6-v2"
torch.manual_seed(0)
tok = load_tokenizer(MINILM)
data = load_task("sst2", "../shared/data/glue", train_rows=512, seed=0).train
batches = [tok.collate([data[i] for i in range(s, s + 16)]) for s in range(0, 64, 16)]
for name, enc in (("pretrained", encoder_from_layers(load_text_encoder(MINILM), [1, 2, 4, 5])),
                  ("random", build_text_encoder(num_layers=4, hidden_size=312, num_heads=12,
                                                intermediate_size=1200,
                                                vocab_size=tok.vocab_size))):
    enc.eval()
    torch.manual_seed(0)
    head = torch.nn.Linear(enc.hidden_size, 2)
    rows = []
    for b in batches:
        ids, mask, types = b["input_ids"], b["attention_mask"], b.get("token_type_ids")
        out = enc.encode(ids, mask, types)
        p = out.pooled
        loss = torch.nn.functional.cross_entropy(head(p), b["labels"])
        (g,) = torch.autograd.grad(loss, out.embeddings)
        r = {"pooled_norm": float(p.norm(dim=1).mean()),
             "pooled_spread": float((p - p.mean(0)).norm(dim=1).mean())}
        for scope, delta in (("sample", unit_gradient(g, 1.0)), ("batch", g / g.norm())):
            with torch.no_grad():
                q = enc.encode(ids, mask, types, embedding_delta=delta).pooled
            r[f"shift_{scope}"] = float((q - p).norm(dim=1).mean())
        rows.append(r)
    avg = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    avg["shift_sample/spread"] = avg["shift_sample"] / avg["pooled_spread"]
    avg["shift_batch/spread"] = avg["shift_batch"] / avg["pooled_spread"]
    print(name, json.dumps({k: round(v, 4) for k, v in avg.items()}), flush=True)
