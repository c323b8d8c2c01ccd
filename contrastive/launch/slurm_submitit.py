"""``contrastive-slurm submit --submitit``: the Slurm job of :mod:`contrastive.launch.slurm`
submitted from Python with submitit (the ``submitit`` extra), as DINO's ``run_with_submitit.py``
and MAE's ``submitit_pretrain.py`` submit theirs::

    from contrastive.launch.slurm import SlurmJob
    from contrastive.launch.slurm_submitit import submit

    job = submit(SlurmJob("recipes/moco_r50.py", args=("--data", "/data/imagenet"), nodes=2,
                          gpus_per_node=8, time="24:00:00", partition="gpu"))
    job.results()[0]  # once the run has completed: its run_state.json, read by task 0

The job has submitit's layout, one task per GPU: each task runs one training process of the
recipe, with torch's rendezvous taken from Slurm's environment (``RANK`` = ``SLURM_PROCID``,
``LOCAL_RANK`` = ``SLURM_LOCALID``, ``WORLD_SIZE`` = ``SLURM_NTASKS``, ``MASTER_ADDR`` the job's
first host, ``MASTER_PORT`` the job's ``port``), so no launcher stands between Slurm and the run
(torchrun dies of submitit's USR2, and kills its processes 30 s after a SIGTERM). The job's
signal is SIGTERM ``signal_seconds`` before the limit, as in the sbatch template: the engine
saves a checkpoint on it and exits with 75. Each task forwards the signal (SIGTERM, or
submitit's USR2) to its training process and holds back submitit's own handler, which would
requeue the job at once and kill the run while it saves; once the process has exited with 75,
the task hands the job to that handler, which calls :meth:`RecipeTask.checkpoint` (the same
command, with ``--resume auto``) and requeues the job (``scontrol requeue``; submitit's local
executor restarts the task). ``--cpus-per-task`` keeps its meaning of the cores of a node: each
GPU's task gets its share.

``import contrastive`` does not import submitit; this module imports it only to submit or run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contrastive.launch.slurm import SlurmJob, check, slurm_seconds, training_args

__all__ = ["RecipeTask", "SubmititMissing", "executor_parameters", "submit"]

logger = logging.getLogger(__name__)

#: contrastive.engine.run_state's EXIT_STOPPED and RUN_STATE_FILE, not imported: a task stays a
#: small process beside the run, without torch (tests/launch/test_slurm_submitit.py ties them)
EXIT_STOPPED = 75
RUN_STATE_FILE = "run_state.json"


class SubmititMissing(ImportError):
    """submitit is not installed (one-line message naming the extra)."""


def _submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise SubmititMissing('submitting with submitit needs the submitit package: pip install '
                              '"contrastive[submitit]" (in a clone: pip install -e '
                              '".[submitit]")') from None
    return submitit


@dataclass(frozen=True)
class RecipeTask:
    """One task of the job: the recipe as one training process, and submitit's checkpoint hook.

    ``recipe``: the recipe file's absolute path; ``args``: its arguments as every job runs them,
    ``--resume auto`` and ``--output-dir`` included (:func:`contrastive.launch.slurm.training_args`).
    """

    recipe: str
    args: tuple[str, ...]
    output_dir: str
    workdir: str
    port: int

    @classmethod
    def of(cls, job: SlurmJob) -> RecipeTask:
        args, output_dir = training_args(job)
        return cls(str(Path(job.workdir, job.recipe).resolve()), tuple(args), output_dir,
                   job.workdir, job.port)

    def command(self) -> list[str]:
        """The training process: this task's Python running the recipe."""
        return [sys.executable, self.recipe, *self.args]

    def rendezvous(self, env: Any) -> dict[str, str]:
        """torch's ``env://`` variables of this task from submitit's ``JobEnvironment``; none
        for a job of one task (the recipe then runs alone, as the sbatch template runs it)."""
        if env.num_tasks == 1:
            return {}
        return {"MASTER_ADDR": env.hostnames[0], "MASTER_PORT": str(self.port),
                "WORLD_SIZE": str(env.num_tasks), "RANK": str(env.global_rank),
                "LOCAL_RANK": str(env.local_rank),
                "LOCAL_WORLD_SIZE": str(env.num_tasks // env.num_nodes)}

    def __call__(self) -> dict[str, Any] | None:
        """Run the training process to its end; requeue the job when it stopped with a
        checkpoint. Returns the run's ``run_state.json`` (None if unreadable)."""
        submitit = _submitit()
        env = submitit.JobEnvironment()
        preempt = getattr(signal, "SIG" + env.USR_SIG)  # USR2 unless SUBMITIT_PREEMPT_SIGNAL

        def ignore_preempt() -> None:
            # Slurm signals every process of the step, and the engine saves on SIGTERM only
            # (the task forwards one): submitit's USR2 must not kill the run
            if preempt != signal.SIGTERM:
                signal.signal(preempt, signal.SIG_IGN)

        process = subprocess.Popen(self.command(), cwd=self.workdir,
                                   env={**os.environ, **self.rendezvous(env)},
                                   preexec_fn=ignore_preempt)

        def forward(signum: int, frame: Any) -> None:
            logger.warning("task %d: %s, the run saves a checkpoint and exits",
                           env.global_rank, signal.Signals(signum).name)
            if process.poll() is None:  # a second SIGTERM is ignored by a stopping run
                process.send_signal(signal.SIGTERM)

        held = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, preempt)}
        try:
            code = process.wait()
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler)
        state = self._run_state()
        if code == EXIT_STOPPED:
            requeue = held[preempt]  # submitit's handler: checkpoint() and requeue (task 0)
            logger.warning("task %d: the run stopped with a checkpoint at step %s; %s",
                           env.global_rank, (state or {}).get("step"),
                           "requeueing the job" if callable(requeue) else
                           "no submitit handler to requeue the job: submit it again")
            if callable(requeue):
                requeue(preempt, None)  # task 0 exits here; the others return
            return state
        if code != 0:
            raise RuntimeError(f"task {env.global_rank}: {Path(self.recipe).name} exited with "
                               f"{code}, not requeued (its log: this task's submitit log, "
                               f"{self.output_dir}/{RUN_STATE_FILE})")
        return state

    def checkpoint(self) -> Any:
        """submitit's requeue hook (the ``Checkpointable`` protocol): the same command; its
        arguments carry ``--resume auto``, so the requeued job continues the run."""
        return _submitit().helpers.DelayedSubmission(self)

    def _run_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(Path(self.workdir, self.output_dir, RUN_STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None


def executor_parameters(job: SlurmJob) -> dict[str, Any]:
    """submitit's ``update_parameters`` of ``job``: one task per GPU, SIGTERM before the limit,
    requeueable, the node's CPUs shared by its GPUs' tasks."""
    additional: dict[str, Any] = {"signal": f"TERM@{job.signal_seconds}", "requeue": True}
    for option in job.sbatch:  # "constraint=a100", "--exclusive"
        key, _, value = option.removeprefix("--").partition("=")
        additional[key] = value or True
    srun = ["--kill-on-bad-exit=0"]  # a task whose run stopped first must not end the others'
    params: dict[str, Any] = {
        "name": job.job_name or Path(job.recipe).stem, "nodes": job.nodes,
        "tasks_per_node": job.gpus_per_node, "gpus_per_node": job.gpus_per_node,
        "timeout_min": math.ceil(slurm_seconds(job.time) / 60),
        "slurm_signal_delay_s": job.signal_seconds,
        "slurm_additional_parameters": additional, "slurm_srun_args": srun,
    }
    if job.cpus_per_task > 0:
        params["cpus_per_task"] = max(1, job.cpus_per_task // job.gpus_per_node)
        # srun does not pass sbatch's --cpus-per-task on to its tasks (Slurm 22.05 on)
        srun.append(f"--cpus-per-task={params['cpus_per_task']}")
    if job.partition:
        params["slurm_partition"] = job.partition
    if job.account:
        params["slurm_account"] = job.account
    return params


def default_folder(job: SlurmJob) -> Path:
    """submitit's folder (its logs and pickles): ``submitit/<job name>`` in the work folder,
    apart from the run folder, which holds no pickle."""
    return Path(job.workdir, "submitit", job.job_name or Path(job.recipe).stem)


def submit(job: SlurmJob, folder: str | Path = "", cluster: str = "slurm",
           max_requeues: int = 30) -> Any:
    """Submit ``job`` with submitit and return its ``submitit.Job``.

    ``folder``: submitit's logs and pickles (default :func:`default_folder`); ``cluster``:
    ``"slurm"``, or ``"local"`` to try the job on this machine; ``max_requeues``: how many time
    limits the run may reach (submitit's ``max_num_timeout``; preemptions are not counted).
    """
    check(job)
    submitit = _submitit()
    executor = submitit.AutoExecutor(
        folder=folder or default_folder(job), cluster=cluster,
        slurm_max_num_timeout=max_requeues, local_max_num_timeout=max_requeues,
        slurm_python=shlex.quote(job.python))
    executor.update_parameters(**executor_parameters(job))
    return executor.submit(RecipeTask.of(job))
