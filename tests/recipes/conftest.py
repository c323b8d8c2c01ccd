"""Helpers for running the recipes as programs (as accelerate's own tests run its examples)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
PYTHON = sys.executable

# A few steps on tiny generated data: 64 images of 16 px, the 0.4M-parameter CNN.
TINY = ["--data", "shapes:n=64,n_test=32,size=16", "--image-size", "16", "--encoder", "small_cnn",
        "--batch-size", "16", "--epochs", "2", "--num-workers", "0", "--progress", "false",
        "--log-every", "1", "--mixed-precision", "no", "--seed", "0"]
# Per recipe: shrink the heads / queue and the warmup to the tiny run; some runs also exercise
# an engine option (bf16 autocast, per-image augmentation in the workers instead of the default
# batched one, channels_last, gradient caching, gradient accumulation through the cache).
SMALL = {
    "moco_cifar": ["--queue-size", "32", "--split-bn", "2", "--knn-max-train", "32"],
    "moco_r50": ["--queue-size", "32", "--mlp-hidden", "32", "--mixed-precision", "bf16",
                 "--grad-accum-steps", "2"],
    "mocov1_r50": ["--queue-size", "32", "--channels-last", "--batched-augment", "off"],
    "mocov3_r50": ["--mlp-hidden", "32", "--dim", "16", "--warmup-epochs", "0.5",
                   "--batched-augment", "off"],
    "mocov3_vit_small": ["--mlp-hidden", "32", "--dim", "16", "--warmup-epochs", "0.5"],
    "simclr_r50": ["--mlp-hidden", "32", "--dim", "16", "--warmup-epochs", "0.5",
                   "--grad-cache-chunk", "3"],
    "dcl_cifar": ["--mlp-hidden", "32", "--dim", "16", "--warmup-epochs", "0.5"],
    "simclr_cifar": ["--mlp-hidden", "32", "--dim", "16", "--warmup-epochs", "0.5",
                     "--knn-every", "1", "--knn-max-train", "32"],
}
ALL_RECIPES = sorted(SMALL)  # the engine's recipes (other areas may add their own files)


def env() -> dict[str, str]:
    """Child environment: the repo importable, one thread per process, no GPU."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("OMP_NUM_THREADS", "2")
    e["CUDA_VISIBLE_DEVICES"] = ""
    e["PYTHONUNBUFFERED"] = "1"
    return e


def recipe_cmd(name: str, *args: str, tiny: bool = True) -> list[str]:
    extra = [*TINY, *SMALL[name]] if tiny else []
    return [PYTHON, str(RECIPES / f"{name}.py"), *extra, *args]


def run_recipe(name: str, *args: str, tiny: bool = True, timeout: float = 240,
               check: bool = True, threads: int | None = None) -> subprocess.CompletedProcess:
    """Run a recipe as a program; ``threads`` pins its OMP_NUM_THREADS (default: the caller's,
    else 2)."""
    child_env = env()
    if threads is not None:
        child_env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(recipe_cmd(name, *args, tiny=tiny), env=child_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def load_recipe(name: str):
    """Import recipes/<name>.py as a module (recipes are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class LearningRuns:
    """The learning checks' recipe runs of a session (tests/recipes/test_learning*.py), started
    together when the first such test asks, as many at a time as there are cores (at most 4).
    Each run is pinned to one thread, so running them side by side changes no figure and halves
    their wall time on 2 cores. A test module declares what its selected tests need with
    ``planned_runs(item) -> [(key, recipe, args)]``; ``get(key)`` waits for that run and returns
    its output folder (a failed run raises in the tests that use it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
        self.done: dict[Any, tuple[Path, Future]] = {}

    def submit(self, key: Any, recipe: str, args: list[str]) -> None:
        if key not in self.done:
            out = self.root / f"run{len(self.done)}"
            future = self.pool.submit(run_recipe, recipe, *args, "--output-dir", str(out),
                                      tiny=False, timeout=1800, threads=1)
            self.done[key] = (out, future)

    def get(self, key: Any) -> Path:
        out, future = self.done[key]
        future.result()
        return out


@pytest.fixture(scope="session")
def learning_runs(request, tmp_path_factory) -> Iterator[LearningRuns]:
    runs = LearningRuns(tmp_path_factory.mktemp("learning"))
    for item in request.session.items:
        plan = getattr(getattr(item, "module", None), "planned_runs", None)
        if plan is not None:
            for key, recipe, args in plan(item):
                runs.submit(key, recipe, args)
    try:
        yield runs
    finally:
        runs.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def rx():
    """The helpers above (tests import nothing from conftest under --import-mode=importlib)."""
    return sys.modules[__name__]
