"""``contrastive-slurm``: a recipe as a Slurm job that checkpoints before its time limit and
requeues itself until the run completes.

``render`` fills ``train.sbatch`` (beside this file) and writes the script; ``submit`` writes it
and hands it to ``sbatch``::

    contrastive-slurm submit recipes/moco_r50.py --nodes 2 --gpus-per-node 8 --time 24:00:00 \\
        --partition gpu -- --data /data/imagenet --output-dir runs/moco_r50

The job is one task per node running ``accelerate launch`` (one process per GPU), the
rendezvous taken from Slurm's environment: ``--num_machines $SLURM_NNODES``, ``--machine_rank
$SLURM_NODEID``, ``--main_process_ip`` the job's first host. ``--signal=TERM@S`` makes Slurm send
SIGTERM to every process of the job step ``S`` seconds (up to 60 s more) before the time limit;
the engine saves a checkpoint and records ``"stopped"`` in ``run_state.json``, and the script
then calls ``scontrol requeue``. The run's arguments get ``--resume auto``, so every requeued job
continues the same run; a job of one process runs the recipe itself as the task. ``submit
--submitit`` submits the same job with submitit instead (:mod:`contrastive.launch.slurm_submitit`:
one task per GPU, the ``submitit`` extra). What the peers do, for comparison: DINO's ``run_with_submitit.py`` and MAE's ``submitit_pretrain.py``
(submitit's USR2 120 s before the limit, a ``checkpoint()`` that resubmits the trainer to resume
from its last per-epoch checkpoint), open_clip's Slurm example (``--ntasks-per-node`` = GPUs,
the master address from ``scontrol show hostnames``).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SlurmJob", "BadJob", "check", "render", "training_args", "slurm_seconds", "main"]

TEMPLATE = Path(__file__).with_name("train.sbatch")
_SLOT = re.compile(r"\{\{(\w+)\}\}")
# Slurm's --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


class BadJob(ValueError):
    """A job that cannot be rendered; the message is one line naming the fix."""


@dataclass(frozen=True)
class SlurmJob:
    """One training job: the recipe file, its arguments and the allocation.

    ``signal_seconds``: how long before the time limit Slurm sends SIGTERM; the current step
    and the checkpoint must fit in it (Slurm may send the signal up to 60 s earlier).
    ``python``: the interpreter on the compute nodes (default: this one), whose environment has
    accelerate and this package.
    """

    recipe: str
    args: tuple[str, ...] = ()
    nodes: int = 1
    gpus_per_node: int = 8
    time: str = "24:00:00"
    partition: str = ""
    account: str = ""
    cpus_per_task: int = 0
    job_name: str = ""
    signal_seconds: int = 300
    port: int = 29500
    python: str = field(default_factory=lambda: sys.executable)
    sbatch: tuple[str, ...] = ()  # further #SBATCH options, e.g. "constraint=a100"
    workdir: str = field(default_factory=lambda: str(Path.cwd()))


def slurm_seconds(text: str) -> int:
    """Slurm's ``--time`` (``90``, ``30:00``, ``24:00:00``, ``2-00``, ``1-12:00:00``) in
    seconds."""
    m = _TIME.fullmatch(text.strip())
    if not m:
        raise BadJob(f"--time {text!r}: expected minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]")
    days, *clock = m.groups()
    parts = [int(p) for p in clock if p is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if len(parts) == 1:  # minutes
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` / ``--name=VALUE`` in a recipe's arguments (the last one)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def training_args(job: SlurmJob) -> tuple[list[str], str]:
    """The recipe's arguments as the job runs them, and its output folder: ``--resume auto``
    added (each requeued job continues the run), ``--output-dir runs/<recipe>`` made explicit
    (the script reads ``run_state.json`` there)."""
    args = list(job.args)
    resume = _option(args, "--resume")
    if resume is None:
        args += ["--resume", "auto"]
    elif resume != "auto":
        raise BadJob(f"--resume {resume}: every requeued job would restart from it; leave "
                     "--resume out (the job adds --resume auto), or use --init for start weights")
    output_dir = _option(args, "--output-dir")
    if not output_dir:
        output_dir = f"runs/{Path(job.recipe).stem}"
        args += ["--output-dir", output_dir]
    return args, output_dir


def check(job: SlurmJob) -> None:
    """Raise a one-line :class:`BadJob` naming the fix when ``job`` cannot run."""
    recipe = Path(job.workdir, job.recipe)
    if not job.recipe:
        raise BadJob("no recipe: name its file first, e.g. contrastive-slurm render "
                     "recipes/moco_cifar.py --nodes 2 -- --output-dir runs/moco")
    if not recipe.is_file():
        raise BadJob(f"recipe {job.recipe} not found: give a recipe file, e.g. "
                     "recipes/moco_cifar.py")
    for name in ("nodes", "gpus_per_node"):
        if getattr(job, name) < 1:
            raise BadJob(f"--{name.replace('_', '-')} {getattr(job, name)}: must be 1 or more")
    if not 1 <= job.port <= 65535:
        raise BadJob(f"--port {job.port}: must be a TCP port, 1 to 65535")
    limit = slurm_seconds(job.time)
    if not 0 < job.signal_seconds < limit:
        raise BadJob(f"--signal-seconds {job.signal_seconds}: must be positive and below the "
                     f"time limit ({limit} s): it is how long before the limit the run saves")
    training_args(job)


def render(job: SlurmJob) -> str:
    """The sbatch script of ``job`` (checked: one-line :class:`BadJob` on bad input)."""
    check(job)
    recipe = Path(job.workdir, job.recipe)
    args, output_dir = training_args(job)
    lines = [o if o.startswith("-") else f"--{o}" for o in job.sbatch]
    if job.cpus_per_task > 0:
        lines.insert(0, f"--cpus-per-task={job.cpus_per_task}")
    if job.account:
        lines.insert(0, f"--account={job.account}")
    if job.partition:
        lines.insert(0, f"--partition={job.partition}")
    values = {
        "job_name": job.job_name or recipe.stem, "nodes": str(job.nodes),
        "gpus_per_node": str(job.gpus_per_node), "time": job.time,
        "sbatch_lines": "".join(f"#SBATCH {line}\n" for line in lines),
        "signal_seconds": str(job.signal_seconds), "workdir": job.workdir,
        "python": shlex.quote(job.python), "output_dir": shlex.quote(output_dir),
        "port": str(job.port), "train": shlex.join([str(recipe.resolve()), *args]),
    }
    return _SLOT.sub(lambda m: values[m.group(1)], TEMPLATE.read_text())


def _parser() -> argparse.ArgumentParser:
    after = "The recipe's own arguments follow `--`; --resume auto is added."
    p = argparse.ArgumentParser(prog="contrastive-slurm", description=__doc__.split("\n\n")[0],
                                epilog=after)
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in (("render", "write the sbatch script (to stdout without --script)"),
                       ("submit", "write the script and run sbatch on it")):
        c = sub.add_parser(name, help=what, description=what, epilog=after,
                           usage=f"contrastive-slurm {name} RECIPE [options] -- RECIPE_ARGS")
        c.add_argument("recipe", nargs="?", default="",
                       help="the recipe file, e.g. recipes/moco_r50.py")
        c.add_argument("--nodes", type=int, default=1, help="default 1")
        c.add_argument("--gpus-per-node", type=int, default=8, help="default 8")
        c.add_argument("--time", default="24:00:00", help="Slurm's time limit (default 24:00:00)")
        c.add_argument("--partition", default="", help="default: the cluster's")
        c.add_argument("--account", default="")
        c.add_argument("--cpus-per-task", type=int, default=0,
                       help="CPUs of each node's task, for the loader workers of all its GPUs "
                       "(default: the cluster's, often one)")
        c.add_argument("--job-name", default="", help="default: the recipe's name")
        c.add_argument("--signal-seconds", type=int, default=300,
                       help="SIGTERM this long before the time limit: the step and the "
                       "checkpoint must fit (default 300)")
        c.add_argument("--port", type=int, default=29500, help="the rendezvous port (default 29500)")
        c.add_argument("--python", default=sys.executable,
                       help="the Python on the compute nodes (default: this one)")
        c.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                       help="another #SBATCH option, e.g. constraint=a100 (repeatable)")
        c.add_argument("--script", default=None if name == "render" else "",
                       help="where to write the script" + (
                           "" if name == "render" else " (default: <job-name>.sbatch)"))
    submit = sub.choices["submit"]
    submit.add_argument("--submitit", action="store_true",
                        help="submit with submitit instead of the sbatch script: one task per "
                        "GPU (the submitit extra; contrastive/launch/slurm_submitit.py)")
    submit.add_argument("--submitit-folder", default="",
                        help="submitit's logs and pickles (default: submitit/<job-name>)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``contrastive-slurm render|submit RECIPE [options] -- RECIPE_ARGS``; 2 on bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, recipe_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    a = _parser().parse_args(own)
    job = SlurmJob(recipe=a.recipe, args=tuple(recipe_args), nodes=a.nodes,
                   gpus_per_node=a.gpus_per_node, time=a.time, partition=a.partition,
                   account=a.account, cpus_per_task=a.cpus_per_task, job_name=a.job_name,
                   signal_seconds=a.signal_seconds, port=a.port, python=a.python,
                   sbatch=tuple(a.sbatch))
    try:
        script = render(job)
        sbatch = shutil.which("sbatch") if a.command == "submit" else None
        if a.command == "submit" and sbatch is None:
            raise BadJob("sbatch not found on PATH: submit from a Slurm login node, or write "
                         "the script with `contrastive-slurm render --script FILE` and copy it")
        if a.command == "submit" and a.submitit:
            from contrastive.launch.slurm_submitit import SubmititMissing, submit

            try:
                submitted = submit(job, folder=a.submitit_folder)
            except SubmititMissing as e:
                raise BadJob(str(e)) from None
            sys.stderr.write(f"contrastive-slurm: submitted job {submitted.job_id} with "
                             f"submitit (its logs: {submitted.paths.folder})\n")
            return 0
    except BadJob as e:
        sys.stderr.write(f"contrastive-slurm: {e}\n")
        return 2
    if a.script is None:
        sys.stdout.write(script)
        return 0
    path = Path(a.script or f"{job.job_name or Path(job.recipe).stem}.sbatch")
    path.write_text(script)
    path.chmod(0o755)
    if sbatch is None:
        sys.stderr.write(f"contrastive-slurm: wrote {path}\n")
        return 0
    return subprocess.call([sbatch, str(path)])


if __name__ == "__main__":
    sys.exit(main())
