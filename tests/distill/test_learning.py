"""Learning check: COS-NCE alone, without labels, transfers what a supervised teacher knows.

On the built-in ``shapes`` data (10 classes, 32 px, 2,000 training and 1,000 held-out images):
train a ``small_cnn`` teacher with labels, distil a smaller ``small_cnn`` student from it with
the Distiller's COS-NCE term only (no labels, no KD: representation-only, gradient perturbation
on), then compare linear-probe top-1 on the held-out split of the student at random init, the
distilled student and the teacher. The student maps its last stage to the teacher's last stage
(at these budgets the paper's uniform all-stage mapping learns more slowly: benchmarks/results/
distill.md).

Measured on the 2-core shared CPU (AMD EPYC, 2026-11-22, torch 2.14, fp32), linear-probe
top-1 % on the 1,000 held-out images:

- light (the default run; 24 s with the 2 cores lightly loaded, 2 min under a load average of 8):
  teacher 16-32-64-128 (98k parameters, 150 supervised steps), student 8-16-32-64 (25k
  parameters, 150 steps): random student 19.7, distilled 62.6, teacher 80.1; the default
  suite runs it as this file's program in the background pool at one thread: random 19.7,
  distilled 58.1, teacher 76.9 (AVX2 Zen 3, 2026-11-28; the bar, 60 % of the way, is 54.0);
- full (``-m slow``; 8 min under a load average of 9): teacher 32-64-128-256 (0.39M, 200
  steps), student 16-32-64-128 (98k, 150 steps): random 26.4, distilled 77.2, teacher 86.4.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.data.generated import generate_shapes
from contrastive.methods.distill import Distiller
from contrastive.nn import create_encoder

N_TRAIN, N_TEST, BATCH = 2000, 1000, 128


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def norm(x: torch.Tensor) -> torch.Tensor:
        return (x.float() / 255 - 0.5) / 0.25

    xtr, ytr = generate_shapes(N_TRAIN, 32, seed=0, split="train")
    xte, yte = generate_shapes(N_TEST, 32, seed=0, split="test")
    return norm(xtr), ytr, norm(xte), yte


def _flip(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    flip = torch.rand(x.shape[0], generator=g) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(3), x)


def _cosine_lr(opt: torch.optim.Optimizer, peak: float, step: int, total: int) -> None:
    lr = peak * 0.5 * (1 + torch.cos(torch.tensor(step / total * torch.pi)).item())
    for group in opt.param_groups:
        group["lr"] = lr


@torch.no_grad()
def _features(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    return torch.cat([model(x[i : i + 500]) for i in range(0, len(x), 500)])


def linear_probe(model: nn.Module, data) -> float:
    """Top-1 % of a softmax classifier on frozen, standardised features (Adam, full batch)."""
    xtr, ytr, xte, yte = data
    ftr, fte = _features(model, xtr), _features(model, xte)
    mu, sd = ftr.mean(0), ftr.std(0) + 1e-6
    ftr, fte = (ftr - mu) / sd, (fte - mu) / sd
    torch.manual_seed(0)
    clf = nn.Linear(ftr.shape[1], 10)
    opt = torch.optim.Adam(clf.parameters(), lr=1e-2, weight_decay=1e-4)
    for _ in range(300):
        opt.zero_grad()
        F.cross_entropy(clf(ftr), ytr).backward()
        opt.step()
    return (clf(fte).argmax(1) == yte).float().mean().item() * 100


LAST_STAGE = {"student_layers": ["blocks.3"], "layer_map": [3]}


def run_check(teacher_widths, student_widths, teacher_steps, distill_steps,
              **distill_kwargs) -> dict[str, float]:
    """Teacher, random-init student and distilled student linear-probe top-1 (%).

    ``distill_kwargs`` go to the Distiller (default: last stage to last stage, perturbation on).
    """
    data = _data()
    xtr, ytr = data[0], data[1]
    g = torch.Generator().manual_seed(0)

    torch.manual_seed(0)  # 1. a teacher that knows the data: supervised, with labels
    teacher = create_encoder("small_cnn", widths=teacher_widths)
    clf = nn.Linear(teacher.num_features, 10)
    params = list(teacher.parameters()) + list(clf.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)
    teacher.train()
    for step in range(teacher_steps):
        idx = torch.randint(0, N_TRAIN, (BATCH,), generator=g)
        _cosine_lr(opt, 0.1, step, teacher_steps)
        loss = F.cross_entropy(clf(teacher(_flip(xtr[idx], g))), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    result = {"teacher": linear_probe(teacher, data)}

    torch.manual_seed(1)  # 2. the student at random init, then distilled with COS-NCE alone
    student = create_encoder("small_cnn", widths=student_widths)
    result["random"] = linear_probe(student, data)
    d = Distiller(teacher, student, **(distill_kwargs or LAST_STAGE))
    assert d.head is None  # representation-only
    opt = torch.optim.Adam([p for p in d.parameters() if p.requires_grad], lr=3e-3)
    d.train()
    for step in range(distill_steps):
        idx = torch.randint(0, N_TRAIN, (BATCH,), generator=g)
        _cosine_lr(opt, 3e-3, step, distill_steps)
        out = d(d.make_batch([_flip(xtr[idx], g)], step=step, total_steps=distill_steps))
        assert "loss_hard" not in out and "loss_soft" not in out
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    result["distilled"] = linear_probe(d.encoder, data)
    return result


def _check(r: dict[str, float]) -> None:
    print(f"linear probe top-1: random {r['random']:.1f}, distilled {r['distilled']:.1f}, "
          f"teacher {r['teacher']:.1f}")
    assert r["teacher"] >= 70, r  # the teacher really knows the data
    assert r["distilled"] >= r["random"] + 20, r  # clearly beats the same student at random init
    # ... and approaches the teacher: at least 60 % of the way from random init to the teacher
    assert r["distilled"] - r["random"] >= 0.6 * (r["teacher"] - r["random"]), r


LIGHT = dict(teacher_widths=(16, 32, 64, 128), student_widths=(8, 16, 32, 64), teacher_steps=150,
             distill_steps=150)


CPU_S = 24.0  # the light run's CPU seconds (one thread)


def planned_runs(item: pytest.Item) -> list[tuple[str, str, list[str], float]]:
    """The light check runs as this file's program in the session's ``learning_runs`` pool
    (tests/conftest.py): one thread, in the background, while other tests run."""
    light = item.name == "test_cosnce_distillation_learns_light"
    return [("cosnce-light", __file__, [], CPU_S)] if light else []


def test_cosnce_distillation_learns_light(learning_runs) -> None:
    _check(json.loads((learning_runs.get("cosnce-light") / "probe.json").read_text()))


@pytest.mark.slow
def test_cosnce_distillation_learns_full() -> None:
    _check(run_check((32, 64, 128, 256), (16, 32, 64, 128), teacher_steps=200, distill_steps=150))


if __name__ == "__main__":  # the light check's run: linear-probe top-1 figures to probe.json
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", type=Path, required=True)
    out = parser.parse_args().output_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(run_check(**LIGHT)))
