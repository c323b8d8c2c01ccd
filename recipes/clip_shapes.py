"""CLIP on ``shapes`` with generated captions, in CPU minutes, then zero-shot evaluation.

    python recipes/clip_shapes.py --output-dir runs/clip_shapes --seed 0
    python recipes/clip_shapes.py --output-dir runs/clip_random --steps 0   # the random-init model
    contrastive-zeroshot runs/clip_shapes                                   # evaluate again

Data: ``shapes`` train images (32 px) with five captions each (shape, colour, size, position as
drawn, :func:`contrastive.data.generated.shape_captions`), one drawn per image and step; a
WordPiece tokenizer trained on the training captions (deterministic). No augmentation: the
captions name colour and position, which crops and colour jitter would falsify.

Model: :class:`contrastive.methods.CLIP`, ``small_cnn`` image encoder, a 2-layer 64-wide BERT
text encoder (random init, mean pooling), 64-d shared space, AdamW (CLIP: decoupled weight
decay 0.2, beta2 0.98, eps 1e-6 for ViT; here 0.1), cosine schedule with warm-up.

Why its own loop: the engine's loader yields views / labels / indices only (see the CLIP section
of the README for the engine change that carries ``input_ids``); this loop is the engine's
contract in miniature: seeded order and caption choice, ``model(batch)``, backward, step.

Evaluation: zero-shot top-1 on the held-out ``shapes`` test split (class-name prompts
``"a {}"``, ``"a picture of a {}"``, ``"there is a {}"``) and retrieval recall@1/5 (any of an
image's captions counts). Output: ``clip.pt`` (weights + config; ``weights_only`` loads it),
``tokenizer/tokenizer.json``, ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from contrastive.data import build_loader
from contrastive.data.captions import caption_tokenizer, shapes_captions
from contrastive.data.generated import SHAPE_CLASSES, shape_captions
from contrastive.engine.optim import build_optimizer, set_lr
from contrastive.eval.zeroshot import DEFAULT_TEMPLATES, evaluate_shapes, save_clip_run
from contrastive.methods import CLIP


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--seed", type=int, default=0, help="model and order seed")
    p.add_argument("--data-seed", type=int, default=0, help="shapes seed (images, captions)")
    p.add_argument("--n-train", type=int, default=5000)
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--steps", type=int, default=300, help="optimiser steps (0: random init)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--text-layers", type=int, default=2)
    p.add_argument("--text-width", type=int, default=64)
    p.add_argument("--max-length", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.steps < 0 or args.batch_size < 2 or args.n_train < args.batch_size:
        p.error("need --steps >= 0, --batch-size >= 2 and --n-train >= --batch-size")
    return args


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine to 0 (open_clip's ``cosine_lr``)."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    t = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    return 0.5 * args.lr * (1 + math.cos(math.pi * t))


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    tokenizer = caption_tokenizer(shape_captions(args.n_train, args.data_seed, "train"),
                                  vocab_size=200, max_length=args.max_length)
    model_cfg = dict(encoder="small_cnn", text_encoder="bert", dim=args.dim, text_kwargs=dict(
        num_layers=args.text_layers, hidden_size=args.text_width, num_heads=2,
        vocab_size=tokenizer.vocab_size, max_position_embeddings=args.max_length,
        pooling="mean"))
    torch.manual_seed(args.seed)
    model = CLIP(**model_cfg)
    # the engine's optimiser: the method's ParamGroup (scale, biases, norms) without decay
    optimizer = build_optimizer(model, "adamw", lr=args.lr, weight_decay=args.weight_decay,
                                betas=(0.9, 0.98))
    train = shapes_captions(tokenizer, n=args.n_train, size=args.size, seed=args.data_seed,
                            transform=lambda x: x.float() / 255)
    loader = build_loader(train, args.batch_size, shuffle=True, num_workers=0, seed=args.seed)
    step, t0, log = 0, time.time(), []
    model.train()
    while step < args.steps:
        for images, _, tokens in loader:
            set_lr(optimizer, lr_at(step, args))
            res = model({"views": [images], **tokens})
            optimizer.zero_grad(set_to_none=True)
            res["loss"].backward()
            optimizer.step()
            step += 1
            if step % 50 == 0 or step == args.steps:
                rec = {"step": step, "loss": round(res["loss"].item(), 4),
                       "pos_acc": round(float(res["pos_acc"]), 1),
                       "logit_scale": round(float(res["logit_scale"]), 2),
                       "s": round(time.time() - t0, 1)}
                log.append(rec)
                print(json.dumps(rec), flush=True)
            if step >= args.steps:
                break
    config = {"model": model_cfg, "max_length": args.max_length,
              "data": {"size": args.size, "seed": args.data_seed, "n_train": args.n_train},
              "args": vars(args)}
    save_clip_run(out, model, config, tokenizer)
    result = evaluate_shapes(model, tokenizer, list(SHAPE_CLASSES), DEFAULT_TEMPLATES,
                             n=args.n_test, size=args.size, seed=args.data_seed)
    result = {k: round(v, 2) for k, v in result.items()}
    result.update(steps=step, seed=args.seed, train_seconds=round(time.time() - t0, 1))
    (out / "result.json").write_text(json.dumps({"result": result, "log": log}, indent=1))
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
