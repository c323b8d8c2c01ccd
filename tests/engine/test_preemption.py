"""Preemption as Slurm, systemd and ``accelerate launch`` do it, on real recipe processes.

SIGTERM (or SIGINT) to the whole process group, loader workers included, to the main process
alone, or to the launcher alone: the run saves a checkpoint, exits with status 75 and says
"stopped" in ``run_state.json``, and ``--resume auto`` ends bit-identical to the uninterrupted
run (model, optimiser and RNG fingerprints of the final checkpoint, every logged loss). The
tests with a reference run go through each data adapter (``moco_cifar``: images, ``clip``:
image-text pairs, ``simcse``: text); the labelled-text adapter (``bert_finetune``, whose script
ends through :func:`contrastive.engine.cli`) in the group SIGTERM test only: the signal
handling is the engine's, the same for every adapter, and only the exit path differs.

The default run keeps the image kit (``DEFAULT_CASE``); the other kits' cases are ``-m slow``:
the stop (signal to request, checkpoint, status 75, loader workers) is the engine's and the same
for every kit, each kit's resume from a checkpoint is bit-identical in
tests/engine/test_resume_max_steps.py (a ``--max-steps`` stop, by default), and the
labelled-text kit's own exit path (status 75 through :func:`~contrastive.engine.cli`) is
:func:`test_a_stop_passes_through_cli_with_status_75`. Measured cost of the three (setup + call,
load about 10): labelled-text 85 + 176 s, text 90 + 131 s, image-text 35 + 110 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# the recipe helpers of tests/recipes/conftest.py (tests import nothing under importlib mode)
_spec = importlib.util.spec_from_file_location(
    "_recipe_helpers", Path(__file__).resolve().parents[1] / "recipes" / "conftest.py")
rx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rx)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_safe_resume import CLIP, LABELLED, SIMCSE  # noqa: E402

EXIT_STOPPED = 75
N = 20  # 64 images / batch 16 = 4 steps per epoch x 5 epochs
ARGS = ["--epochs", "5", "--save-every-steps", "0", "--knn-every", "0", "--pass-indices"]
CASES = {"image": ("moco_cifar", [*rx.TINY, *rx.SMALL["moco_cifar"], *ARGS]),
         "image-text": ("clip", [*CLIP, "--epochs", "5", "--save-every-steps", "0"]),
         "text": ("simcse", [*SIMCSE, "--epochs", "5", "--save-every-steps", "0"]),
         "labelled-text": ("bert_finetune", [*LABELLED, "--epochs", "5", "--save-every-steps",
                                             "0"])}


DEFAULT_CASE = "image"  # the kit whose cases run by default (see the module docstring)


@pytest.fixture(scope="module", params=[
    pytest.param(k, marks=() if k == DEFAULT_CASE else pytest.mark.slow) for k in sorted(CASES)])
def case(request) -> tuple[str, list[str]]:
    """(recipe, its full arguments) of one data adapter."""
    return CASES[request.param]


def _cmd(case: tuple[str, list[str]], *extra: str) -> list[str]:
    return [rx.PYTHON, str(rx.RECIPES / f"{case[0]}.py"), *case[1], *extra]


def _run_case(case: tuple[str, list[str]], *extra: str) -> subprocess.CompletedProcess:
    return rx.run_recipe(case[0], *case[1], *extra, tiny=False)

# Becomes a child subreaper, starts the command in a new session, waits for the first logged
# loss, sends the signal to the group or to the started process (the launcher) alone, then
# reaps every process that ends up its child (orphans are re-parented to it) and prints their
# exit statuses: the orphaned training process's status can be read, as a scheduler would.
HARNESS = r"""
import ctypes, json, os, signal, subprocess, sys, time
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit(99)
watch, target, signame, cmd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
proc = subprocess.Popen(cmd, start_new_session=True)
signal.signal(signal.SIGALRM, lambda *a: os.killpg(proc.pid, signal.SIGKILL))
signal.alarm(240)
while proc.poll() is None:
    try:
        if '"loss"' in open(watch).read():
            break
    except FileNotFoundError:
        pass
    time.sleep(0.05)
for name in signame.split(","):
    (os.killpg if target == "group" else os.kill)(proc.pid, getattr(signal, name))
    time.sleep(0.2)
statuses = {}
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    statuses[pid] = os.waitstatus_to_exitcode(status)
print(json.dumps({"launcher": proc.pid, "exit": statuses}))
"""


def _preempt(tmp_path: Path, cmd: list[str], out: Path, target: str, signals: str,
             env: dict[str, str] | None = None) -> tuple[dict, dict]:
    """Run ``cmd`` under the harness; return (exit statuses by pid, run_state.json)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("child subreaper (prctl) is Linux only")
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    proc = subprocess.run([sys.executable, str(harness), str(out / "metrics.jsonl"), target,
                           signals, *cmd], env=env or rx.env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    state_file = out / "run_state.json"
    return report, json.loads(state_file.read_text()) if state_file.exists() else {}


def _fingerprints(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / f"step_{step:08d}" / "meta.json")
                      .read_text())["fingerprints"]


def _assert_same_as(reference: Path, out: Path, steps: int = N) -> None:
    """Final checkpoints (of step ``steps``) equal (model incl. queue, optimiser, RNG of every
    process) and every step's loss equal, each step logged once."""
    assert _fingerprints(out, steps) == _fingerprints(reference, steps)
    ma = load_file(str(reference / "checkpoints" / f"step_{steps:08d}" / "model.safetensors"))
    mb = load_file(str(out / "checkpoints" / f"step_{steps:08d}" / "model.safetensors"))
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    losses = {}
    for d in (reference, out):
        recs = [r for r in rx.read_metrics(d) if "loss" in r]
        logged = [r["step"] for r in recs]
        assert logged == list(range(1, steps + 1)), f"{d}: steps logged {logged}"
        losses[d] = [r["loss"] for r in recs]
    assert losses[reference] == losses[out]


@pytest.fixture(scope="module")
def reference(case, tmp_path_factory):
    """The uninterrupted run (no loader workers: they must not change anything either)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    _run_case(case, "--output-dir", str(out))
    return out


def _stopped_at(out: Path, state: dict, reason: str, steps: int = N) -> int:
    assert state["state"] == "stopped" and state["resumable"] is True, state
    assert reason in state["reason"], state
    k = state["step"]
    assert 0 < k < steps, f"the stop came after the run ended (step {k}): make the run longer"
    assert state["checkpoint"] == f"checkpoints/step_{k:08d}"
    assert (out / state["checkpoint"] / "meta.json").is_file()
    return k


def test_group_sigterm_with_workers_saves_exits_75_and_resumes_exactly(case, reference,
                                                                       tmp_path):
    """Slurm / systemd: SIGTERM to every process of the group, twice (a launcher forwards a
    copy), while 2 loader workers run. Before the fix the workers died first and the main
    process crashed with "DataLoader worker ... killed by signal: Terminated" (exit 1)."""
    out = tmp_path / "run"
    cmd = _cmd(case, "--num-workers", "2", "--output-dir", str(out))
    proc = subprocess.Popen(cmd, env=rx.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").exists() and '"loss"' in (out / "metrics.jsonl").read_text():
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED, err[-3000:]
    assert "killed by signal" not in err
    state = json.loads((out / "run_state.json").read_text())
    k = _stopped_at(out, state, "SIGTERM")
    assert state["exit_code"] == EXIT_STOPPED and state["step"] == k
    deadline = time.time() + 15  # no worker outlives its main process
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.time() < deadline, "loader workers outlived the main process"
        time.sleep(0.1)

    done = _run_case(case, "--num-workers", "2", "--output-dir", str(out), "--resume", "auto")
    assert f"at step {k}" in done.stderr and "resume verified" in done.stderr
    state = json.loads((out / "run_state.json").read_text())
    assert state["state"] == "completed" and state["step"] == N and state["exit_code"] == 0
    _assert_same_as(reference, out)


def test_a_stop_passes_through_cli_with_status_75():
    """The labelled-text recipes end through :func:`~contrastive.engine.cli`
    (``sys.exit(cli(main, ...))``): the status 75 with which :func:`~contrastive.engine.run`
    leaves a stopped run must reach the launcher unchanged, not become 0 or 2."""
    from contrastive.engine import cli

    def stopped(argv: list[str] | None) -> None:
        raise SystemExit(EXIT_STOPPED)  # what run() raises after a stop's checkpoint

    with pytest.raises(SystemExit) as leaving:
        cli(stopped, "bert_finetune.py", [])
    assert leaving.value.code == EXIT_STOPPED


def test_orphaned_run_saves_and_stops_when_its_launcher_dies(tmp_path):
    """SIGTERM to the launcher alone (here a plain Python parent, which dies of it, as
    accelerate's one-process launcher does): the training process is re-parented, notices it
    within a step, saves and exits 75, instead of training on as an orphan."""
    out = tmp_path / "run"
    launcher = [sys.executable, "-c", "import subprocess, sys; "
                "sys.exit(subprocess.call(sys.argv[1:]))"]
    env = rx.env()
    env["ACCELERATE_USE_CPU"] = "False"  # as accelerate launch sets it: the parent is watched
    cmd = [*launcher, *rx.recipe_cmd("moco_cifar", *ARGS, "--output-dir", str(out))]
    report, state = _preempt(tmp_path, cmd, out, "launcher", "SIGTERM", env=env)
    launcher_pid = str(report["launcher"])
    assert report["exit"][launcher_pid] == -signal.SIGTERM
    assert [v for k, v in report["exit"].items() if k != launcher_pid] == [EXIT_STOPPED], report
    _stopped_at(out, state, "launcher exited")
    assert report["exit"][str(state["pid"])] == EXIT_STOPPED


@pytest.mark.slow
@pytest.mark.parametrize("target,signals,workers", [
    ("main", "SIGTERM", "2"),  # the main process alone: its workers keep serving it
    ("group", "SIGINT", "2"),  # Ctrl-C in a terminal
    ("group", "SIGTERM", "0"),
])
def test_signal_variants_resume_exactly(case, reference, tmp_path, target, signals, workers):
    if case[0] == "bert_finetune":
        pytest.skip("the engine's signal handling, covered by the text case (simcse)")
    out = tmp_path / "run"
    cmd = _cmd(case, "--num-workers", workers, "--output-dir", str(out))
    report, state = _preempt(tmp_path, cmd, out, target, signals)
    assert report["exit"][str(report["launcher"])] == EXIT_STOPPED, report
    k = _stopped_at(out, state, signals)
    done = _run_case(case, "--num-workers", workers, "--output-dir", str(out), "--resume", "auto")
    assert f"at step {k}" in done.stderr
    _assert_same_as(reference, out)


@pytest.mark.slow
def test_sigterm_to_accelerate_launch_alone_one_process(case, reference, tmp_path, launch_two):
    """``accelerate launch`` (one process) dies of SIGTERM without forwarding it: the training
    process notices its launcher's exit (``--stop-if-orphaned auto``), saves and exits 75."""
    if case[0] == "bert_finetune":
        pytest.skip("the engine's signal handling, covered by the text case (simcse)")
    out = tmp_path / "run"
    launch = launch_two.prefix(processes=1)
    args = ["--num-workers", "2", "--output-dir", str(out)]
    report, state = _preempt(tmp_path, [*launch, *_cmd(case, *args)[1:]], out, "launcher",
                             "SIGTERM")
    assert report["exit"][str(state["pid"])] == EXIT_STOPPED, report
    k = _stopped_at(out, state, "launcher exited")
    done = subprocess.run([*launch, *_cmd(case, *args, "--resume", "auto")[1:]],
                          env=rx.env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"at step {k}" in done.stderr
    _assert_same_as(reference, out)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("target", ["group", "launcher"])
def test_two_processes_stop_on_sigterm_and_resume_exactly(tmp_path, target, launch_two):
    """``accelerate launch --multi_gpu --num_processes 2`` with loader workers: SIGTERM to the
    launcher's group or to the launcher alone (torchrun forwards it to each process's own
    session). Both processes save one checkpoint at the same step and exit 75 (the launcher
    reports 1; run_state.json says "stopped"); the resume equals an uninterrupted 2-process
    run."""
    launch = launch_two.prefix()
    env = rx.env()
    env["OMP_NUM_THREADS"] = "1"

    def cmd(out: Path, *extra: str) -> list[str]:
        return [*launch, *rx.recipe_cmd("moco_cifar", *ARGS, "--num-workers", "2",
                                        "--output-dir", str(out), *extra)[1:]]

    ref, out = tmp_path / "ref", tmp_path / "run"
    done = subprocess.run(cmd(ref), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report, state = _preempt(tmp_path, cmd(out), out, target, "SIGTERM", env=env)
    assert report["exit"][str(report["launcher"])] != 0
    k = _stopped_at(out, state, "SIGTERM")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step_{k:08d}"]
    done = subprocess.run(cmd(out, "--resume", "auto"), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"at step {k}" in done.stderr
    _assert_same_as(ref, out)
