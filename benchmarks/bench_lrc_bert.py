#!/usr/bin/env python
"""LRC-BERT figures: the paper's Table 2 (parameters and inference time, 12 x 768 teacher vs
4 x 312 student, both built from configurations) and the learning check / ablations on the
generated task.

    python benchmarks/bench_lrc_bert.py table2 [--batch-size 32 --seq-len 128 --repeats 5]
    python benchmarks/bench_lrc_bert.py learning --seeds 0 1 2 [--variants lrc no_two_stage ...]

``table2``: BERT-base (12 layers, 768 wide, 12 heads, FFN 3072) and the TinyBERT / LRC-BERT
student (4, 312, 12 heads, FFN 1200), vocabulary 30522, random weights; parameters counted
with and without the embedding tables (the paper's 109M / 14.5M include them); time = median
over ``--repeats`` timed forward passes (after one warm-up) of a batch of ``--batch-size``
sequences of ``--seq-len`` tokens, ``torch.no_grad``, eval mode, on the device given (the
paper measured one V100). ``learning``: see ``benchmarks/lrc_check.py`` (the recipes through
the engine, in this process); prints one JSON line per seed and a mean table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from contrastive.hardware import cpu_kind_line
from contrastive.nn.text_encoders import build_text_encoder

SIZES = {"teacher 12x768 (BERT-base)": (12, 768, 12, 3072),
         "student 4x312 (LRC-BERT / TinyBERT-4)": (4, 312, 12, 1200)}


def table2(batch_size: int, seq_len: int, repeats: int, device: str) -> list[dict]:
    rows = []
    ids = torch.randint(1000, 30000, (batch_size, seq_len), device=device)
    mask = torch.ones_like(ids)
    for name, (layers, hidden, heads, ffn) in SIZES.items():
        torch.manual_seed(0)
        enc = build_text_encoder(num_layers=layers, hidden_size=hidden, num_heads=heads,
                                 intermediate_size=ffn, vocab_size=30522).to(device).eval()
        total = sum(p.numel() for p in enc.parameters())
        emb = sum(p.numel() for p in enc.model.embeddings.parameters())
        times = []
        with torch.no_grad():
            enc(ids, mask)  # warm-up
            for _ in range(repeats):
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                enc(ids, mask)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        rows.append({"model": name, "params_M": round(total / 1e6, 1),
                     "params_no_embeddings_M": round((total - emb) / 1e6, 1),
                     "seconds_per_batch": round(statistics.median(times), 3)})
    t, s = rows
    s["speedup"] = round(t["seconds_per_batch"] / s["seconds_per_batch"], 1)
    s["size_ratio"] = round(t["params_M"] / s["params_M"], 1)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table2")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--seq-len", type=int, default=128)
    t.add_argument("--repeats", type=int, default=5)
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    lc = sub.add_parser("learning")
    lc.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    lc.add_argument("--variants", nargs="+", default=["lrc", "no_two_stage", "no_perturb", "mse"])
    lc.add_argument("--student-steps", type=int, default=300)
    args = p.parse_args()
    if args.cmd == "table2":
        print(f"{cpu_kind_line()}; threads {torch.get_num_threads()}, "
              f"load average {os.getloadavg()[0]:.1f}, "
              f"device {args.device}, batch {args.batch_size} x {args.seq_len} tokens")
        for row in table2(args.batch_size, args.seq_len, args.repeats, args.device):
            print(json.dumps(row))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lrc_check import learning_check

    print(f"{cpu_kind_line()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for seed in args.seeds:
        r = learning_check(seed, variants=tuple(args.variants), student_steps=args.student_steps)
        print(json.dumps(r), flush=True)
        results.append(r)
    for key in ["teacher", "ce_student", *args.variants]:
        vals = [r[key] for r in results]
        print(f"{key:>14}: mean {statistics.mean(vals):6.2f}  per seed {vals}")


if __name__ == "__main__":
    main()
