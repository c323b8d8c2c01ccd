"""Helpers for running the recipes as programs (as accelerate's own tests run its examples)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


def run_recipe_here(name: str, *args: str, tiny: bool = True) -> None:
    """Run a recipe in this process as its program runs (``sys.argv`` set, the file executed as
    ``__main__``), without starting an interpreter: a new one spends about 6 s of CPU importing
    torch (and torch._dynamo, which torch.optim loads) on a 2-core AVX2 box, more than a tiny
    run trains. For tests of what a run leaves and computes; what only a program shows (exit
    status, one-line errors, signals, several processes) keeps :func:`run_recipe`. A non-zero
    exit raises AssertionError."""
    import logging
    import runpy

    from contrastive.engine import reset_accelerate_state

    argv = recipe_cmd(name, *args, tiny=tiny)[1:]
    saved = sys.argv
    root, acc = logging.getLogger(), logging.getLogger("accelerate")
    handlers, levels = root.handlers[:], (root.level, acc.level)  # the program sets up logging
    reset_accelerate_state()
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise AssertionError(f"{name} {' '.join(args)} exited with {e.code}") from None
    finally:
        sys.argv = saved
        root.handlers[:] = handlers
        root.setLevel(levels[0])
        acc.setLevel(levels[1])
        reset_accelerate_state()


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
    when the session's tests are known (:func:`pytest_collection_finish`; the checks themselves
    run last, :func:`pytest_collection_modifyitems`), as many at a time as there are cores (at
    most 4), at a lower CPU priority (nice 10): they use the cores that the rest of the suite
    leaves idle (single-threaded Python, waits on other programs) and the tests that read them
    wait only for what is left. Each run is pinned to one thread, so
    neither the load nor the runs beside it change a figure. A test module declares what its
    selected tests need with ``planned_runs(item) -> [(key, recipe, args)]``; ``get(key)``
    waits for that run and returns its output folder (a failed run raises in the tests that use
    it)."""

    def __init__(self, root: Path, nice: int = 10) -> None:
        self.root, self.nice = root, nice
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
        self.done: dict[Any, tuple[Path, Future]] = {}
        self.running: list[subprocess.Popen] = []
        self.closed = False

    def submit(self, key: Any, recipe: str, args: list[str]) -> None:
        if key not in self.done:
            out = self.root / f"run{len(self.done)}"
            self.done[key] = (out, self.pool.submit(self._run, recipe, [*args, "--output-dir",
                                                                        str(out)]))

    def _run(self, recipe: str, args: list[str]) -> None:
        cmd = recipe_cmd(recipe, *args, tiny=False)
        if self.nice and shutil.which("nice"):
            cmd = ["nice", "-n", str(self.nice), *cmd]
        child_env = {**env(), "OMP_NUM_THREADS": "1"}
        if self.closed:
            raise RuntimeError("the session ended before this run started")
        proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.running.append(proc)
        try:
            _, err = proc.communicate(timeout=3600)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if proc.returncode != 0:
            raise AssertionError(f"{recipe} {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{err[-4000:]}")

    def get(self, key: Any) -> Path:
        out, future = self.done[key]
        future.result()
        return out

    def close(self) -> None:
        """Stop what still runs (a session that ends early does not wait for its runs)."""
        self.closed = True
        for proc in self.running:
            if proc.poll() is None:
                proc.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.root, ignore_errors=True)


_SESSION: dict[str, LearningRuns] = {}


def _plans(item: pytest.Item):
    return getattr(getattr(item, "module", None), "planned_runs", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The learning checks last (in their order): their runs then have the whole session to use
    the idle cores, and the checks seldom wait."""
    items[:] = [i for i in items if _plans(i) is None] + [i for i in items if _plans(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the runs that the selected learning checks need, before the first test runs."""
    if session.config.option.collectonly:
        return
    planned = []
    for item in session.items:
        plan = _plans(item)
        if plan is not None:
            planned += plan(item)
    if planned:
        runs = _SESSION["runs"] = LearningRuns(Path(tempfile.mkdtemp(prefix="learning-")))
        for key, recipe, args in planned:
            runs.submit(key, recipe, args)


def pytest_sessionfinish(session: pytest.Session) -> None:
    runs = _SESSION.pop("runs", None)
    if runs is not None:
        runs.close()


@pytest.fixture(scope="session")
def learning_runs(tmp_path_factory) -> Iterator[LearningRuns]:
    """The session's learning runs (started at collection; a new pool if none was planned)."""
    if "runs" in _SESSION:
        yield _SESSION["runs"]
        return
    runs = LearningRuns(tmp_path_factory.mktemp("learning"))
    try:
        yield runs
    finally:
        runs.close()


@pytest.fixture(scope="session")
def rx():
    """The helpers above (tests import nothing from conftest under --import-mode=importlib)."""
    return sys.modules[__name__]
