"""``contrastive-slurm submit --submitit``: the job submitit writes and the requeue it runs.

With fake ``srun`` / ``sbatch`` on PATH, submitit's own Slurm executor writes the job for 2 nodes
x 8 GPUs; its sbatch lines, the pickled task's command and each of the 16 tasks' rendezvous
(from Slurm's variables, read by submitit's ``JobEnvironment``) are checked. The requeue runs
in submitit's local executor, which restarts a task that requeued: a fake recipe (no torch)
stops on the forwarded SIGTERM with 75, and the requeued job completes. The slow test does the
same with a real recipe and compares the resumed run's weights with an uninterrupted run's.
Skipped without submitit (the ``submitit`` extra), except the check of the error without it.
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

from contrastive.launch.slurm import SlurmJob, main

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "moco_cifar.py"
needs_submitit = pytest.mark.skipif(importlib.util.find_spec("submitit") is None,
                                    reason='the submitit extra: pip install -e ".[submitit]"')

FAKE_SLURM = {
    "srun": "#!/bin/sh\nexit 0\n",  # submitit looks for it; never run here
    "sbatch": "#!/bin/sh\necho \"Submitted batch job 4242\"\n",
}
# A recipe that records how it was started, stops on SIGTERM with 75 as the engine does, and
# completes when started again after its stop.
FAKE_RECIPE = """
import json, os, signal, sys, time
from pathlib import Path

out = Path(sys.argv[sys.argv.index("--output-dir") + 1])
out.mkdir(parents=True, exist_ok=True)
started = {"argv": sys.argv[1:], "rank": os.environ.get("RANK"),
           "usr2_ignored": signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN}
with open(out / "starts.jsonl", "a") as fh:
    fh.write(json.dumps(started) + "\\n")


def state(name, code):
    (out / "run_state.json").write_text(json.dumps({"state": name, "step": 3, "exit_code": code}))


if os.environ.get("FAKE_EXIT"):  # the outcome, at once
    code = int(os.environ["FAKE_EXIT"])
    state("stopped" if code == 75 else "failed", code)
    sys.exit(code)
if (out / "stopped").exists():
    state("completed", 0)
    sys.exit(0)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(a))
(out / "ready").touch()
while not stop:
    time.sleep(0.01)
(out / "stopped").touch()
state("stopped", 75)
sys.exit(75)
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKE_SLURM.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    return bin_dir


def _sbatch_options(script: str) -> dict[str, str | bool]:
    options: dict[str, str | bool] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --"):].partition("=")
            options[key] = value or True
    return options


@needs_submitit
def test_two_nodes_of_eight_gpus_submit_as_slurm_and_torch_expect(fake_slurm, tmp_path,
                                                                  monkeypatch, capsys):
    import submitit

    from contrastive.launch.slurm_submitit import RecipeTask

    folder, out = tmp_path / "jobs", tmp_path / "run"
    assert main(["submit", str(RECIPE), "--submitit", "--submitit-folder", str(folder),
                 "--nodes", "2", "--gpus-per-node", "8", "--time", "4:00:00", "--partition",
                 "gpu", "--account", "lab", "--cpus-per-task", "64", "--signal-seconds", "240",
                 "--port", "29512", "--python", "/opt/env/bin/python", "--sbatch",
                 "constraint=a100", "--sbatch=--exclusive", "--",
                 "--data", "cifar10:/my data", "--output-dir", str(out)]) == 0
    assert "submitted job 4242 with submitit" in capsys.readouterr().err

    script = (folder / "4242_submission.sh").read_text()
    options = _sbatch_options(script)
    expected = {"job-name": "moco_cifar", "nodes": "2", "ntasks-per-node": "8",
                "gpus-per-node": "8", "cpus-per-task": "8", "time": "240", "partition": "gpu",
                "account": "lab", "signal": "TERM@240", "requeue": True,
                "constraint": "a100", "exclusive": True, "open-mode": "append"}
    assert {k: options.get(k) for k in expected} == expected, options
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--kill-on-bad-exit=0 --cpus-per-task=8 /opt/env/bin/python -u -m " \
           f"submitit.core._submit {folder}" in srun, srun

    task = submitit.helpers.DelayedSubmission.load(folder / "4242_submitted.pkl").function
    assert isinstance(task, RecipeTask)
    train = [str(RECIPE), "--data", "cifar10:/my data", "--output-dir", str(out),
             "--resume", "auto"]
    assert task.command() == [sys.executable, *train]
    assert Path(task.workdir).resolve() == tmp_path.resolve()
    again = task.checkpoint()  # what submitit requeues: the same command
    assert again.function.command() == task.command() and not again.args

    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    for name, value in {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "16",
                        "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}.items():
        monkeypatch.setenv(name, value)
    for node in (0, 1):
        for local in range(8):
            rank = 8 * node + local
            monkeypatch.setenv("SLURM_NODEID", str(node))
            monkeypatch.setenv("SLURM_PROCID", str(rank))
            monkeypatch.setenv("SLURM_LOCALID", str(local))
            assert task.rendezvous(submitit.JobEnvironment()) == {
                "MASTER_ADDR": "gpu07", "MASTER_PORT": "29512", "WORLD_SIZE": "16",
                "RANK": str(rank), "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": "8"}


def _fake_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "fake_recipe.py"
    recipe.write_text(FAKE_RECIPE)
    return recipe


def _result(submitted, seconds: float):
    """The job's task-0 result, failing after ``seconds`` (a run that never stops would hold
    the local executor until its time limit)."""
    deadline = time.time() + seconds
    while not submitted.done() and time.time() < deadline:
        time.sleep(0.05)
    assert submitted.done(), f"the job did not end in {seconds} s:\n{submitted.stderr()}"
    return submitted.results()[0]


def _starts(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "starts.jsonl").read_text().splitlines()]


@needs_submitit
def test_a_run_stopped_with_75_is_requeued_by_submitit_with_resume_auto(tmp_path, monkeypatch):
    """submitit's local executor: SIGTERM to the job reaches the task, which forwards it to the
    run; the run exits 75, submitit's handler requeues (the local executor restarts the task
    from the pickle ``checkpoint()`` left) and the requeued run completes."""
    from contrastive.launch.slurm_submitit import submit

    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = tmp_path / "run"
    job = SlurmJob(str(_fake_recipe(tmp_path)), args=("--output-dir", str(out)), nodes=1,
                   gpus_per_node=1, time="10", workdir=str(tmp_path))
    submitted = submit(job, folder=tmp_path / "jobs", cluster="local")
    try:
        deadline = time.time() + 60
        while not (out / "ready").exists() and time.time() < deadline:
            time.sleep(0.02)
        assert (out / "ready").exists(), submitted.stderr()
        os.kill(int(submitted.job_id), signal.SIGTERM)  # the local controller forwards it
        state = _result(submitted, 60)
    finally:
        if not submitted.done():
            submitted.cancel()
    assert state["state"] == "completed", state
    starts = _starts(out)
    assert [s["argv"] for s in starts] == [["--output-dir", str(out), "--resume", "auto"]] * 2
    assert all(s["usr2_ignored"] and s["rank"] is None for s in starts), starts
    assert "the run stopped with a checkpoint at step 3; requeueing the job" in submitted.stderr()


@needs_submitit
@pytest.mark.parametrize("code", [1, 75])
def test_a_failed_run_fails_the_task_and_a_stop_outside_submitit_returns(code, tmp_path,
                                                                          monkeypatch):
    """The task in this process (submitit's Slurm environment, no submitit signal handler): a
    failure raises naming the exit status; a stop with no handler to requeue returns."""
    from contrastive.launch.slurm_submitit import RecipeTask

    for name, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "1",
                        "FAKE_EXIT": str(code)}.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    task = RecipeTask.of(SlurmJob(str(_fake_recipe(tmp_path)), args=("--output-dir", str(out)),
                                  workdir=str(tmp_path)))
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)]
    if code == 75:
        assert task()["state"] == "stopped"
    else:
        with pytest.raises(RuntimeError, match="fake_recipe.py exited with 1, not requeued"):
            task()
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)] == handlers


def test_without_submitit_a_one_line_error_names_the_extra(fake_slurm, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit fails
    assert main(["submit", str(RECIPE), "--submitit"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "contrastive[submitit]"' in err and err.count("\n") == 1, err


def test_import_contrastive_does_not_import_submitit():
    code = ("import sys, contrastive, contrastive.launch.slurm, "
            "contrastive.launch.slurm_submitit; print('submitit' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_the_task_reads_the_engines_exit_status_and_run_state_file():
    from contrastive.engine.run_state import EXIT_STOPPED, RUN_STATE_FILE
    from contrastive.launch import slurm_submitit

    assert (slurm_submitit.EXIT_STOPPED, slurm_submitit.RUN_STATE_FILE) == (EXIT_STOPPED,
                                                                            RUN_STATE_FILE)


# ---- a real run (slow) -----------------------------------------------------------------------

STEPS = 20  # 64 images / batch 16 x 5 epochs (the recipe helpers: the rx fixture)


@pytest.mark.slow
@needs_submitit
@pytest.mark.parametrize("processes", [1, 2])
def test_a_real_run_stopped_by_sigterm_is_requeued_and_ends_as_the_uninterrupted_run(
        processes, tmp_path, monkeypatch, rx, free_port):
    """moco_cifar through submitit's local executor, one task per process (two: gloo on the
    CPU, the rendezvous from submitit's environment): SIGTERM to the job after the first step;
    the run saves and exits 75, the task requeues, the requeued job resumes at that step and
    completes with the weights of the same job run without a stop."""
    import re

    import torch
    from safetensors.torch import load_file

    from contrastive.launch.slurm_submitit import submit

    for name, value in {**rx.env(), "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    args = [*rx.TINY, *rx.SMALL["moco_cifar"], "--epochs", "5", "--save-every-steps", "0",
            "--knn-every", "0"]

    def job(out: Path) -> SlurmJob:
        return SlurmJob(str(RECIPE), args=(*args, "--output-dir", str(out)), nodes=1,
                        gpus_per_node=processes, time="30", port=free_port,
                        workdir=str(tmp_path))

    stopped, through = tmp_path / "stopped", tmp_path / "through"
    submitted = submit(job(stopped), folder=tmp_path / "jobs", cluster="local")
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (
                (stopped / "metrics.jsonl").exists()
                and '"loss"' in (stopped / "metrics.jsonl").read_text()):
            time.sleep(0.05)
        os.kill(int(submitted.job_id), signal.SIGTERM)  # the local controller forwards it
        _result(submitted, 400)
    finally:
        if not submitted.done():
            submitted.cancel()
    log = submitted.stderr()
    k = int(re.search(r"the run stopped with a checkpoint at step (\d+); requeueing", log)[1])
    assert 0 < k < STEPS, f"the stop came after the run ended (step {k})"
    assert re.search(rf"resumed from \S+ at step {k} ", log.split("requeueing the job", 1)[1])
    assert f"on {processes} process(es)" in log
    state = json.loads((stopped / "run_state.json").read_text())
    assert state["state"] == "completed" and state["step"] == STEPS, state

    _result(submit(job(through), folder=tmp_path / "jobs", cluster="local"), 300)
    resumed, uninterrupted = (load_file(str(run / "checkpoints" / f"step_{STEPS:08d}" /
                                            "model.safetensors")) for run in (stopped, through))
    assert resumed.keys() == uninterrupted.keys()
    differ = [n for n in sorted(resumed) if not torch.equal(resumed[n], uninterrupted[n])]
    assert not differ, f"{len(differ)} tensors differ: {differ[:3]}"
