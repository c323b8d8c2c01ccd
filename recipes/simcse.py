#!/usr/bin/env python
"""SimCSE (Gao et al. 2021, arXiv:2104.08821; princeton-nlp/SimCSE), supervised and unsupervised.

    # supervised, on the generated task's NLI triples, a small BERT from random init (CPU minutes)
    python recipes/simcse.py --mode sup --out runs/simcse_sup
    # the paper's supervised run: a downloaded BERT-base and SimCSE's NLI file, STS-B dev
    python recipes/simcse.py --mode sup --encoder hf:/path/to/bert-base-uncased \\
        --tokenizer /path/to/bert-base-uncased --data /path/to/nli_for_simcse.csv \\
        --eval /path/to/glue_data/STS-B --out runs/sup_simcse_bert
    # unsupervised on wiki1m_for_simcse.txt (one sentence a line)
    python recipes/simcse.py --mode unsup --encoder hf:/path/to/bert-base-uncased \\
        --tokenizer /path/to/bert-base-uncased --data /path/to/wiki1m_for_simcse.txt \\
        --eval /path/to/glue_data/STS-B --out runs/unsup_simcse_bert

The engine's training loop (``contrastive.engine``) builds image batches, so this recipe has its
own small loop: AdamW (the Hugging Face Trainer's defaults that the official ``train.py`` uses:
betas 0.9 / 0.999, eps 1e-8, weight decay 0), linear decay to 0 without warm-up, STS Spearman on
the evaluation pairs every ``--eval-every`` steps, and the best checkpoint kept
(``--metric_for_best_model stsb_spearman --load_best_model_at_end`` in the official scripts).
One process; the method itself gathers negatives across processes (tests/text/
test_simcse_distributed.py), a multi-process loop is not written here.

Paper defaults per mode (``--lr``, ``--batch-size``, ``--epochs`` left at 0 take them): sup lr 5e-5,
batch 512, 3 epochs; unsup lr 3e-5, batch 64, 1 epoch (README "Hyperparameters", BERT-base;
``run_sup_example.sh``); max length 32, tau 0.05, [CLS] pooling with the MLP (unsup: in training
only). The default encoder is a small random BERT (not the paper's, which starts from BERT-base):
pass ``--encoder hf:FOLDER``.

Output (``--out``): ``model/`` (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``simcse.json``: the evaluation pooling; the supervised MLP is the model's pooler, as the
authors' ``simcse_to_huggingface.py``), loadable with ``create_encoder("hf:OUT/model")`` and
``contrastive-sts-eval --model OUT/model``; ``metrics.json`` (evaluations and losses).
Every field below is a flag: ``python recipes/simcse.py --help``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from contrastive.text.batches import (
    GroupCollate,
    SentenceGroups,
    nli_groups,
    read_sentence_file,
    read_simcse_csv,
)
from contrastive.text.simcse import SimCSE
from contrastive.text.sts import SIMCSE_CONFIG, evaluate_sts, load_sts_pairs

log = logging.getLogger("simcse")

PAPER = {"sup": dict(lr=5e-5, batch_size=512, epochs=3),
         "unsup": dict(lr=3e-5, batch_size=64, epochs=1)}


@dataclass
class SimCSEConfig:
    """Every field is a flag (``--field-name``); 0 / "" means "the default described"."""

    mode: str = field(default="sup", metadata={"help": "sup | unsup (presets of SimCSE)",
                                                "choices": ("sup", "unsup")})
    data: str = field(default="generated", metadata={
        "help": "generated | a SimCSE .csv/.tsv (sent0,sent1[,hard_neg]) | a .txt (one sentence "
                "a line). generated: sup = (premise, entailment, contradiction) triples, unsup = "
                "the premises alone"})
    n_train: int = field(default=20000, metadata={"help": "generated training examples"})
    hard_negatives: bool = field(default=True, metadata={
        "help": "generated sup data: keep the contradiction as hard negative"})
    eval: str = field(default="generated", metadata={
        "help": "STS pairs for evaluation / selection: generated | GLUE STS-B folder or TSV | none"})
    eval_split: str = field(default="dev", metadata={"help": "STS-B split (dev)"})
    n_eval: int = field(default=2000, metadata={"help": "generated STS pairs (test stream)"})
    eval_every: int = field(default=250, metadata={"help": "steps between evaluations (paper 250; "
                                                           "0 = at the end only)"})
    keep_best: bool = field(default=True, metadata={"help": "restore the best evaluated weights"})
    seed: int = field(default=0, metadata={"help": "model / order seed; generated data uses --data-seed"})
    data_seed: int = field(default=0, metadata={"help": "seed of the generated data"})
    encoder: str = field(default="bert", metadata={
        "help": "bert (random init, sizes below) | hf:FOLDER (pretrained, e.g. BERT-base)"})
    layers: int = field(default=4, metadata={"help": "bert: layers"})
    hidden: int = field(default=256, metadata={"help": "bert: hidden size"})
    heads: int = field(default=4, metadata={"help": "bert: attention heads"})
    intermediate: int = field(default=0, metadata={"help": "bert: FFN size (0 = 4 x hidden)"})
    dropout: float = field(default=0.1, metadata={"help": "bert: dropout p (BERT 0.1; the "
                                                          "unsupervised positives' noise)"})
    tokenizer: str = field(default="", metadata={
        "help": "folder with tokenizer.json or vocab.txt; empty = train WordPiece on the data"})
    vocab_size: int = field(default=1000, metadata={"help": "trained WordPiece vocabulary"})
    max_length: int = field(default=32, metadata={"help": "tokens per sentence (paper 32)"})
    pooling: str = field(default="cls", metadata={"help": "cls | cls_before_pooler | avg",
                                                   "choices": ("cls", "cls_before_pooler", "avg")})
    temperature: float = field(default=0.05, metadata={"help": "tau (paper 0.05)"})
    lr: float = field(default=0.0, metadata={"help": "AdamW lr (0 = paper: sup 5e-5, unsup 3e-5)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (HF default 0)"})
    batch_size: int = field(default=0, metadata={"help": "examples per step (0 = paper: sup 512, "
                                                         "unsup 64)"})
    epochs: float = field(default=0.0, metadata={"help": "epochs (0 = paper: sup 3, unsup 1)"})
    steps: int = field(default=0, metadata={"help": "optimiser steps; overrides --epochs"})
    grad_clip: float = field(default=1.0, metadata={"help": "max grad norm (HF Trainer 1.0; 0 = off)"})
    device: str = field(default="cpu", metadata={"help": "cpu | cuda"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0 = torch's choice)"})
    log_every: int = field(default=50, metadata={"help": "steps between loss lines"})
    out: str = field(default="", metadata={"help": "output folder (empty = nothing written)"})

    def resolved(self) -> SimCSEConfig:
        """A copy with the paper's per-mode values filled in."""
        cfg = copy.copy(self)
        for name, value in PAPER[cfg.mode].items():
            if not getattr(cfg, name):
                setattr(cfg, name, value)
        return cfg


def parse_args(argv: list[str] | None = None) -> SimCSEConfig:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(SimCSEConfig):
        flag = "--" + f.name.replace("_", "-")
        kind: Any = {"int": int, "float": float, "str": str, "bool": _bool}[str(f.type)]
        p.add_argument(flag, type=kind, default=f.default, help=f.metadata.get("help", ""),
                       choices=f.metadata.get("choices"))
    return SimCSEConfig(**vars(p.parse_args(argv)))


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true / false, got {text!r}")


def training_data(cfg: SimCSEConfig) -> SentenceGroups:
    """The training examples (see ``--data``); a file's column count must fit ``--mode``."""
    if cfg.data == "generated":
        from contrastive.text.generated import generate_nli

        nli = generate_nli(cfg.n_train, seed=cfg.data_seed, split="train")
        if cfg.mode == "unsup":
            return SentenceGroups([(s,) for s in nli.premise])
        return nli_groups(nli, hard_negatives=cfg.hard_negatives)
    path = Path(cfg.data)
    if not path.is_file():
        raise FileNotFoundError(f"--data {cfg.data!r}: no such file; give 'generated', a SimCSE "
                                ".csv (sent0,sent1[,hard_neg]) or a .txt (one sentence a line)")
    data = read_sentence_file(path) if path.suffix.lower() == ".txt" else read_simcse_csv(path)
    if (cfg.mode == "unsup") != (data.size == 1):
        raise ValueError(f"--data {path} has {data.size} sentence(s) per example but --mode "
                         f"{cfg.mode}: unsup takes a .txt of sentences, sup a CSV of pairs/triples")
    return data


def build_tokenizer(cfg: SimCSEConfig, data: SentenceGroups) -> Any:
    from contrastive.text.tokenizer import load_tokenizer, train_wordpiece

    if cfg.tokenizer:
        return load_tokenizer(cfg.tokenizer, max_length=cfg.max_length)
    corpus = [s for g in data.groups for s in g]
    return train_wordpiece(corpus, vocab_size=cfg.vocab_size, max_length=cfg.max_length)


def build_method(cfg: SimCSEConfig, vocab_size: int) -> SimCSE:
    kwargs: dict[str, Any] = {}
    if cfg.encoder == "bert":
        kwargs = dict(num_layers=cfg.layers, hidden_size=cfg.hidden, num_heads=cfg.heads,
                      intermediate_size=cfg.intermediate or None, vocab_size=vocab_size,
                      dropout=cfg.dropout, attention_dropout=cfg.dropout)
    return SimCSE(cfg.encoder, pooling=cfg.pooling, temperature=cfg.temperature,
                  mlp_only_train=cfg.mode == "unsup" and cfg.pooling == "cls",
                  encoder_kwargs=kwargs)


def train(cfg: SimCSEConfig) -> dict[str, Any]:
    """Train and evaluate; returns ``{"initial", "final", "best", "history", "steps", ...}``."""
    cfg = cfg.resolved()
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = training_data(cfg)
    tokenizer = build_tokenizer(cfg, data)
    method = build_method(cfg, tokenizer.vocab_size).to(cfg.device)
    pairs = None if cfg.eval == "none" else load_sts_pairs(cfg.eval, cfg.eval_split, cfg.n_eval,
                                                        cfg.data_seed)

    def evaluate() -> float:
        assert pairs is not None
        return evaluate_sts(method, tokenizer, *pairs, embed=method.embed)["spearman"]

    loader = DataLoader(data, batch_size=min(cfg.batch_size, len(data)), shuffle=True,
                        drop_last=True, collate_fn=GroupCollate(tokenizer),
                        generator=torch.Generator().manual_seed(cfg.seed))
    steps = cfg.steps or max(1, math.ceil(cfg.epochs * len(loader)))
    opt = torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=cfg.lr,
                            betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / steps))
    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "steps": steps, "history": [],
                              "losses": []}
    best, best_state = -math.inf, None
    if pairs is not None:
        result["initial"] = evaluate()
        log.info("step 0: STS spearman %.4f", result["initial"])
    method.train()
    step, start = 0, time.time()
    while step < steps:
        for batch in loader:
            batch = {k: v.to(cfg.device) for k, v in batch.items()}
            out = method(batch)
            opt.zero_grad(set_to_none=True)
            out["loss"].backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(method.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            step += 1
            result["losses"].append(float(out["loss"].detach()))
            if cfg.log_every and step % cfg.log_every == 0:
                log.info("step %d/%d loss %.4f pos_acc %.1f (%.1f s)", step, steps,
                         float(out["loss"]), float(out["pos_acc"]), time.time() - start)
            last = step == steps
            if pairs is not None and ((cfg.eval_every and step % cfg.eval_every == 0) or last):
                rho = evaluate()
                result["history"].append({"step": step, "spearman": rho})
                log.info("step %d: STS spearman %.4f", step, rho)
                if rho > best:
                    best = rho
                    best_state = copy.deepcopy(method.state_dict()) if cfg.keep_best else None
            if last:
                break
    if pairs is not None:
        result["final"] = result["history"][-1]["spearman"]
        result["best"] = best
        if best_state is not None:
            method.load_state_dict(best_state)
    result["seconds"] = time.time() - start
    if cfg.out:
        export(method, tokenizer, Path(cfg.out), result)
    result["method"], result["tokenizer"] = method, tokenizer
    return result


def export(method: SimCSE, tokenizer: Any, out: Path, result: dict[str, Any]) -> Path:
    """``out/model`` (safetensors + config + tokenizer.json + simcse.json), ``out/metrics.json``."""
    folder = out / "model"
    encoder = method.sentence_encoder()
    encoder.model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(folder)
    (folder / SIMCSE_CONFIG).write_text(json.dumps(
        {"pooling": encoder.pooling, "method": "simcse", "mode": result["config"]["mode"],
         "temperature": method.temperature}, indent=1), encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(
        {k: v for k, v in result.items() if k not in ("method", "tokenizer")}, indent=1),
        encoding="utf-8")
    return folder


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = parse_args(argv)
    result = train(cfg)
    summary = {k: result[k] for k in ("initial", "final", "best", "steps", "seconds") if k in result}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
