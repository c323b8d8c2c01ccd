"""The one worker of the two-process (gloo, CPU) equivalence tests; not a test module itself.

Run as ``python dist_worker.py RANK WORLD OUT_DIR CASE...`` (the ``run_two_ranks`` fixture of
tests/conftest.py starts two, once for all the session's cases: each start costs seconds of
imports). Each ``CASE`` is a module file that defines

- ``reference(world) -> dict``: the one-process run on the whole batch (``world`` x the
  per-process batch), computed by rank 0 before the process group exists, so that every helper
  of :mod:`contrastive.nn.distributed` is in its one-process mode;
- ``distributed(rank, world) -> dict``: the same steps on this rank's part of the batch, with
  the gloo process group up (DDP, gathers, all-reduces; mutations the test must see differ).

The cases run in order, each in a process group of its own (up for ``distributed`` only). Each
rank saves ``{**reference (rank 0 only), **distributed, "group_size": WORLD}`` of the i-th case to
``OUT_DIR/i/rank{RANK}.pt`` when the case ends; the fixture checks that both ranks ran in a group
of ``WORLD``, and starts the cases after a failed one again.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist


class SGDRecord(dict):
    """What a case's SGD steps leave for the comparison: per step the loss and the gradients
    of the trainable parameters (and any ``extra`` value a case names), at the end the
    parameters. Cases import it as ``from dist_worker import SGDRecord`` (this file's folder is
    on the worker's path)."""

    def __init__(self) -> None:
        super().__init__(loss=[], grads=[])

    def step(self, loss: torch.Tensor, method: torch.nn.Module, opt: torch.optim.Optimizer,
             backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
             **extra: Any) -> None:
        """Back-propagate ``loss`` (``backward``: a case's own backward pass, such as the
        gradient cache's), record it, the gradients and each ``extra`` value under its name,
        take the optimiser step."""
        opt.zero_grad()
        backward(loss)
        self["loss"].append(loss.detach())
        self["grads"].append([p.grad.clone() for p in method.parameters() if p.requires_grad])
        for key, value in extra.items():
            self.setdefault(key, []).append(value)
        opt.step()

    def finish(self, method: torch.nn.Module) -> dict:
        """The record as a plain dict (the results file is read with ``weights_only=True``),
        with the final parameters."""
        return {**self, "params": [p.detach().clone() for p in method.parameters()]}


def load_case(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the case module {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(path: str, rank: int, world: int, out_dir: Path, init_method: str | None = None
             ) -> None:
    """One case: the reference, then the distributed part in a fresh process group, from the
    global random state the process started with (restored after it), as if it ran alone.
    ``init_method``: how the ranks meet (default: a file store in ``out_dir``; ``"env://"``
    where a launcher set the rendezvous)."""
    case = load_case(path)
    with torch.random.fork_rng(devices=[]):
        result: dict = case.reference(world) if rank == 0 else {}
        out_dir.mkdir(parents=True, exist_ok=True)
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                init_method=init_method or f"file://{out_dir / 'store'}")
        try:
            result.update(case.distributed(rank, world))
            result["group_size"] = dist.get_world_size()
            dist.barrier()
        finally:
            dist.destroy_process_group()
    torch.save(result, out_dir / f"rank{rank}.pt")


def main() -> None:
    rank, world, out_dir, cases = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    torch.set_num_threads(1)
    for i, path in enumerate(cases):
        run_case(path, rank, world, out_dir / str(i))


if __name__ == "__main__":
    main()
