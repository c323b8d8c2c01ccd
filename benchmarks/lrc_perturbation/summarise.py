"""Summarise instrument.py's per-step records (issue 51): stage 1 and stage 2 windows."""
import json
import sys
from statistics import fmean

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    s1 = [r for r in rows if "p1_hard" not in r]
    s2 = [r for r in rows if "p1_hard" in r]
    print(f"== {path}: {len(rows)} steps ({len(s1)} stage 1, {len(s2)} stage 2)")
    def show(name, rs, keys):
        if rs:
            print(f"  {name} (steps {rs[0]['step']}-{rs[-1]['step']}): " + ", ".join(
                f"{k} {fmean(r[k] for r in rs if k in r):.4g}" for k in keys if any(k in r for r in rs)))
    k1 = ["loss1", "loss2", "emb_token_norm", "g_sample_norm_mean", "g_top_token_share",
          "delta_sample_norm", "delta_over_emb_top_token", "head_w_norm"]
    show("stage 1 first 8", s1[:8], k1)
    show("stage 1 last 8", s1[-8:], k1)
    k2 = ["p1_hard", "p2_hard", "p1_acc", "p2_acc", "p1_logit_gap_std", "p1_class_sep",
          "p2_class_sep", "gap_shift", "p1_soft", "p1_intermediate", "g_sample_norm_mean",
          "delta_sample_norm", "head_w_norm"]
    for i in range(0, len(s2), 8):
        show(f"stage 2 window {i // 8}", s2[i:i + 8], k2)
