#!/usr/bin/env python
"""The MoCo CIFAR-10 demo (200 epochs, kNN monitor) in one device lease: the driver.

A lease gives about 15 minutes of GPU time, a command at most 10, and the machine stays while
calls follow each other. So the run is started as a daemon (its own process session, which
outlives the command that starts it) and later commands only wait for it:

    # the data: the CIFAR-10 JPEG copy as one xz stream (92.7 MB tar -> 18.5 MB: the JPEGs
    # share their headers), carried in an ignored folder of the checkout
    mkdir -p .gpu && xz -6 -T2 -c ../shared/data/cifar10-jpeg.tar > .gpu/cifar10-jpeg.tar.xz
    # command 1 (device): unpack, time the first epoch, start the rest, wait
    python benchmarks/gpu_moco_cifar.py start --data-xz .gpu/cifar10-jpeg.tar.xz --out $OUT
    # command 2, at once if the run is not done: wait for it
    python benchmarks/gpu_moco_cifar.py wait --out $OUT

``start``: (1) unpacks the data (skipped when already there); (2) stage 1, in the foreground:
the recipe for one epoch (``--max-steps``), with ``--compile`` if asked; if that fails, once
more without it (the failure's log comes back); (3) reads the epoch's steady step rate and the
kNN pass's seconds from the records and picks the kNN interval (the smallest of
:data:`INTERVALS` whose predicted finish lies inside ``--budget-s`` from the command's start);
(4) stage 2 as a daemon, ``--resume auto`` with that interval (the resume is exact:
tests/engine/test_resident.py); (5) waits as ``wait`` does. ``wait`` copies the run's records
to ``--out`` every few seconds until the run ends or ``--until-s`` has passed, so that what a
killed command leaves there still comes back; then writes ``summary.json``.

Settings: the recipe's own (the demo's), plus ``--resident`` (the data set on the GPU),
bf16, a checkpoint every 50 epochs (the last one kept), logs every quarter epoch.
The CPU dry run: ``--cpu --epochs 2 --max-images 2000 --batch-size 64 --eager-flags "--encoder small_cnn"``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("GPU_WORK", "/tmp/moco_cifar_gpu"))
DATA = WORK / "cifar10-jpeg"
RUN = WORK / "run"
STATE = WORK / "driver.json"
INTERVALS = (1, 2, 4, 5, 10, 20, 25, 40, 50, 100, 200)
RECORDS = ("metrics.jsonl", "config.json", "run_state.json")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unpack(xz: Path, max_images: int) -> None:
    """The tar's train/ and test/ folders under DATA (``max_images`` > 0: that many training
    images and a quarter as many test images, the first of each class in name order)."""
    if (DATA / "train").is_dir():
        return
    t0 = time.time()
    tmp = WORK / "unpack"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(xz, "r:xz") as tar:
        tar.extractall(tmp, filter="data")
    top = next(p.parent for p in tmp.rglob("train") if p.is_dir())
    if max_images:
        for split, n in (("train", max_images), ("test", max(max_images // 4, 10))):
            for cls in sorted((top / split).iterdir()):
                files = sorted(cls.iterdir())
                for f in files[n // 10:]:
                    f.unlink()
    top.rename(DATA)
    log(f"data unpacked in {time.time() - t0:.1f} s: "
        f"{sum(1 for _ in (DATA / 'train').rglob('*.jpg'))} training images")


def recipe_args(a: argparse.Namespace, compiled: bool) -> list[str]:
    flags = [sys.executable, str(ROOT / "recipes" / "moco_cifar.py"), "--data", str(DATA),
             "--resident", "--epochs", str(a.epochs), "--num-workers", str(a.workers),
             "--save-every-epochs", "50", "--keep-last", "1", "--progress", "false",
             "--knn-at-start", "false", "--output-dir", str(RUN), "--seed", "0",
             "--batch-size", str(a.batch_size)]
    if a.cpu:
        flags += ["--cpu", "--mixed-precision", "no"]
    else:
        flags += ["--mixed-precision", "bf16"]
    if compiled:
        flags += ["--compile", *a.compile_flags.split()]
    else:
        flags += a.eager_flags.split()
    return flags


def records(run: Path = RUN) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_per_epoch(n_train: int, batch: int) -> int:
    return n_train // batch


def copy_out(out: Path) -> None:
    for name in RECORDS:
        if (RUN / name).exists():
            shutil.copy(RUN / name, out / name)
    for name in ("stage1.log", "stage1_eager.log", "stage2.log"):
        if (WORK / name).exists():  # the last 200 lines
            lines = (WORK / name).read_text(errors="replace").splitlines()[-200:]
            (out / name).write_text("\n".join(lines) + "\n")
    if STATE.exists():
        shutil.copy(STATE, out / "driver.json")


def stage1(a: argparse.Namespace, out: Path, spe: int) -> tuple[bool, float]:
    """One epoch in the foreground (compiled if asked, eager if that fails); returns (compiled,
    seconds it took)."""
    tries = [True, False] if a.compile else [False]
    for compiled in tries:
        shutil.rmtree(RUN, ignore_errors=True)
        name = "stage1.log" if compiled or not a.compile else "stage1_eager.log"
        cmd = recipe_args(a, compiled) + ["--max-steps", str(spe), "--knn-every", "1",
                                            "--log-every", str(max(spe // 4, 1))]
        log(("compiled" if compiled else "eager") + " stage 1: " + " ".join(cmd[2:]))
        t0 = time.time()
        with open(WORK / name, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=a.stage1_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
                log(f"stage 1 passed its {a.stage1_timeout_s:.0f} s")
        took = time.time() - t0
        copy_out(out)
        if rc == 0:
            return compiled, took
        log(f"stage 1 failed (exit {rc}) after {took:.0f} s; log: {name}")
    raise SystemExit("stage 1 failed")


def timing(spe: int) -> tuple[float, float]:
    """(seconds per epoch at the steady rate, seconds of one kNN pass) from stage 1's records:
    the rate between the second and the last training record, the kNN pass as the time from
    the epoch's last training record to the run's end record."""
    train = [r for r in records() if "images_per_s" in r and "time" in r]
    if len(train) < 3:
        raise SystemExit(f"stage 1 left {len(train)} timed records: too few to plan")
    (s0, t0), (s1, t1) = (train[1]["step"], train[1]["time"]), (train[-1]["step"], train[-1]["time"])
    per_step = (t1 - t0) / max(s1 - s0, 1)
    end = (RUN / "run_state.json").stat().st_mtime  # written when the run ends
    knn = max(end - t1, 0.0)
    return per_step * spe, knn


def plan(a: argparse.Namespace, sec_epoch: float, sec_knn: float, elapsed: float,
         restart_s: float) -> int:
    left = a.epochs - 1
    for k in INTERVALS:
        passes = left // k + 1  # every k epochs and at the end
        predicted = elapsed + restart_s + left * sec_epoch + passes * sec_knn
        if predicted <= a.budget_s or k == INTERVALS[-1]:
            log(f"kNN every {k} epochs: predicted finish {predicted:.0f} s after the start "
                f"(epoch {sec_epoch:.2f} s, kNN pass {sec_knn:.2f} s, restart {restart_s:.0f} s)")
            return k
    return INTERVALS[-1]


def start(a: argparse.Namespace) -> None:
    t_start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    unpack(Path(a.data_xz), a.max_images)
    n_train = sum(1 for _ in (DATA / "train").rglob("*.jpg"))
    spe = steps_per_epoch(n_train, a.batch_size)
    compiled, took = stage1(a, out, spe)
    sec_epoch, sec_knn = timing(spe)
    restart = max(took - sec_epoch - sec_knn, 5.0)  # start-up, decoding, compilation
    k = plan(a, sec_epoch, sec_knn, time.time() - t_start, restart)
    cmd = recipe_args(a, compiled) + ["--resume", "auto", "--knn-every", str(k),
                                      "--log-every", str(max(spe // 4, 1))]
    log("stage 2 (daemon): " + " ".join(cmd[2:]))
    with open(WORK / "stage2.log", "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)
    STATE.write_text(json.dumps({
        "pid": proc.pid, "started": time.time(), "t_start": t_start, "compiled": compiled,
        "knn_every": k, "stage1_s": round(took, 1), "sec_epoch": round(sec_epoch, 3),
        "sec_knn": round(sec_knn, 3), "steps_per_epoch": spe, "train_images": n_train,
        "cmd": cmd[2:]}, indent=1))
    wait(a, t_start)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie of ours counts as ended
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def wait(a: argparse.Namespace, t0: float | None = None) -> None:
    t0 = time.time() if t0 is None else t0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    state = json.loads(STATE.read_text())
    last = -1
    while True:
        copy_out(out)
        recs = records()
        epoch = max((r.get("epoch", 0) for r in recs), default=0)
        if int(epoch) != last and int(epoch) % 10 == 0:
            last = int(epoch)
            knn = [r["knn_top1"] for r in recs if "knn_top1" in r]
            log(f"epoch {epoch:.0f}, kNN {knn[-1] if knn else '-'}")
        if not alive(state["pid"]):
            break
        if time.time() - t0 > a.until_s:
            log(f"--until-s {a.until_s} reached; the run goes on (wait again)")
            break
        time.sleep(3)
    summarise(out, state)


def summarise(out: Path, state: dict) -> None:
    recs = records()
    knn = [(r["epoch"], r["knn_top1"]) for r in recs if "knn_top1" in r]
    rates = [r["images_per_s"] for r in recs if "images_per_s" in r]
    run_state = json.loads((RUN / "run_state.json").read_text()) if (RUN / "run_state.json").exists() else {}
    summary = {**state, "state": run_state.get("state"), "last_step": run_state.get("step"),
               "knn_curve": knn, "final_knn_top1": knn[-1][1] if knn else None,
               "median_images_per_s": sorted(rates)[len(rates) // 2] if rates else None,
               "wall_s_since_stage2": round(time.time() - state["started"], 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log(f"summary: state {summary['state']}, step {summary['last_step']}, final kNN "
        f"{summary['final_knn_top1']}, median {summary['median_images_per_s']} images/s")


def stop(a: argparse.Namespace) -> None:
    state = json.loads(STATE.read_text())
    os.killpg(state["pid"], signal.SIGTERM)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("start")
    s.add_argument("--data-xz", required=True)
    s.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_out"))
    s.add_argument("--epochs", type=int, default=200)
    s.add_argument("--budget-s", type=float, default=480.0,
                   help="the whole run, from this command's start, kNN passes included")
    s.add_argument("--until-s", type=float, default=570.0, help="this command returns by then")
    s.add_argument("--stage1-timeout-s", type=float, default=420.0,
                   help="the split-BN step compiles 3.6-5.3x slower than plain BN "
                   "(benchmarks/bench_compile_time.py): give the first epoch time")
    s.add_argument("--compile", action="store_true")
    s.add_argument("--compile-flags", default="",
                   help="added with --compile, e.g. '--compile-mode reduce-overhead'")
    s.add_argument("--eager-flags", default="")
    s.add_argument("--workers", type=int, default=8)
    s.add_argument("--cpu", action="store_true")
    s.add_argument("--batch-size", type=int, default=512, help="the demo's 512 (a dry run: less)")
    s.add_argument("--max-images", type=int, default=0)
    w = sub.add_parser("wait")
    w.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_out"))
    w.add_argument("--until-s", type=float, default=570.0)
    sub.add_parser("stop")
    a = p.parse_args()
    {"start": start, "wait": wait, "stop": stop}[a.what](a)


if __name__ == "__main__":
    main()
