"""One two-process run of tests/engine/test_fsdp.py: ``fsdp_case.py MODE OUT RECIPE
CONFIG_CLASS ARGS...`` trains the recipe with ``--fsdp`` into ``OUT`` (one run a launch: a second
engine run in the same processes meets the first one's process group store).

- ``run``: then each rank's ``OUT/rank{R}.json``: every parameter's type, placements and local /
  full sizes, and the value of each 0-dim one (taken from the method the engine trained);
- ``mutant``: the same, but the reduce-scatter of FSDP's gradients returns the sum, not the mean
  (what gloo's averaging reduce-scatter has been reported to do): gradients twice what they are;
- ``gradless``: the same, but CLIP's gather keeps only the local rows' gradient
  (tests/gather_mutant.py);
- ``planted``: a resume expected to be refused: each rank's ``OUT/rank{R}.refusal`` holds the
  engine's one-line refusal (or "accepted").
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from contrastive.engine import run

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "recipes"), str(ROOT / "tests")]
from conftest import load_recipe  # noqa: E402 - the recipe helpers of the tests


def _sharding(method: torch.nn.Module) -> dict[str, dict]:
    from torch.distributed.tensor import DTensor

    facts = {}
    for name, p in method.named_parameters():
        sharded = isinstance(p, DTensor)
        facts[name] = {"dtensor": sharded, "full": p.numel(),
                       "local": p.to_local().numel() if sharded else p.numel(),
                       "placements": [str(x) for x in p.placements] if sharded else []}
        if p.ndim == 0:
            facts[name]["value"] = p.item()
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


def main() -> None:
    mode, out, name, config, *args = sys.argv[1:]
    out = Path(out)
    recipe = load_recipe(name)
    built: list[torch.nn.Module] = []

    def build(cfg, data):
        built.append(recipe.build_method(cfg, data))
        return built[-1]

    if mode == "mutant":
        _sum_instead_of_mean()
    if mode == "gradless":
        from gather_mutant import gather_local_grad

        import contrastive.methods.clip as clip_module

        clip_module.gather_with_grad = gather_local_grad
    # an image-text recipe (make(): its data adapter), or an image one (its pipeline)
    adapter = recipe.make()[2] if hasattr(recipe, "make") else None
    try:
        run(getattr(recipe, config), build, getattr(recipe, "build_pipeline", None),
            adapter=adapter, argv=[*args, "--fsdp", "--output-dir", str(out)], name=name)
        refusal = "accepted"
    except SystemExit as e:
        if mode != "planted":
            raise
        refusal = str(e.code)
    rank = int(os.environ["RANK"])
    if mode == "planted":
        (out / f"rank{rank}.refusal").write_text(refusal)
    else:
        (out / f"rank{rank}.json").write_text(json.dumps(_sharding(built[-1])))


if __name__ == "__main__":
    main()
