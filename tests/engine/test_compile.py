"""``--compile`` compiles each distinct graph once and a steady-state step never recompiles.

A MoCo run compiles two graphs: the backbone with gradients and its momentum copy (the key
network) without. The kNN monitor (eval mode, no gradient, a ragged last batch: 96 images in
batches of 64) runs the compiled modules eagerly. Before this was so, the monitor compiled graphs
of its own between two training steps, and its ragged batch made Dynamo recompile the backbone
with a symbolic batch size (``moco_cifar --compile``'s first step took minutes, and every step
after it ran the slower symbolic kernels).

What compiles is Dynamo's decision, whatever the backend: the quick test counts graphs with the
``eager`` backend. The slow one compiles with Inductor and trains in float64, where its losses
match the eager run's up to rounding: Inductor fuses and reorders the same operations (1.1e-16
relative each, ~1e3 per loss, a few SGD steps), so honest differences stay below ~1e-12; a wrong
graph (a stale BN statistic, a gradient through the key network) changes the loss by > 1e-4.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from contrastive.engine import ImageConfig, train
from contrastive.methods import MoCo
from contrastive.nn.small_cnn import SmallCNN

STEPS_PER_EPOCH = 6  # 96 images, batch 16


@dataclasses.dataclass
class _Cfg(ImageConfig):
    data: str = "shapes:n=96,size=16"
    encoder: str = "small_cnn"
    image_size: int = 16
    batch_size: int = 16
    epochs: int = 2
    num_workers: int = 0
    progress: bool = False
    mixed_precision: str = "no"
    float64: bool = True
    log_every: int = 1
    save_every_steps: int = 0
    save_every_epochs: int = 0
    knn_every: int = 1  # before the first step, between epochs 1 and 2, at the end
    knn_at_start: bool = True


def _moco(cfg, data):
    return MoCo(encoder=cfg.encoder, version=2, dim=16, mlp_hidden=32, queue_size=64,
                split_bn=4)  # as moco_cifar: BN statistics per group, a buffer count per step


def _pipeline(cfg):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size)


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _cached(fn) -> int:
    """Dynamo's compiled entries for ``fn``'s code (one per graph it was compiled for). The
    key network, an ``nn.Sequential``, is compiled through a wrapper of torch's own."""
    return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(fn.__code__))


def _losses(out) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


def _compiled_run(out, backend: str) -> dict:
    """The compiled run (every ``nn.Module.compile`` with ``backend``): the count of graphs
    compiled so far at its start, before each optimiser step and at its end; the backbone's
    compiled entries; the losses."""
    from contrastive.engine import reset_accelerate_state

    torch._dynamo.reset()
    before_step: list[int] = []
    forward, compile_ = MoCo.forward, nn.Module.compile

    def counted(self, batch):
        before_step.append(_graphs())
        return forward(self, batch)

    reset_accelerate_state()
    mp = pytest.MonkeyPatch()
    mp.setattr(MoCo, "forward", counted)
    if backend != "inductor":  # Dynamo decides what compiles; the backend only how
        mp.setattr(nn.Module, "compile", lambda self, mode=None: compile_(self, backend=backend))
    try:
        start = _graphs()
        result = train(_Cfg(output_dir=str(out), compile=True), _moco, _pipeline, recipe="t")
        entries = _cached(SmallCNN.forward)
        graphs = [start, *before_step, _graphs()]
    finally:
        mp.undo()
        reset_accelerate_state()
        torch._dynamo.reset()
    assert [step for step, _ in result.evaluations] == [0, 6, 12]  # the kNN monitor ran
    return {"graphs": graphs, "entries": entries, "losses": _losses(out)}


def test_each_graph_compiles_once_and_no_later_step_recompiles(tmp_path):
    compiled_run = _compiled_run(tmp_path / "run", backend="eager")
    graphs = compiled_run["graphs"]
    assert len(graphs) == 2 * STEPS_PER_EPOCH + 2
    # [kNN at start, step 0, step 1, ...]: a step counts the kNN monitor run after it
    compiled = [b - a for a, b in zip(graphs, graphs[1:])]
    assert compiled == [0, 2] + [0] * (2 * STEPS_PER_EPOCH - 1), f"graphs compiled: {compiled}"
    # the backbone once: with gradient, in train mode, batch 16 (static: no symbolic size)
    assert compiled_run["entries"] == 1


@pytest.mark.slow  # Inductor compiles C++ kernels: about 90 s on 2 cores, 25 s with its cache
def test_inductor_compiles_each_graph_once_and_matches_eager_up_to_float64_rounding(
        tmp_path, fresh_accelerate):
    compiled_run = _compiled_run(tmp_path / "compiled", backend="inductor")
    graphs = compiled_run["graphs"]
    compiled = [b - a for a, b in zip(graphs, graphs[1:])]
    assert compiled == [0, 2] + [0] * (2 * STEPS_PER_EPOCH - 1), f"graphs compiled: {compiled}"
    assert compiled_run["entries"] == 1
    out = tmp_path / "eager"
    train(_Cfg(output_dir=str(out)), _moco, _pipeline, recipe="t")
    eager, compiled = _losses(out), compiled_run["losses"]
    assert len(eager) == 2 * STEPS_PER_EPOCH
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-9,
                               atol=1e-12)
