"""Gradient caching through the engine and a recipe: CLIP (both towers cached) on 2 processes
(``accelerate launch --multi_gpu --num_processes 2``) with chunks of 3 of each process's 8 pairs
equals 1 process with the whole batch of 16 and no chunks, in float64; the same run without the
gradients' average over the processes (the engine's own, DDP's hooks being off) fails."""

from __future__ import annotations

import runpy
import subprocess
from pathlib import Path

import pytest
import torch

# nothing that depends on the process (a 1-block ViT, LayerNorm only; no dropout): the settings
# of the recipe's own two-process check
ARGS = runpy.run_path(str(Path(__file__).with_name("clip_dist_runs.py")))["DIST"]


def _launch(rx, launch_two, tmp_path, name, script, world, extra=()):
    out = tmp_path / name
    if world == 1:
        env = {**rx.env(), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([rx.PYTHON, str(script), *ARGS, *extra, "--output-dir", str(out)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
    else:
        proc = launch_two(script, *ARGS, *extra, "--output-dir", out)
    return torch.load(out / "clip.pt", weights_only=True)["state_dict"], proc.stderr


def _gap(a, b):
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.slow  # three recipe launches (~1 min); the gloo case test is the default's
@pytest.mark.distributed
def test_two_processes_with_chunks_equal_one_process_with_the_whole_batch(tmp_path, rx,
                                                                          launch_two):
    recipe = rx.RECIPES / "clip.py"
    one, _ = _launch(rx, launch_two, tmp_path, "one", recipe, 1)
    two, log = _launch(rx, launch_two, tmp_path, "two", recipe, 2, ["--grad-cache-chunk", "3"])
    assert "on 2 process(es)" in log and "run 3 samples at a time per process" in log
    assert one["logit_scale"].dtype == torch.float64
    assert _gap(one, two) < 1e-9  # float64 rounding of sums in other orders
    mutant, _ = _launch(rx, launch_two, tmp_path, "mutant", rx.ROOT / "tests" / "recipes" /
                        "grad_cache_mutant.py", 2, ["--grad-cache-chunk", "3"])
    assert _gap(one, mutant) > 1e-6
    print(f"2 processes x chunks vs 1 process: max |weight difference| {_gap(one, two):.2e}; "
          f"without the gradients' average: {_gap(one, mutant):.2e}")
