"""Helpers for running the recipes as programs (as accelerate's own tests run its examples)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


def trains_three_steps(recipe: str, run_dir: Path, *args: str) -> list[dict]:
    """Run ``recipe`` for 3 optimiser steps in this process (``args``, untouched by the tiny
    defaults) into ``run_dir``; check that steps 1, 2, 3 logged finite losses and a healthy
    ``embedding_std`` and that the kNN monitor ran; return the metrics records."""
    import math

    run_recipe_here(recipe, *args, "--max-steps", "3", "--output-dir", str(run_dir), tiny=False)
    records = read_metrics(run_dir)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and 0 < r["embedding_std"] < 1 for r in steps)
    assert any("knn_top1" in r for r in records)
    return records


def loads_into_timm(run_dir: Path, name: str = "timm:vit_tiny_patch16_224") -> None:
    """The run's ``encoder.pt`` names ``name`` and loads strictly into the model that
    ``create_encoder`` builds from it (timm's keys, nothing extra: the ViT methods)."""
    import torch

    from contrastive.nn import create_encoder

    payload = torch.load(Path(run_dir) / "encoder.pt", weights_only=True)
    assert payload["encoder"] == name
    enc = create_encoder(payload["encoder"], **payload["encoder_kwargs"])
    enc.load_state_dict(payload["state_dict"], strict=True)


def load_recipe(name: str):
    """Import recipes/<name>.py as a module (recipes are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def config_class(mod):
    """The configuration class of a loaded recipe module (text and image-text recipes:
    ``make()[0]``; the others define exactly one ``RunConfig`` dataclass)."""
    from contrastive.engine import RunConfig

    if hasattr(mod, "make"):  # text recipes: make() -> (config class, build_method, adapter)
        return mod.make()[0]
    own = [v for v in vars(mod).values() if isinstance(v, type) and dataclasses.is_dataclass(v)
           and issubclass(v, RunConfig) and v.__module__ == mod.__name__]
    assert len(own) == 1, f"{mod.__name__}: expected one configuration class, found {own}"
    return own[0]


def help_flags(print_help) -> frozenset[str]:
    """The ``--flags`` that ``print_help()`` (a program's ``--help``: it may exit) lists on its
    option lines, aliases included; printed one option a line (no flag split by wrapping)."""
    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "10000"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            print_help()
    finally:
        if columns is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = columns
    flags = set()
    for line in out.getvalue().splitlines():
        option = re.match(r"\s{2}(-.*?)(\s{2,}|$)", line)  # "  --flag VALUE, --alias  help"
        if option:
            flags |= set(re.findall(r"--[a-z][a-z0-9_-]*", option.group(1)))
    return frozenset(flags)


_HELP_FLAGS: dict[str, frozenset[str]] = {}


def recipe_flags(name: str) -> frozenset[str]:
    """The ``--flags`` that ``python recipes/<name>.py --help`` lists (cached per session)."""
    from contrastive.engine import parse_config

    if name not in _HELP_FLAGS:
        cls = config_class(load_recipe(name))
        flags = help_flags(lambda: parse_config(cls, ["--help"], prog=f"{name}.py"))
        assert flags, f"recipes/{name}.py --help lists no flags"
        _HELP_FLAGS[name] = flags
    return _HELP_FLAGS[name]


@pytest.fixture(scope="session")
def rx():
    """The helpers above (tests import nothing from conftest under --import-mode=importlib)."""
    return sys.modules[__name__]


def build_alone(mod, cfg):
    """``mod.build_method(cfg, data)`` outside a run: ``data`` the hand-off an image run of
    ``cfg`` would give (its training set read from ``--data``; a set smaller than one batch
    counts as one step, where a run would refuse it)."""
    from contrastive.data import get_dataset
    from contrastive.engine import data_info
    from contrastive.eval.teacher import labelled_classes

    train = get_dataset(cfg.data, "train")
    return mod.build_method(cfg, data_info(cfg, max(len(train), cfg.batch_size),
                                           kit={"num_classes": labelled_classes(train)}))
