#!/usr/bin/env python
"""Every recipe's trained parameters after 20 fixed-seed optimiser steps, as SHA-256 digests: the
check that a refactoring (a rename, a moved piece) changes no training result, bit for bit.

Each recipe in ``recipes/`` runs as its own ``__main__`` (in this process, one after the other,
accelerate's state reset between them; one thread, fp32, no GPU) on tiny
settings: the 0.4M-parameter CNN (or a 1-layer BERT), small heads, 16 px generated images or
generated sentences, batch 16 (8 for text), ``--steps 20``. The digests are those of the final
checkpoint's ``model.safetensors`` (every tensor of the method's state, parameters and buffers,
by name): ``model`` over all of them in name order, ``tensors`` one per name (16 hex digits).
A recipe that needs another's output runs after it (``distill_cosnce`` distils ``simclr_cifar``'s
encoder, ``lrc_bert`` ``bert_finetune``'s model); one whose data is absent is skipped with the
reason printed.

    # the baseline (benchmarks/results/recipe_digests.json, from main 21c1f8f before issue 29):
    nice -n 12 .venv/bin/python benchmarks/recipe_digests.py --out benchmarks/results/recipe_digests.json
    # after a change: exits 1 naming each recipe whose digests differ
    nice -n 12 .venv/bin/python benchmarks/recipe_digests.py --check benchmarks/results/recipe_digests.json

``--only a,b`` runs some recipes (with ``--check``: compared with those alone; a recipe's digests
do not depend on what ran before it). ``--extra '--flag value'`` appends arguments to each
recipe's (a flag that brings the old behaviour back: its digests against the saved ones).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import runpy
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
STEPS = 20

ENGINE = ["--steps", str(STEPS), "--num-workers", "0", "--progress", "false", "--log-every", "5",
          "--mixed-precision", "no", "--seed", "0", "--save-every-steps", "0",
          "--save-every-epochs", "0", "--cpu"]
IMAGE = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder",
         "small_cnn", "--batch-size", "16", "--warmup-epochs", "0.5", "--knn-every", "0"]
TEXT = ["--layers", "1", "--hidden", "16", "--heads", "2", "--batch-size", "8", "--lr", "1e-3",
        "--warmup-steps", "2"]
LABELLED = [*TEXT, "--task", "generated", "--n-train", "64", "--n-dev", "32",
            "--intermediate-size", "0", "--eval-at-start", "false"]

# small heads: projector / predictor hidden 32, output 16 (32 for the redundancy-reduction losses)
HEADS = [*IMAGE, "--mlp-hidden", "32", "--dim", "16"]
WIDE = [*IMAGE, "--mlp-hidden", "32", "--dim", "32"]
NNCLR = [*IMAGE, "--dim", "16", "--proj-hidden", "32", "--pred-hidden", "32", "--support-size",
         "64"]

#: per recipe: its tiny arguments (after ENGINE)
ARGS: dict[str, list[str]] = {
    "moco_cifar": [*IMAGE, "--queue-size", "32", "--split-bn", "2"],
    "moco_r50": [*IMAGE, "--queue-size", "32", "--mlp-hidden", "32"],
    "mocov1_r50": [*IMAGE, "--queue-size", "32"],
    **{name: HEADS for name in ("mocov3_r50", "mocov3_vit_small", "simclr_r50", "simclr_cifar",
                                "dcl_cifar",
                                "byol_cifar", "byol_r50", "supcon_cifar", "supcon_r50")},
    "simsiam_cifar": [*IMAGE, "--dim", "16", "--proj-hidden", "32", "--pred-hidden", "8"],
    "simsiam_r50": [*IMAGE, "--dim", "16", "--pred-hidden", "8"],
    **{name: WIDE for name in ("barlow_twins_cifar", "barlow_twins_r50", "vicreg_cifar",
                               "vicreg_r50")},
    "nnclr_cifar": NNCLR,
    "nnclr_r50": NNCLR,
    "swav_cifar": [*IMAGE, "--dim", "16", "--mlp-hidden", "32", "--num-prototypes", "20",
                   "--queue-size", "32", "--queue-start-steps", "5",
                   "--freeze-prototypes-steps", "3", "--local-crops", "2", "--local-size", "8"],
    "swav_r50": [*IMAGE, "--dim", "16", "--mlp-hidden", "32", "--num-prototypes", "20",
                 "--queue-size", "32", "--queue-start-steps", "5", "--freeze-prototypes-steps",
                 "3", "--local-crops", "2"],
    "dino_cifar": [*IMAGE, "--out-dim", "32", "--hidden-dim", "32", "--bottleneck-dim", "16",
                   "--local-crops", "2", "--local-size", "8"],
    # the CNN takes no ViT options: the recipe's default --encoder-kwargs (dynamic_img_size) off
    "dino_vit_small": [*IMAGE, "--encoder-kwargs", "{}", "--out-dim", "32", "--local-crops", "2"],
    "dim_cifar": [*IMAGE, "--mi-units", "16", "--encoder", "dcgan32", "--encoder-kwargs",
                  json.dumps({"widths": [8, 16, 16], "hidden": [32]})],
    "dim_stl": [*IMAGE, "--data", "shapes:n=64,n_test=32,size=24", "--source-size", "24",
                "--mi-units", "16", "--encoder", "dcgan64", "--encoder-kwargs",
                json.dumps({"widths": [8, 8, 16, 16], "hidden": [32]})],
    "distill_cosnce": [*IMAGE, "--student", "small_cnn", "--student-kwargs",
                       json.dumps({"widths": [8, 8, 16, 16]}), "--stage1-fraction", "0.5",
                       "--teacher-checkpoint", "{simclr_cifar}/encoder.pt"],
    "clip": ["--data", "shapes-captions:n=48,n_test=20,size=16,max_length=12", "--image-size",
             "16", "--batch-size", "16", "--warmup-steps", "2", "--dim", "8", "--text-layers", "1",
             "--text-width", "16", "--eval-max", "0"],
    "siglip": ["--data", "shapes-captions:n=48,n_test=20,size=16,max_length=12", "--image-size",
               "16", "--batch-size", "16", "--warmup-steps", "2", "--dim", "8", "--text-layers",
               "1", "--text-width", "16", "--eval-max", "0"],
    **{name: [*IMAGE[:4], "--encoder-kwargs", json.dumps(
        {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2}),
        "--decoder-dim", "8", "--decoder-depth", "1", "--decoder-heads", "2", "--batch-size", "16",
        "--warmup-epochs", "0.5", "--knn-every", "0"] for name in ("mae_cifar", "mae_in1k")},
    **{name: [*IMAGE[:4], "--encoder-kwargs", json.dumps(
        {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2,
         "dynamic_img_size": True}), "--out-dim", "32", "--batch-size", "16",
        "--warmup-epochs", "0.5", "--knn-every", "0", *local]
       for name, local in (("ibot_cifar", ["--local-crops", "2", "--local-size", "8"]),
                           ("ibot_in1k", ["--local-crops", "0"]))},  # in1k: 96-px locals only
    # DINOv2: a 2-block ViT, so that the layer-wise lr decay has layers to tell apart
    **{name: [*IMAGE[:4], "--encoder-kwargs", json.dumps(
        {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2,
         "dynamic_img_size": True}), "--out-dim", "32", "--batch-size", "16", "--knn-every", "0",
        "--local-crops", "2", *extra]
       for name, extra in (("dinov2_cifar", ["--warmup-epochs", "0.5", "--local-size", "8"]),
                           ("dinov2_in1k", ["--warmup-steps", "2", "--warmup-teacher-steps",
                                            "5", "--freeze-last-layer-steps", "3"]))},
    "simcse": [*TEXT, "--mode", "sup", "--n-train", "160", "--vocab-size", "300",
               "--intermediate", "32", "--eval", "none"],
    "bert_finetune": [*LABELLED],
    "lrc_bert": [*LABELLED, "--teacher", "{bert_finetune}/model"],
}
#: recipes that read another's output run after it
AFTER = {"distill_cosnce": "simclr_cifar", "lrc_bert": "bert_finetune"}


def digests(checkpoint: Path) -> dict:
    """SHA-256 of every tensor in ``checkpoint/model.safetensors``, in name order."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(checkpoint / "model.safetensors")
    whole = hashlib.sha256()
    each = {}
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        head = f"{name} {t.dtype} {tuple(t.shape)}\n".encode()
        whole.update(head + data)
        each[name] = hashlib.sha256(head + data).hexdigest()[:16]
    return {"model": whole.hexdigest(), "tensors": each}


def _fill(arg: str, work: Path) -> str:
    """``{recipe}/...`` -> that recipe's output folder in ``work``."""
    for other in AFTER.values():
        arg = arg.replace("{" + other + "}", str(work / other))
    return arg


def _reset_accelerate() -> None:
    """Forget the previous run's accelerate singletons (each recipe starts as a fresh program)."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


def run_one(name: str, work: Path, extra: list[str] | None = None) -> dict:
    """Run ``recipes/<name>.py`` as ``__main__`` in this process for STEPS steps into
    ``work/name`` and return its digests (or the error); ``extra`` arguments after its own."""
    out = work / name
    args = [_fill(a, work) for a in ARGS[name]] + list(extra or [])
    script = RECIPES / f"{name}.py"
    saved_argv = sys.argv
    sys.argv = [str(script), *ENGINE, *args, "--output-dir", str(out)]
    start = time.perf_counter()
    _reset_accelerate()
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            return {"error": f"SystemExit: {e.code}"}
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001  (SystemExit included: a parser error, a stop)
        return {"error": f"{type(e).__name__}: {e}"[-1500:]}
    finally:
        sys.argv = saved_argv
        _reset_accelerate()
    seconds = time.perf_counter() - start
    ckpts = sorted((out / "checkpoints").glob("step_*"))
    if not ckpts or ckpts[-1].name != f"step_{STEPS:08d}":
        return {"error": f"no checkpoint at step {STEPS}: {[c.name for c in ckpts]}"}
    return {**digests(ckpts[-1]), "seconds": round(seconds, 1)}


def run_all(names: list[str], extra: list[str] | None = None) -> dict[str, dict]:
    """Run ``names`` one after the other (a teacher before its student; ``extra`` arguments
    for ``names``, not for a teacher run only for them)."""
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="recipe_digests_") as tmp:
        work = Path(tmp)
        order = [n for n in names if n not in AFTER]
        for n in names:
            if n in AFTER:
                if AFTER[n] not in order:
                    order.append(AFTER[n])  # needed as a teacher, not reported
                order.append(n)
        for n in order:
            results[n] = run_one(n, work, extra if n in names else None)
            print(f"{n}: {results[n].get('model', 'ERROR')[:16]} "
                  f"({results[n].get('seconds', '?')} s)", flush=True)
            if "error" in results[n]:
                print(f"  {results[n]['error']}", flush=True)
    return {n: results[n] for n in names}


def compare(saved: dict[str, dict], now: dict[str, dict]) -> list[str]:
    """One line per recipe whose digests differ (naming up to three tensors)."""
    bad = []
    for name in sorted(set(saved) | set(now)):
        a, b = saved.get(name), now.get(name)
        if a is None or b is None:
            bad.append(f"{name}: {'not in the saved file' if a is None else 'not run now'}")
        elif "error" in b:
            bad.append(f"{name}: failed now: {b['error'].splitlines()[-1]}")
        elif a.get("model") != b.get("model"):
            ta, tb = a.get("tensors", {}), b.get("tensors", {})
            diff = [k for k in sorted(set(ta) | set(tb)) if ta.get(k) != tb.get(k)]
            more = f" (+{len(diff) - 3} more)" if len(diff) > 3 else ""
            bad.append(f"{name}: {len(diff)} tensors differ: {', '.join(diff[:3])}{more}")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="", help="write the digests JSON here")
    p.add_argument("--check", default="", help="compare with this saved JSON; exit 1 on a "
                   "difference")
    p.add_argument("--only", default="", help="comma-separated recipes (default: all)")
    p.add_argument("--extra", default="", help="arguments appended to each recipe's (one "
                   "string, shell-quoted)")
    args = p.parse_args(argv)
    # one thread, no GPU, this tree's package (not an installed one), quiet library logs
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
                      TOKENIZERS_PARALLELISM="false")
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    present = sorted(f.stem for f in RECIPES.glob("*.py"))
    missing = sorted(set(present) - set(ARGS))
    if missing:
        print(f"recipes without tiny settings here (add them to ARGS): {missing}",
              file=sys.stderr)
        return 2
    names = [n.strip() for n in args.only.split(",") if n.strip()] or present
    unknown = sorted(set(names) - set(ARGS))
    if unknown:
        print(f"--only: unknown recipes {unknown}; known: {sorted(ARGS)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    results = run_all(names, shlex.split(args.extra))
    print(f"{len(names)} recipes in {time.perf_counter() - start:.0f} s", flush=True)
    failed = [n for n, r in results.items() if "error" in r]
    if args.out:
        if failed:
            print(f"not written: {failed} failed", file=sys.stderr)
            return 1
        saved = {n: {k: v for k, v in r.items() if k != "seconds"} for n, r in results.items()}
        Path(args.out).write_text(json.dumps({"steps": STEPS, "recipes": saved}, indent=1,
                                             sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    if args.check:
        saved = json.loads(Path(args.check).read_text())["recipes"]
        if args.only:
            saved = {n: saved[n] for n in names if n in saved}
        bad = compare(saved, results)
        for line in bad:
            print(f"DIFFERS {line}")
        print("check: " + (f"{len(bad)} recipe(s) differ" if bad else
                           f"all {len(results)} recipes bit-identical"))
        return 1 if bad else 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
