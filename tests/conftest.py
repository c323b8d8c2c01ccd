"""Shared fixtures: paths, the shared data folder, determinism."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder beside the project; skip when a user has only the project."""
    if not (SHARED_DATA / "cifar10-jpeg.tar").exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (only needed for integration tests)")
    return SHARED_DATA


def _close_f64(a, b) -> None:
    """Equal up to float64 rounding. The two-process workers train in float64: the all-reduce and
    the batch sums add in other orders (1.1e-16 relative per operation, ~1e3 operations, a few
    SGD steps), so honest differences stay below ~1e-12; a gather without gradient, a rank
    offset or a missing average changes values by > 1e-3. In float32 the same comparison needed
    1e-4 and depended on the machine. Metrics kept in float32 (a percentage) compare at
    float32's default tolerance."""
    if torch.is_tensor(a) and a.is_floating_point() and a.dtype != torch.float64:
        torch.testing.assert_close(a, b)
        return
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="session")
def close_f64() -> Callable[..., None]:
    """``close_f64(a, b)``: the two-process tests' float64 comparison (see ``_close_f64``)."""
    return _close_f64


WORKER = ROOT / "tests" / "dist_worker.py"


class TwoRankCases:
    """The two-process (gloo, CPU) equivalence cases of a session, run by the one worker
    (``tests/dist_worker.py``) as two processes started ONCE for all the cases that the
    session's selected tests name (a module's ``CASE`` file, where its tests use
    ``run_two_ranks``): each start costs both processes seconds of imports, more than most
    cases' own work. A case that fails, or hangs for ``timeout`` seconds, fails its own tests
    with the ranks' log; the cases after it start again in a new pair of processes."""

    def __init__(self, root: Path, planned: list[Path], timeout: float = 240.0) -> None:
        self.root, self.timeout = root, timeout
        self.planned = list(dict.fromkeys(case.resolve() for case in planned))
        self.done: dict[Path, Path | str] = {}  # case -> its results' folder, or why it failed
        self.launches = 0

    def __call__(self, case: Path, tmp: Path | None = None) -> list[dict]:
        """What each rank saved for ``case`` (rank 0 holds the case's one-process
        ``reference`` too); ``tmp`` is kept for the callers, the session's folder is used."""
        case = case.resolve()
        if case not in self.done:
            self._run([c for c in self.planned if c not in self.done] + [case] * (
                case not in self.planned))
        folder = self.done[case]
        if isinstance(folder, str):
            pytest.fail(folder, pytrace=False)
        results = [torch.load(folder / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
        assert [r["group_size"] for r in results] == [2, 2], "the ranks did not form one group of 2"
        return results

    def _run(self, cases: list[Path]) -> None:
        """Run ``cases`` in order; after a failed case, start the rest again."""
        while cases:
            launch = self.root / f"launch{self.launches}"
            self.launches += 1
            failure = self._launch(cases, launch)
            finished = 0
            while finished < len(cases) and all(
                    (launch / str(finished) / f"rank{r}.pt").exists() for r in range(2)):
                self.done[cases[finished]] = launch / str(finished)
                finished += 1
            if finished < len(cases):
                self.done[cases[finished]] = (f"distributed case {cases[finished].name}: "
                                              f"{failure or 'no results'}")
                finished += 1
            cases = cases[finished:]

    def _launch(self, cases: list[Path], out: Path) -> str | None:
        """Start the two ranks on ``cases``; return None when both exit 0, else what went wrong
        with their logs. A rank that fails stops the other (which may wait in a collective)."""
        out.mkdir(parents=True)
        env = {**child_env(1), "PYTHONWARNINGS": "ignore"}  # this checkout's package
        logs = [out / f"rank{rank}.log" for rank in range(2)]
        procs = []
        for rank in range(2):
            with logs[rank].open("w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(WORKER), str(rank), "2", str(out), *map(str, cases)],
                    env=env, stdout=log, stderr=subprocess.STDOUT))
        progress, since, why = -1, time.monotonic(), None
        while why is None and any(p.poll() is None for p in procs):
            finished = len(list(out.glob("*/rank1.pt")))
            if finished != progress:
                progress, since = finished, time.monotonic()
            if any(p.returncode for p in procs):
                why = "a rank failed"
                time.sleep(0.5)  # the other rank's error, if it has one, reaches its log
            elif time.monotonic() - since > self.timeout:
                why = f"no case ended in {self.timeout:.0f} s"
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if why is None and all(p.returncode == 0 for p in procs):
            return None
        return (why or "a rank failed") + "".join(
            f"\nrank {r} (exit {p.returncode}):\n{logs[r].read_text()[-4000:]}"
            for r, p in enumerate(procs))


def _planned_cases(session: pytest.Session) -> list[Path]:
    """The ``CASE`` files of the selected tests that use ``run_two_ranks``."""
    cases = []
    for item in session.items:
        case = getattr(getattr(item, "module", None), "CASE", None)
        if isinstance(case, Path) and "run_two_ranks" in getattr(item, "fixturenames", ()):
            cases.append(case)
    return cases


@pytest.fixture(scope="session")
def run_two_ranks(request, tmp_path_factory) -> TwoRankCases:
    """``run_two_ranks(CASE, tmp) -> [rank 0's results, rank 1's]``: the launcher of the
    two-process (gloo, CPU) equivalence tests (:class:`TwoRankCases`)."""
    return TwoRankCases(tmp_path_factory.mktemp("two_ranks"), _planned_cases(request.session))


def child_env(threads: int = 1) -> dict[str, str]:
    """The environment of a program a test starts: this checkout importable, ``threads``
    threads a process, no GPU, logs unbuffered."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


class TwoProcessLauncher:
    """``accelerate launch --multi_gpu --num_processes 2`` on the CPU (two gloo processes, one
    thread each: ``--cpu --num_processes 2`` would start one), the launcher beside this Python;
    a test skips where it is not installed."""

    def prefix(self, processes: int = 2) -> list[str]:
        """The launcher's command line for ``processes`` CPU processes (``--multi_gpu`` from 2
        on), for a test that drives the processes itself."""
        exe = shutil.which("accelerate", path=str(Path(sys.executable).parent))
        if exe is None:
            pytest.skip("the accelerate launcher is not installed beside this Python")
        multi = ["--multi_gpu"] if processes > 1 else []
        return [exe, "launch", *multi, "--num_processes", str(processes), "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no"]

    def machine_prefix(self, machine_rank: int, port: int, machines: int = 2) -> list[str]:
        """The launcher's command line for machine ``machine_rank`` of ``machines``, one CPU
        process each, all on this machine and meeting at 127.0.0.1:``port``: what each node of
        a cluster starts (tests/engine/test_several_nodes.py)."""
        cmd = self.prefix(machines)
        cmd[cmd.index("--num_machines") + 1] = str(machines)
        return [*cmd, "--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1",
                "--main_process_port", str(port)]

    def __call__(self, script: str | Path, *args: str, timeout: float = 600,
                 engine: bool = True) -> subprocess.CompletedProcess:
        """Run ``script *args`` as two processes and fail the test, with their log, unless it
        exits 0 (and, ``engine`` runs, the engine reports 2 processes)."""
        proc = subprocess.run([*self.prefix(), str(script), *map(str, args)], env=child_env(1),
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-4000:]
        if engine:
            assert "on 2 process(es)" in proc.stderr, proc.stderr[-4000:]
        return proc


@pytest.fixture(scope="session")
def launch_two() -> TwoProcessLauncher:
    """``launch_two(script, *args)``: a program as two gloo CPU processes
    (:class:`TwoProcessLauncher`)."""
    return TwoProcessLauncher()


class TwoProcessRecipeRuns:
    """The recipe-level two-process runs of a session, as ONE ``accelerate launch`` of
    ``tests/launch_worker.py`` for all the runs files that the session's selected tests name (a
    module's ``RUNS`` file, where its tests use ``two_process_runs``): each launch costs the
    launcher and both ranks their imports (~20 CPU s), more than the tiny runs train. Each runs
    file's ``prepare`` (if any) runs in this process first. ``runs(RUNS) -> folder`` holding
    ``two/`` and ``mutant/`` (launch_worker.py). A runs file that fails, or a launch that
    passes ``timeout`` seconds a file, fails that file's tests with the ranks' log; the files
    after it start again in a new launch."""

    def __init__(self, launcher: TwoProcessLauncher, root: Path, planned: list[Path],
                 timeout: float = 300.0) -> None:
        self.launcher, self.root, self.timeout = launcher, root, timeout
        self.planned = list(dict.fromkeys(path.resolve() for path in planned))
        self.folders: dict[Path, Path] = {}
        self.modules: dict[Path, ModuleType] = {}
        self.failures: dict[Path, str] = {}

    def __call__(self, runs: Path) -> Path:
        runs = runs.resolve()
        if runs not in self.folders:
            self._launch([p for p in self.planned if p not in self.folders] + [runs] * (
                runs not in self.planned))
        folder = self.folders[runs]
        if not self._done(folder):
            pytest.fail(f"two-process runs {runs.name}: {self.failures.get(runs, 'no results')}",
                        pytrace=False)
        return folder

    def module(self, runs: Path) -> ModuleType:
        """The runs file as a module (its ``run`` gives a test the one-process reference)."""
        runs = runs.resolve()
        if runs not in self.modules:
            spec = importlib.util.spec_from_file_location(runs.stem, runs)
            assert spec is not None and spec.loader is not None
            self.modules[runs] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self.modules[runs])
        return self.modules[runs]

    def _launch(self, paths: list[Path]) -> None:
        for path in paths:
            self.folders[path] = self.root / f"{len(self.folders)}-{path.stem}"
            self.folders[path].mkdir(parents=True)
            prepare = getattr(self.module(path), "prepare", None)
            if prepare is not None:
                prepare(self.folders[path])
        while paths:
            why = self._start([str(x) for path in paths for x in (path, self.folders[path])],
                              self.timeout * len(paths))
            failed = next((p for p in paths if not self._done(self.folders[p])), None)
            if failed is None:
                return
            self.failures[failed] = why or "the launch ended without its results"
            paths = paths[paths.index(failed) + 1:]

    @staticmethod
    def _done(folder: Path) -> bool:
        return all((folder / f"done{rank}").exists() for rank in range(2))

    def _start(self, args: list[str], timeout: float) -> str | None:
        """One launch; what went wrong (with the ranks' log), None when it exited 0."""
        proc = subprocess.Popen([*self.launcher.prefix(), str(LAUNCH_WORKER), *args],
                                env=child_env(1), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the launcher and both ranks
            log, _ = proc.communicate()
            return f"no end in {timeout:.0f} s:\n{log[-6000:]}"
        return None if proc.returncode == 0 else (
            f"the launch failed ({proc.returncode}):\n{log[-6000:]}")


LAUNCH_WORKER = ROOT / "tests" / "launch_worker.py"


def _planned_runs_files(session: pytest.Session) -> list[Path]:
    """The ``RUNS`` files of the selected tests that use ``two_process_runs``."""
    return [item.module.RUNS for item in session.items  # type: ignore[attr-defined]
            if isinstance(getattr(getattr(item, "module", None), "RUNS", None), Path)
            and "two_process_runs" in getattr(item, "fixturenames", ())]


@pytest.fixture(scope="session")
def two_process_runs(request, tmp_path_factory, launch_two) -> TwoProcessRecipeRuns:
    """``two_process_runs(RUNS) -> folder``: the recipe-level two-process runs of the session,
    one launch for all (:class:`TwoProcessRecipeRuns`)."""
    return TwoProcessRecipeRuns(launch_two, tmp_path_factory.mktemp("two_process_runs"),
                                _planned_runs_files(request.session))


def param_gap(run: dict, ref: dict) -> float:
    """The largest parameter difference between two recorded runs (``run["params"]``)."""
    return max(float((p - q).abs().max()) for p, q in zip(run["params"], ref["params"]))


def _ranks_match_one_process(runs: list[dict], ref: dict) -> None:
    """Two ranks' records against the one-process ``ref`` in float64: each step's rank losses
    average to the reference loss, every rank's gradients equal it, and so do the parameters
    after the last step (records ``loss``, ``grads``, ``params`` per step)."""
    assert ref["loss"][0].dtype == torch.float64
    for step in range(len(ref["loss"])):
        _close_f64((runs[0]["loss"][step] + runs[1]["loss"][step]) / 2, ref["loss"][step])
        for run in runs:
            for g, g_ref in zip(run["grads"][step], ref["grads"][step]):
                _close_f64(g, g_ref)
    for run in runs:
        assert param_gap(run, ref) < 1e-10


@pytest.fixture(scope="session")
def ranks_match_one_process() -> Callable[[list[dict], dict], None]:
    """``check(runs, ref)``: the two-process equivalence of the float64 method cases."""
    return _ranks_match_one_process


@pytest.fixture(scope="session")
def gap() -> Callable[[dict, dict], float]:
    """``gap(run, ref)``: :func:`param_gap` (what a mutated run must exceed)."""
    return param_gap


@pytest.fixture
def fresh_accelerate():
    """Reset accelerate's process-wide state around an in-process training run."""
    from contrastive.engine import reset_accelerate_state

    reset_accelerate_state()
    yield
    reset_accelerate_state()


# ---- the learning checks' runs: started at collection, in the background, checks last -------

class LearningRuns:
    """The learning checks' runs of a session (recipes, or a check's own script), started when
    the session's tests are known (:func:`pytest_collection_finish`; the checks themselves run
    last, :func:`pytest_collection_modifyitems`), as many at a time as there are cores (at most
    4), at a lower CPU priority (nice 10): they use the cores that the rest of the suite leaves
    idle (single-threaded Python, waits on other programs) and the checks that read them wait
    only for what is left. Each run is pinned to one thread, so neither the load nor the runs
    beside it change a figure. A test module declares what its selected tests need with
    ``planned_runs(item) -> [(key, program, args, cpu_s)]``: ``program`` a recipe's name
    (``recipes/<name>.py``) or the path of a ``.py`` script; each is started as
    ``python program *args --output-dir DIR``; ``cpu_s`` is the run's measured CPU seconds
    alone (nice 5, one thread, AVX2 kind), by which the session starts the longest runs first,
    so that the last one to finish is a short one. ``get(key)`` waits for that run and returns
    DIR (a failed run raises in the tests that use it)."""

    def __init__(self, root: Path, nice: int = 10) -> None:
        self.root, self.nice = root, nice
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
        self.done: dict[Any, tuple[Path, Future]] = {}
        self.running: list[subprocess.Popen] = []
        self.closed = False

    def submit(self, key: Any, program: str, args: list[str]) -> None:
        if key not in self.done:
            out = self.root / f"run{len(self.done)}"
            self.done[key] = (out, self.pool.submit(self._run, program, [*args, "--output-dir",
                                                                         str(out)]))

    def _run(self, program: str, args: list[str]) -> None:
        script = program if program.endswith(".py") else str(ROOT / "recipes" / f"{program}.py")
        cmd = [sys.executable, script, *args]
        if self.nice and shutil.which("nice"):
            cmd = ["nice", "-n", str(self.nice), *cmd]
        if self.closed:
            raise RuntimeError("the session ended before this run started")
        proc = subprocess.Popen(cmd, env=child_env(1), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.running.append(proc)
        try:
            _, err = proc.communicate(timeout=3600)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if proc.returncode != 0:
            raise AssertionError(f"{Path(script).name} {' '.join(args)} failed "
                                 f"({proc.returncode}):\n{err[-4000:]}")

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
        for key, program, args, _ in sorted(planned, key=lambda plan: -plan[3]):  # longest first
            runs.submit(key, program, args)


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
