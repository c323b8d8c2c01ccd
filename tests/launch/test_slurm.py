"""``contrastive-slurm``: the rendered sbatch script run under bash with a fake scheduler.

Fake ``srun`` and ``scontrol`` on PATH record their calls; ``srun`` runs its command once per
node with that node's ``SLURM_NODEID``, as Slurm runs one task per node. A fake Python records
the ``accelerate launch`` command line of each node, which accelerate's own parser then reads,
and plays the run's ending (a ``run_state.json`` from the engine's writer, accelerate's exit
status). The slow test runs a real recipe through the script, stops it with SIGTERM to the job
step as ``--signal`` does, and runs the requeued job to the end.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contrastive.launch.slurm import SlurmJob, main, render, slurm_seconds

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "moco_cifar.py"
JOB_ID = "4242"

SRUN = """#!/bin/bash
options=()
while [[ "$1" == --* ]]; do options+=("$1"); shift; done
printf '%s\\n' "${options[*]}" >> "$CALLS/srun"  # srun's own options
echo "${SRUN_CPUS_PER_TASK:-}" > "$CALLS/srun_cpus"
if [ -n "${FAKE_SESSION:-}" ]; then  # the job step in its own session, as slurmstepd runs it
    SLURM_NODEID=0 SLURM_PROCID=0 setsid "$@" & echo $! > "$CALLS/step.pid"; wait $!; exit $?
fi
status=0
for ((node = 0; node < SLURM_NNODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node "$@" || status=$?
done
exit $status
"""
SCONTROL = """#!/bin/bash
printf '%s\\n' "$*" >> "$CALLS/scontrol"
if [ "$1 $2" = "show hostnames" ]; then printf '%s\\n' $FAKE_HOSTS; fi
"""
PYTHON = """#!/bin/bash
if [ "$1" = -c ]; then exec PYTHON_HERE "$@"; fi  # the script reading run_state.json
printf '%s\\n' "$@" > "$CALLS/task.$SLURM_NODEID"  # the task: accelerate launch, or the recipe
if [ -n "${FAKE_STATE:-}" ]; then cp "$FAKE_STATE" "$FAKE_OUT/run_state.json"; fi
exit "${FAKE_EXIT:-0}"
"""


def _task(cluster: dict, node: int) -> list[str]:
    """The command line the fake Python was given on ``node``."""
    return (cluster["calls"] / f"task.{node}").read_text().splitlines()


@pytest.fixture
def cluster(tmp_path: Path) -> dict:
    """A fake scheduler's bin folder, its call log folder and the job's environment."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL),
                       ("python", PYTHON.replace("PYTHON_HERE", shlex.quote(sys.executable)))):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "CALLS": str(calls), "SLURM_JOB_ID": JOB_ID, "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "FAKE_HOSTS": "gpu07 gpu08",
           "FAKE_OUT": str(tmp_path / "run")}
    return {"bin": bin_dir, "calls": calls, "env": env, "tmp": tmp_path}


def _job(cluster: dict, *args: str, **kw) -> SlurmJob:
    kw = {"nodes": 2, "gpus_per_node": 8, "time": "4:00:00", "partition": "gpu",
          "python": str(cluster["bin"] / "python"), "workdir": str(cluster["tmp"]), **kw}
    return SlurmJob(recipe=str(RECIPE), args=args, **kw)


def _run(cluster: dict, script: str, **env: str) -> subprocess.CompletedProcess:
    path = cluster["tmp"] / "job.sbatch"
    path.write_text(script)
    return subprocess.run(["bash", str(path)], cwd=cluster["tmp"], env={**cluster["env"], **env},
                          capture_output=True, text=True, timeout=60)


def _calls(cluster: dict, name: str) -> list[str]:
    log = cluster["calls"] / name
    return log.read_text().splitlines() if log.exists() else []


def test_two_nodes_of_eight_gpus_launch_as_slurm_and_accelerate_expect(cluster):
    from accelerate.commands.launch import launch_command_parser

    out = cluster["tmp"] / "run"
    script = render(_job(cluster, "--data", "cifar10:/my data", "--output-dir", str(out),
                         cpus_per_task=64))
    header = dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines()
                  if line.startswith("#SBATCH --") and "=" in line)
    assert header["nodes"] == "2" and header["ntasks-per-node"] == "1"
    assert header["gpus-per-node"] == "8" and header["time"] == "4:00:00"
    assert header["partition"] == "gpu" and header["signal"] == "TERM@300"
    assert header["open-mode"] == "append" and "#SBATCH --requeue\n" in script
    assert header["cpus-per-task"] == "64"

    done = _run(cluster, script, SLURM_CPUS_PER_TASK="64")
    assert done.returncode == 0, done.stderr
    srun = _calls(cluster, "srun")
    assert srun == ["--ntasks-per-node=1 --kill-on-bad-exit=0"], srun
    assert (cluster["calls"] / "srun_cpus").read_text() == "64\n"  # the task's cores
    assert _calls(cluster, "scontrol") == ["show hostnames gpu[07-08]"]  # no requeue
    for node in (0, 1):
        task = _task(cluster, node)
        assert task[:2] == ["-m", "accelerate.commands.launch"], task
        launch = launch_command_parser().parse_args(task[2:])
        assert launch.multi_gpu and launch.num_machines == 2 and launch.num_processes == 16
        assert launch.machine_rank == node
        assert launch.main_process_ip == "gpu07" and launch.main_process_port == 29500
        assert launch.training_script == str(RECIPE)
        assert launch.training_script_args == ["--data", "cifar10:/my data", "--output-dir",
                                               str(out), "--resume", "auto"]


@pytest.mark.parametrize("state,requeued,status", [
    ("stopped", True, 0), ("completed", False, 0), ("failed", False, 1), (None, False, 1)])
def test_the_job_requeues_only_a_run_that_stopped_with_a_checkpoint(cluster, state, requeued,
                                                                    status):
    """The run's ``run_state.json`` (written by the engine's own writer) decides, not the exit
    status: accelerate reports 1 for a stop and for a failure alike."""
    from contrastive.engine.run_state import write_run_state

    out, played = cluster["tmp"] / "run", cluster["tmp"] / "played"
    out.mkdir()
    env = {"FAKE_EXIT": "0" if state == "completed" else "1"}
    if state:
        played.mkdir()
        write_run_state(played, state, step=7, exit_code={"stopped": 75}.get(state, 0))
        env["FAKE_STATE"] = str(played / "run_state.json")
    done = _run(cluster, render(_job(cluster, "--output-dir", str(out))), **env)
    assert done.returncode == status, done.stderr
    assert (f"requeue {JOB_ID}" in _calls(cluster, "scontrol")) == requeued, done.stderr


def test_a_stopped_state_left_by_an_earlier_job_does_not_requeue(cluster):
    """A job whose run never started (here: the launcher fails at once) finds the previous
    job's "stopped": requeueing it would loop for ever."""
    from contrastive.engine.run_state import write_run_state

    out = cluster["tmp"] / "run"
    out.mkdir()
    write_run_state(out, "stopped", step=7, exit_code=75)
    done = _run(cluster, render(_job(cluster, "--output-dir", str(out))), FAKE_EXIT="1")
    assert done.returncode == 1 and "not requeued" in done.stderr
    assert f"requeue {JOB_ID}" not in _calls(cluster, "scontrol")


def test_the_script_reads_the_engines_run_state_file():
    from contrastive.engine.run_state import RUN_STATE_FILE

    assert f'RUN_STATE="$OUTPUT_DIR/{RUN_STATE_FILE}"' in render(SlurmJob(str(RECIPE)))


def test_one_process_runs_the_recipe_as_the_task_and_the_defaults_are_explicit(cluster):
    """One node of one GPU: no launcher between Slurm and the run (accelerate's one-process
    launcher dies of the SIGTERM, which would end the job step while the run saves)."""
    job = _job(cluster, "--resume=auto", nodes=1, gpus_per_node=1, signal_seconds=90,
               job_name="mine", sbatch=("constraint=a100", "--exclusive"))
    script = render(job)
    for line in ("--job-name=mine", "--signal=TERM@90", "--constraint=a100", "--exclusive"):
        assert f"#SBATCH {line}\n" in script
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=90\n" in script
    done = _run(cluster, script, SLURM_NNODES="1")
    assert done.returncode == 0, done.stderr
    # --resume=auto kept once; the recipe's default run folder made explicit
    assert _task(cluster, 0) == [str(RECIPE), "--resume=auto", "--output-dir", "runs/moco_cifar"]


@pytest.mark.parametrize("argv,message", [
    (["render", "--nodes", "2"], "no recipe: name its file first"),
    (["render", "recipes/missing.py"], "recipe recipes/missing.py not found"),
    (["render", str(RECIPE), "--nodes", "0"], "--nodes 0: must be 1 or more"),
    (["render", str(RECIPE), "--gpus-per-node", "0"], "--gpus-per-node 0: must be 1 or more"),
    (["render", str(RECIPE), "--time", "1:00:00", "--signal-seconds", "3600"],
     "below the time limit (3600 s)"),
    (["render", str(RECIPE), "--time", "an hour"], "--time 'an hour': expected minutes"),
    (["render", str(RECIPE), "--", "--resume", "runs/x/checkpoints/step_00000010"],
     "leave --resume out"),
])
def test_bad_input_is_one_line_and_status_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_submit_runs_sbatch_on_the_written_script_or_says_it_is_missing(cluster, monkeypatch,
                                                                        capsys):
    monkeypatch.chdir(cluster["tmp"])
    monkeypatch.setenv("PATH", str(cluster["bin"]))
    assert main(["submit", str(RECIPE)]) == 2
    assert "sbatch not found on PATH" in capsys.readouterr().err
    sbatch = cluster["bin"] / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho "$@" > {cluster["calls"]}/sbatch\n')
    sbatch.chmod(0o755)
    assert main(["submit", str(RECIPE), "--script", "job.sh"]) == 0
    assert (cluster["calls"] / "sbatch").read_text().split() == ["job.sh"]
    assert (cluster["tmp"] / "job.sh").read_text().startswith("#!/bin/bash\n")


def test_slurm_time_formats():
    assert [slurm_seconds(t) for t in ("90", "30:15", "24:00:00", "2-00", "1-12:30",
                                       "1-00:00:05")] == [5400, 1815, 86400, 172800, 131400,
                                                          86405]


# ---- the requeue with a real run (slow) ------------------------------------------------------

STEPS = 20  # 64 images / batch 16 x 5 epochs (the recipe helpers: the rx fixture)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_before_the_limit_requeues_and_the_requeued_job_completes(cluster, processes,
                                                                         rx, free_port):
    """SIGTERM to the job step (what ``--signal=TERM@S`` sends): the run saves and exits 75,
    the script calls ``scontrol requeue``; the requeued job resumes at that step and
    completes, and does not requeue again. One process (the recipe is the task) and two
    (``accelerate launch --multi_gpu``, gloo on the CPU, whose launcher forwards the signal)."""
    out = cluster["tmp"] / "run"
    args = [*rx.TINY, *rx.SMALL["moco_cifar"], "--epochs", "5", "--save-every-steps", "0",
            "--knn-every", "0", "--output-dir", str(out)]
    script = render(_job(cluster, *args, nodes=1, gpus_per_node=processes, port=free_port,
                         python=sys.executable))
    env = {**cluster["env"], **rx.env(), "OMP_NUM_THREADS": "1", "SLURM_NNODES": "1",
           "FAKE_SESSION": "1", "FAKE_HOSTS": "127.0.0.1"}
    env["PATH"] = cluster["env"]["PATH"]
    path = cluster["tmp"] / "job.sbatch"
    path.write_text(script)

    job = subprocess.Popen(["bash", str(path)], cwd=cluster["tmp"], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while job.poll() is None and time.time() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and '"loss"' in metrics.read_text():
            break
        time.sleep(0.05)
    assert job.poll() is None, job.communicate()[1][-3000:]
    os.killpg(int((cluster["calls"] / "step.pid").read_text()), signal.SIGTERM)
    _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    state = json.loads((out / "run_state.json").read_text())
    assert state["state"] == "stopped" and state["exit_code"] == 75, state
    k = state["step"]
    assert 0 < k < STEPS, f"the stop came after the run ended (step {k})"
    assert _calls(cluster, "scontrol")[-1] == f"requeue {JOB_ID}"

    again = subprocess.run(["bash", str(path)], cwd=cluster["tmp"], env=env, text=True,
                           capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"at step {k}" in again.stderr
    assert f"on {processes} process(es)" in again.stderr
    state = json.loads((out / "run_state.json").read_text())
    assert state["state"] == "completed" and state["step"] == STEPS, state
    assert _calls(cluster, "scontrol").count(f"requeue {JOB_ID}") == 1
