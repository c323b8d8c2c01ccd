"""Several machines, as two machine ranks of one process each on this machine.

Each machine rank is its own ``accelerate launch --multi_gpu --num_machines 2 --machine_rank R
--num_processes 2 --main_process_ip 127.0.0.1 --main_process_port P`` started as a separate
program, as two nodes start theirs; with no GPU visible the two processes meet through the
launchers' rendezvous (torchrun's store on the main machine's port) and train over gloo. Checked
against one process with the same global batch, in float64, with the one-machine tests' own
comparisons:

- MoCo v2 (``moco_cifar``, shuffle BN off) against one process with BN split in 2 groups:
  tests/recipes/test_distributed.py's checks (weights, losses, the queue key by key);
- shuffle BN, its permutation and the queue's content: tests/methods/dist_case.py run by the
  two launchers (tests/engine/nodes_case_worker.py) and tests/methods/test_distributed.py's
  checks (every method case of that file: SimCLR, MoCo v3, MoCo with shuffle BN, multi-crop);
- SimCLR (``simclr_cifar``) with a ViT encoder (LayerNorm): the gathered negatives cross the
  machines; the head's BN of one process normalises 2 groups, as 2 processes do;
- SIGTERM to machine rank 1's launcher alone: both ranks save at the same step and exit with the
  requeue code (the launchers report 1; ``run_state.json`` says "stopped", written by rank 0,
  which learnt it from rank 1), and both launchers again with ``--resume auto`` end bit-identical
  to the uninterrupted two-machine run (tests/engine/test_preemption.py's comparison).

What this does not test: a real network between hosts (the ranks talk over the loopback), GPU
processes (NCCL) and a shared file system across hosts. Cost (``-m slow``): ten launchers,
each with its process ~16 CPU s of imports (AVX2 box), and a few s of training each: 276 s in
all measured on 2 cores shared with other work (MoCo 59, shuffle BN 42, SimCLR 69, SIGTERM and
resume 106).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from contrastive.nn.norm import SplitBatchNorm2d

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TESTS = Path(__file__).resolve().parents[1]


def _test_module(path: Path):
    """Another test file's helpers (tests import nothing from each other under importlib)."""
    spec = importlib.util.spec_from_file_location(f"_several_nodes_{path.parent.name}_{path.stem}",
                                                  path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


one_machine = _test_module(TESTS / "recipes" / "test_distributed.py")  # MoCo's ARGS and checks
method_checks = _test_module(TESTS / "methods" / "test_distributed.py")
preemption = _test_module(TESTS / "engine" / "test_preemption.py")
rx = preemption.rx  # the recipe helpers of tests/recipes/conftest.py
STEPS = one_machine.STEPS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {**rx.env(), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    # torchrun SIGKILLs its process 30 s after forwarding a SIGTERM: a loaded box may need
    # more for the step and the checkpoint (the Slurm script sets it too)
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "300"
    return env


class Machines:
    """The two machine ranks' launchers of one command (``argv``: a script and its
    arguments), each in a session of its own, logging to ``logs/machine{R}.log``."""

    def __init__(self, launcher, argv: list[str], logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.logs = [logs / f"machine{rank}.log" for rank in range(2)]
        self.procs = []
        for rank in range(2):
            with self.logs[rank].open("w") as log:
                self.procs.append(subprocess.Popen(
                    [*launcher.machine_prefix(rank, port), *map(str, argv)], env=_env(),
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def wait(self, timeout: float = 600) -> list[int]:
        """Both launchers' exit statuses (both killed, with their processes, after
        ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            for p in self.procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            pytest.fail(f"no end in {timeout:.0f} s:\n{self.log()}", pytrace=False)

    def log(self) -> str:
        return "".join(f"\n--- machine {r}:\n{path.read_text()[-4000:]}"
                       for r, path in enumerate(self.logs))

    def succeed(self) -> str:
        """Wait; fail with the logs unless both exit 0; machine 0's log."""
        codes = self.wait()
        assert codes == [0, 0], f"exit statuses {codes}:{self.log()}"
        return self.logs[0].read_text()


def _recipe(name: str, *args: str) -> list[str]:
    return rx.recipe_cmd(name, *args)[1:]  # the launcher runs it with this Python


MOCO = [*one_machine.ARGS, "--split-bn", "0"]


@pytest.fixture(scope="module")
def moco_two_machines(tmp_path_factory, launch_two) -> Path:
    """``moco_cifar`` on two machine ranks, uninterrupted."""
    out = tmp_path_factory.mktemp("moco") / "two"
    log = Machines(launch_two, _recipe("moco_cifar", *MOCO, "--output-dir", str(out)),
                   out.parent / "logs").succeed()
    assert "on 2 process(es)" in log and log.count("training moco_cifar") == 1, log[-4000:]
    return out


def test_moco_on_two_machines_equals_one_process(moco_two_machines, tmp_path, fresh_accelerate):
    one = tmp_path / "one"
    rx.run_recipe_here("moco_cifar", *one_machine.ARGS, "--split-bn", "2", "--output-dir",
                       str(one))
    one_machine.assert_two_processes_match_one(moco_two_machines, one)


def test_shuffle_bn_and_the_queue_across_two_machines(tmp_path, launch_two, close_f64):
    """tests/methods/dist_case.py, whose ranks meet through the two launchers: the
    one-machine file's checks hold unchanged."""
    out = tmp_path / "case"
    Machines(launch_two, [Path(__file__).with_name("nodes_case_worker.py"),
                          method_checks.CASE, out], tmp_path / "logs").succeed()
    results = [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    assert [r["group_size"] for r in results] == [2, 2]
    method_checks.test_batch_shuffle_is_a_global_permutation_and_unshuffle_restores(results)
    for name in ("moco", "densecl"):  # the one-machine check's parameters (DenseCL: its dense queue)
        method_checks.test_moco_queue_holds_keys_of_both_processes(results, close_f64, name)
    method_checks.test_key_queue_enqueues_both_processes(results)
    method_checks.test_world_size_and_gather(results)
    method_checks.test_gather_with_grad_sums_gradients_of_all_processes(results)
    for name in results[0]["reference"]:  # moco: shuffle BN's gather, permutation, unshuffle
        method_checks.test_two_processes_equal_one_process(results, name, close_f64)


class SplitBatchNorm1d(SplitBatchNorm2d):
    """:class:`SplitBatchNorm2d` on (N, C) features: the BN of a projection head in one
    process normalising sample n with group n % 2, as each of 2 processes normalises its own
    samples (the engine's sharding interleaves them the same way)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x[:, :, None, None]).flatten(1)


def _split_head_bn(method: nn.Module, groups: int = 2) -> nn.Module:
    for module in list(method.modules()):
        for name, bn in list(module.named_children()):
            if type(bn) is nn.BatchNorm1d:
                split = SplitBatchNorm1d(bn.num_features, groups, eps=bn.eps,
                                         momentum=bn.momentum, affine=bn.affine,
                                         track_running_stats=bn.track_running_stats)
                split.load_state_dict(bn.state_dict())
                setattr(module, name, split)
    return method


VIT = {"img_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}
SIMCLR = ["--data", "shapes:n=128,n_test=32,size=16", "--max-steps", str(STEPS), "--epochs", "2",
          "--encoder", "timm:vit_tiny_patch16_224", "--encoder-kwargs", json.dumps(VIT),
          "--knn-every", "0", "--save-every-steps", "4", "--batched-augment", "off",
          "--float64"]


def test_simclr_vit_on_two_machines_equals_one_process(tmp_path, launch_two, fresh_accelerate):
    """No BN in the encoder (LayerNorm): the two machines' embeddings enter each other's loss
    as negatives (gathered with their gradient)."""
    from contrastive.engine import run

    two, one = tmp_path / "two", tmp_path / "one"
    Machines(launch_two, _recipe("simclr_cifar", *SIMCLR, "--output-dir", str(two)),
             tmp_path / "logs").succeed()
    mod = rx.load_recipe("simclr_cifar")
    argv = [*rx.TINY, *rx.SMALL["simclr_cifar"], *SIMCLR, "--output-dir", str(one)]
    run(mod.SimCLRCifar, lambda cfg, data: _split_head_bn(mod.build_method(cfg, data)),
        mod.build_pipeline, argv=argv, name="simclr_cifar")
    a, _ = one_machine.assert_same_training(two, one)
    assert a["encoder.blocks.0.norm1.weight"].dtype == torch.float64  # a LayerNorm, in float64


def test_sigterm_to_one_machine_stops_both_and_the_job_resumes_exactly(moco_two_machines,
                                                                       tmp_path, launch_two):
    """SIGTERM to machine rank 1's launcher alone (torchrun forwards it to its process): rank 1
    asks, both ranks save one checkpoint at the same step and exit 75 (each launcher reports
    1), rank 0 writes "stopped"; both launchers again with ``--resume auto`` end where the
    uninterrupted run ends, bit for bit."""
    out = tmp_path / "run"
    argv = _recipe("moco_cifar", *MOCO, "--output-dir", str(out))
    machines = Machines(launch_two, argv, tmp_path / "logs")
    metrics = out / "metrics.jsonl"
    while all(p.poll() is None for p in machines.procs):
        if metrics.exists() and '"loss"' in metrics.read_text():
            break
        time.sleep(0.05)
    machines.procs[1].send_signal(signal.SIGTERM)
    codes = machines.wait()
    log = machines.log()
    assert codes == [1, 1], f"exit statuses {codes}:{log}"  # 75 from each process
    state = json.loads((out / "run_state.json").read_text())
    k = preemption._stopped_at(out, state, "another process", steps=STEPS)
    assert state["exit_code"] == preemption.EXIT_STOPPED, state
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved[-1] == f"step_{k:08d}" and len(saved) == 1 + (k > 4), saved

    done = Machines(launch_two, [*argv, "--resume", "auto"], tmp_path / "resumed").succeed()
    assert f"at step {k}" in done, done[-4000:]
    preemption._assert_same_as(moco_two_machines, out, steps=STEPS)
