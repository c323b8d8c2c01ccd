"""The optimiser step with torch's fused kernel against torch's default loop, side by side.

The engine builds SGD and AdamW with ``fused=True`` on the CPU and CUDA unless
``--fused-optimizer false`` (``contrastive.engine.optim.fused_by_default``). This measures what
that buys on the machine it runs on, for two models the project trains on the CPU:

- ``bert 4x312``: the LRC-BERT student of issue 30 (4 layers, hidden 312, 12 heads,
  intermediate 1200, MiniLM's 30,522-piece vocabulary; 14.3 M parameters, 9.5 M of them the
  embedding table), AdamW, batch 16 of 64 random tokens;
- ``cifar_resnet18``: MoCo's CIFAR backbone (11.2 M parameters), SGD with momentum, batch 32
  of 32 px images.

For each: the optimiser step alone (``opt.step()`` on fixed gradients) and a whole training
step (forward, backward, step), fused and loop built by ``build_optimizer`` from the same
weights, alternated ``--repeats`` times in one process; the median ms of each and the ratio
loop / fused. Threads: ``--threads`` (default 1, as the issue-30 runs train).

    python benchmarks/bench_optimizer.py [--threads 1 --repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _bert() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor], str]:
    from contrastive.methods.text_classifier import TextClassifier
    from contrastive.nn.text_encoders import text_encoder

    model = TextClassifier(text_encoder("bert", vocab_size=30522, layers=4, hidden=312, heads=12,
                                        intermediate_size=1200), 2)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(1000, 30522, (16, 64), generator=g),
             "attention_mask": torch.ones(16, 64, dtype=torch.long),
             "token_type_ids": torch.zeros(16, 64, dtype=torch.long),
             "labels": torch.randint(0, 2, (16,), generator=g)}

    def loss(m: nn.Module) -> torch.Tensor:
        return m(batch)["loss"]

    return model, loss, "adamw"


def _resnet() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor], str]:
    from contrastive.nn import create_encoder

    model = create_encoder("cifar_resnet18")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, 32, 32, generator=g)

    def loss(m: nn.Module) -> torch.Tensor:
        return m(x).square().mean()

    return model, loss, "sgd"


def _median_ms(fn: Callable[[], None], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def measure(build: Callable, repeats: int) -> dict[str, float]:
    """Median ms of the step alone and of a training step, fused and loop, alternated."""
    import copy

    from contrastive.engine.optim import build_optimizer, optimizer_kernel

    torch.manual_seed(0)
    base, loss, name = build()
    runs = {}
    for fused in (True, False):
        model = copy.deepcopy(base).train()
        opt = build_optimizer(model, name, lr=1e-4, weight_decay=0.01, fused=fused)
        runs[optimizer_kernel(opt)] = (model, opt)

    def train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=True)
        loss(model).backward()
        opt.step()

    for model, opt in runs.values():  # warm-up: the optimiser state exists, kernels loaded
        train_step(model, opt)
    out: dict[str, list[float]] = {}
    for _ in range(repeats):
        for kernel, (model, opt) in runs.items():
            out.setdefault(f"step {kernel}", []).append(_median_ms(opt.step, 3))
            out.setdefault(f"train {kernel}", []).append(
                _median_ms(lambda m=model, o=opt: train_step(m, o), 2))
    res = {k: round(statistics.median(v), 2) for k, v in out.items()}
    res["params_M"] = round(sum(p.numel() for p in base.parameters()) / 1e6, 2)
    for part in ("step", "train"):
        res[f"{part} loop/fused"] = round(res[f"{part} for-loop"] / res[f"{part} fused"], 2)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from contrastive.hardware import cpu_kind_line

    figures = {"cpu": cpu_kind_line(), "torch": torch.__version__, "threads": args.threads,
               "models": {"bert 4x312 (AdamW)": measure(_bert, args.repeats),
                          "cifar_resnet18 (SGD)": measure(_resnet, args.repeats)}}
    print(f"{figures['cpu']}; torch {figures['torch']}; {args.threads} thread(s)")
    for model, res in figures["models"].items():
        print(f"{model}, {res['params_M']} M parameters: step {res['step fused']} ms fused vs "
              f"{res['step for-loop']} loop ({res['step loop/fused']}x); training step "
              f"{res['train fused']} vs {res['train for-loop']} ms ({res['train loop/fused']}x)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
