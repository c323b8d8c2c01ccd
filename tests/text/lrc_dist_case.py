"""Case of tests/text/test_lrc_bert_distributed.py for the one worker, tests/dist_worker.py.

Rank 0 first runs LRC-BERT in one process on the whole batch (2B sentences, padded to the longest); then both ranks run the
same steps on their half with gloo + DDP(find_unused_parameters=True), each half padded only to
its own longest sentence (rank 0's are shorter). Step 0 is stage 1,
step 1 stage 2; gradient perturbation on. With ``local`` the ranks use their own batch as
negatives (no gather): the mutation the test must see differ. Everything runs in float64.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from contrastive.methods.lrc_bert import LRCBert
from contrastive.methods.text_classifier import TextClassifier
from contrastive.nn.text_encoders import build_text_encoder

B, STEPS, VOCAB = 3, 2, 30


def enc(layers, hidden, seed):
    torch.manual_seed(seed)
    return build_text_encoder(num_layers=layers, hidden_size=hidden, num_heads=2, vocab_size=VOCAB,
                              max_position_embeddings=16, dropout=0.0, attention_dropout=0.0)


def build() -> LRCBert:
    teacher = TextClassifier(enc(4, 8, 0), 3, dropout=0.0)
    return LRCBert(teacher, enc(2, 4, 1), switch_step=1).double()


def data(world):
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([[4, 3, 5], [7, 6, 4]])  # rank 0 pads to 5, rank 1 to 7
    steps = []
    for _ in range(STEPS):
        mask = (torch.arange(7)[None, None] < lengths[..., None]).long().reshape(world * B, 7)
        ids = torch.randint(3, VOCAB, (world * B, 7), generator=g) * mask
        steps.append((ids, mask, torch.randint(0, 3, (world * B,), generator=g)))
    return steps


def run(model, method, steps, rows):
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.5)
    record = []
    for s, (ids, mask, y) in enumerate(steps):
        ids, mask, y = ids[rows], mask[rows], y[rows]
        t = int(mask.sum(1).max())
        batch = {"input_ids": ids[:, :t], "attention_mask": mask[:, :t], "labels": y,
                 "stage": method.stage_at(s, STEPS)}
        opt.zero_grad(set_to_none=True)
        out = model(batch)
        out["loss"].backward()
        grads = {n: p.grad.clone() for n, p in method.named_parameters() if p.grad is not None}
        record.append({"loss": out["loss"].detach(), "stage": out["stage"], "grads": grads})
        opt.step()
    record.append({n: p.detach().clone() for n, p in method.state_dict().items()})
    return record


def reference(world: int) -> dict:
    ref = build()
    return {"ref": run(ref, ref, data(world), slice(None))}


def distributed(rank: int, world: int) -> dict:
    steps, rows = data(world), slice(rank * B, (rank + 1) * B)
    method = build()
    result = {"ddp": run(DDP(method, find_unused_parameters=True), method, steps, rows)}
    local = build()
    local._negatives = lambda reps: [None] * len(reps)  # the mutation: no gathered negatives
    result["local"] = run(DDP(local, find_unused_parameters=True), local, steps, rows)
    return result
