"""The two-process runs of tests/engine/test_fsdp.py, in ONE ``accelerate launch`` (each launch
costs both processes seconds of imports): ``fsdp_case.py OUT RECIPE CONFIG_CLASS ARGS...``.

In ``OUT/<name>/``, each run of the recipe with ``--fsdp``:

- ``full``: the run, then each rank's ``rank{R}.json``: every parameter's type, placements and
  local / full sizes (taken from the method the engine trained);
- ``part`` stopped by ``--max-steps`` one step early, then ``--resume auto`` to the end;
- ``planted``: ``part``'s checkpoint with a pickle that would create ``OUT/marker`` in its
  ``optimizer.bin`` (``meta.json``'s hash fixed, as a careful attacker would): each rank's
  ``rank{R}.refusal`` holds what the resume raised;
- ``mutant``: the reduce-scatter of FSDP's gradients returns the sum, not the mean (what gloo's
  averaging reduce-scatter has been reported to do): the gradients twice what they are.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from contrastive.engine import run
from contrastive.engine.checkpoint import OPTIMIZER_FILE
from contrastive.engine.setup import reset_accelerate_state

ROOT = Path(__file__).resolve().parents[2]


class _Plant:
    """Unpickling this creates ``path`` (any code an attacker would run)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').close()",))


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _sharding(method: torch.nn.Module) -> dict[str, dict]:
    from torch.distributed.tensor import DTensor

    facts = {}
    for name, p in method.named_parameters():
        sharded = isinstance(p, DTensor)
        facts[name] = {"dtensor": sharded, "full": p.numel(),
                       "local": p.to_local().numel() if sharded else p.numel(),
                       "placements": [str(x) for x in p.placements] if sharded else []}
    return facts


def _sum_instead_of_mean() -> None:
    original = dist.reduce_scatter_single

    def summed(output, input, group=None, op=None, async_op=False):  # noqa: A002
        work = original(output=output, input=input, group=group, op=op, async_op=False)
        output.mul_(dist.get_world_size(group))
        return work if not async_op else _Done()

    dist.reduce_scatter_single = summed


class _Done:
    def wait(self) -> bool:
        return True


def _plant(folder: Path, marker: Path) -> None:
    payload = pickle.dumps({"state": _Plant(marker)}, protocol=2)
    ckpt = max((folder / "checkpoints").iterdir())
    (ckpt / OPTIMIZER_FILE).write_bytes(payload)
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"][OPTIMIZER_FILE] = {"bytes": len(payload),
                                     "sha256": hashlib.sha256(payload).hexdigest()}
    (ckpt / "meta.json").write_text(json.dumps(meta))


def main() -> None:
    out, name, config, *args = sys.argv[1:]
    out = Path(out)
    recipe = _recipe(name)
    built: list[torch.nn.Module] = []

    def build(cfg, data):
        built.append(recipe.build_method(cfg, data))
        return built[-1]

    def train(folder: Path, *extra: str) -> None:
        run(getattr(recipe, config), build, getattr(recipe, "build_pipeline", None),
            argv=[*args, "--fsdp", "--output-dir", str(folder), *extra], name=name)
        reset_accelerate_state()

    steps = args[args.index("--max-steps") + 1]
    train(out / "full")
    rank = int(os.environ["RANK"])  # each run's end closes the process group
    (out / "full" / f"rank{rank}.json").write_text(json.dumps(_sharding(built[-1])))
    train(out / "part", "--max-steps", str(int(steps) - 1))
    if rank == 0:
        shutil.copytree(out / "part", out / "planted")
        _plant(out / "planted", out / "marker")
        (out / "planted.done").touch()
    while not (out / "planted.done").exists():
        time.sleep(0.1)
    try:
        train(out / "planted", "--resume", "auto")
        refusal = "accepted"
    except SystemExit as e:
        refusal = str(e.code)
    except Exception as e:  # noqa: BLE001 - the test reads what it was
        refusal = f"traceback: {e!r}"
    reset_accelerate_state()
    (out / "planted" / f"rank{rank}.refusal").write_text(refusal)
    train(out / "part", "--resume", "auto")
    _sum_instead_of_mean()
    train(out / "mutant")


if __name__ == "__main__":
    main()
