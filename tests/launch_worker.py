"""The one program of the recipe-level two-process tests; not a test module itself.

Started as ``accelerate launch --multi_gpu --num_processes 2 launch_worker.py RUNS FOLDER ...``
by the ``two_process_runs`` fixture of tests/conftest.py, ONCE for all the session's runs files
(each start of the launcher and its two ranks costs ~20 CPU s of imports, more than the tiny
runs themselves). Each ``RUNS`` is a module file that defines

- ``run(folder, name)``: its recipes (or tools) in this process, into ``folder/name`` (the
  test calls the same function in one process for the reference);
- optionally ``mutations() -> [(owner, attribute, replacement)]``: the bugs the comparison
  must catch;
- optionally ``prepare(folder)``: what its runs read, made once in the test's process before
  the launch (a teacher to distil, say).

For each runs file and its folder: ``run(folder, "two")``, then (if it has mutations) with
them planted ``run(folder, "mutant")`` (removed again after it), each checked to have run in a
group of 2 processes; ``folder/done0`` and ``done1`` mark its end on each rank. The runs share one process group:
the engine closes it after a run, and gloo's second rendezvous on the launcher's store is not
reliable (seen: "connectFullMesh failed"), so it stays open until the last run has ended.
"""

from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

from dist_worker import load_case

ROOT = Path(__file__).resolve().parents[1]


def run_recipe_main(name: str, argv: list[str], out: Path) -> None:
    """``recipes/<name>.py`` run as its program runs (``__main__``, ``sys.argv`` set) in this
    process, into ``out``, accelerate's process-wide state reset around it (what a runs file's
    ``run`` calls)."""
    from contrastive.engine import reset_accelerate_state

    script = str(ROOT / "recipes" / f"{name}.py")
    saved = sys.argv
    reset_accelerate_state()
    sys.argv = [script, *argv, "--output-dir", str(out)]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # a text recipe's program ends with sys.exit(status)
        if e.code not in (0, None):
            raise
    finally:
        sys.argv = saved
        reset_accelerate_state()


def run_all(runs_and_folders: list[str]) -> None:
    import torch.distributed as dist

    engine_run = importlib.import_module("contrastive.engine.run")  # the module, not run()
    close = engine_run.close_process_group
    engine_run.close_process_group = lambda: None
    try:
        for path, where in zip(runs_and_folders[::2], runs_and_folders[1::2]):
            runs, folder = load_case(path), Path(where)
            mutations = getattr(runs, "mutations", None)
            plans = [("two", [])] + ([("mutant", mutations())] if mutations else [])
            for name, planted in plans:
                saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in planted]
                for owner, attr, bug in planted:
                    setattr(owner, attr, bug)
                try:
                    runs.run(folder, name)
                finally:
                    for owner, attr, value in saved:
                        setattr(owner, attr, value)
                world = dist.get_world_size() if dist.is_initialized() else 1
                if world != 2:
                    raise SystemExit(f"{path} {name}: ran in {world} process(es), not 2")
            (folder / f"done{dist.get_rank()}").touch()
    finally:
        engine_run.close_process_group = close
    close()


if __name__ == "__main__":
    run_all(sys.argv[1:])
