"""``--report-to``: TensorBoard, W&B (offline) and MLflow (SQLite in the run folder) for real.

Each tracker test trains a tiny run that crashes at step 4 (records up to step 3, the last
checkpoint at step 2), resumes it with ``--resume auto`` to its end (step 4), and reads what the
tracker stored: the scalars of ``metrics.jsonl`` (same keys, same steps, the resumed values
where a step was logged twice), one tracker run continued across the resume, and the curves and
embedding pictures at the end. Each test skips when its tracker's package is absent
(``pip install -e ".[trackers]"``)."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from contrastive.engine import ImageConfig, parse_config, train
from contrastive.engine.trackers import parse_report_to, scalars
from contrastive.methods import SimCLR

CRASH_AT = 4  # the optimiser step whose forward raises (the run has 4 steps)


@dataclasses.dataclass
class _Cfg(ImageConfig):
    data: str = "shapes:n=32,n_test=16,size=16"  # labelled, with a held-out split: the map
    encoder: str = "small_cnn"
    image_size: int = 16
    batch_size: int = 16
    epochs: int = 2
    num_workers: int = 0
    progress: bool = False
    mixed_precision: str = "no"
    save_every_steps: int = 2
    save_every_epochs: int = 0
    log_every: int = 1
    knn_every: int = 1  # kNN records too (knn_top1 at steps 2 and 4; their text not sent)
    knn_k: int = 5


class _Crash(RuntimeError):
    pass


class _SimCLR(SimCLR):
    """SimCLR that raises at the forward of step ``crash_at`` (a killed run: no checkpoint
    after step 2, records up to step 3)."""

    def __init__(self, crash_at: int) -> None:
        super().__init__(encoder="small_cnn", dim=8, mlp_hidden=16)
        self.crash_at, self.calls = crash_at, 0

    def forward(self, batch):
        self.calls += 1
        if self.calls == self.crash_at:
            raise _Crash(f"killed at step {self.crash_at}")
        return super().forward(batch)


def _pipeline(cfg):
    from contrastive.augment import get_pipeline

    return get_pipeline("simclr", image_size=cfg.image_size)


def _crash_then_resume(tmp_path: Path, report_to: str) -> Path:
    """The run folder of a run killed at step 4 and resumed to its end."""
    out = tmp_path / "run"
    cfg = _Cfg(output_dir=str(out), report_to=report_to)
    with pytest.raises(_Crash):
        train(cfg, lambda c, data: _SimCLR(CRASH_AT), _pipeline, recipe="tracked")
    assert max(json.loads(ln)["step"] for ln in (out / "metrics.jsonl").open()) == CRASH_AT - 1
    cfg = dataclasses.replace(cfg, resume="auto")
    result = train(cfg, lambda c, data: _SimCLR(-1), _pipeline, recipe="tracked")
    assert result.status == "completed" and result.step == 4
    return out


def _jsonl(out: Path) -> dict[int, dict[str, float]]:
    """The scalars of metrics.jsonl by step (a step's records merged: training and kNN)."""
    by_step: dict[int, dict[str, float]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_step.setdefault(rec["step"], {}).update(scalars(rec))
    return by_step


# ---- --report-to itself -----------------------------------------------------------------------


def test_report_to_names_and_one_line_errors(monkeypatch):
    import accelerate.tracking

    assert parse_report_to("none") == () and parse_report_to("") == ()
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers",
                        lambda: ["tensorboard", "mlflow"])
    assert parse_report_to("mlflow, tensorboard,mlflow") == ("mlflow", "tensorboard")
    assert parse_report_to("all") == ("tensorboard", "mlflow")
    with pytest.raises(ValueError, match=r'^--report-to wandb: the wandb package is not '
                                         r'installed: pip install -e "\.\[wandb\]"$'):
        parse_report_to("tensorboard,wandb")
    with pytest.raises(ValueError, match=r"^--report-to comet_ml: .* pip install comet_ml$"):
        parse_report_to("comet_ml")
    with pytest.raises(ValueError, match=r"unknown tracker tensorbord; choose none, all or .*"
                                         r"tensorboard.*wandb"):
        parse_report_to("tensorbord")
    with pytest.raises(ValueError, match="stand alone"):
        parse_report_to("all,wandb")
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    with pytest.raises(ValueError, match=r'no tracker is installed.*"\.\[trackers\]"'):
        parse_report_to("all")


def test_a_missing_tracker_is_one_line_before_anything_runs(monkeypatch, capsys, tmp_path):
    import accelerate.tracking

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    with pytest.raises(SystemExit) as exc:
        parse_config(_Cfg, ["--report-to", "wandb", "--output-dir", str(tmp_path / "r")],
                     prog="tracked.py")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ('tracked.py: error: --report-to wandb: the wandb package is not '
                       'installed: pip install -e ".[wandb]"')
    assert not (tmp_path / "r").exists()


def test_scalars_are_the_numbers_of_a_record_but_the_step():
    rec = {"step": 3, "epoch": 1.5, "loss": 0.5, "lr": 0.1, "embedding_std": None,
           "knn_when": "epoch 1", "flag": True, "n": 7}
    assert scalars(rec) == {"epoch": 1.5, "loss": 0.5, "lr": 0.1, "n": 7}


def test_records_go_to_every_tracker_but_steps_wandb_already_holds(tmp_path):
    """A resumed online W&B run refuses steps below its counter (W&B's rule): they are not
    sent; the other trackers get every record."""
    from types import SimpleNamespace

    from contrastive.engine.trackers import Trackers

    class Fake:
        def __init__(self, name, step=0):
            self.name, self.tracker, self.got = name, SimpleNamespace(step=step), []

        def log(self, values, step=None):
            self.got.append((step, values))

    wandb, tb = Fake("wandb", step=5), Fake("tensorboard")
    acc = SimpleNamespace(trackers=[wandb, tb], is_main_process=True)
    trackers = Trackers(acc, tmp_path, ("wandb", "tensorboard"))
    for step in (4, 5, 6):
        trackers.log({"step": step, "loss": step / 10, "knn_when": "end"})
    assert [s for s, _ in wandb.got] == [5, 6] and [s for s, _ in tb.got] == [4, 5, 6]
    assert tb.got[0][1] == {"loss": 0.4}
    Trackers(acc, tmp_path, ()).log({"step": 7, "loss": 1.0})  # none asked for: nothing sent
    assert len(tb.got) == 3


def test_import_contrastive_imports_no_tracker():
    code = ("import sys, contrastive, contrastive.engine\n"
            "from contrastive.engine.trackers import parse_report_to\n"
            "parse_report_to('none')\n"
            "bad = [m for m in ('wandb', 'mlflow', 'tensorboard', 'tensorboardX') "
            "if m in sys.modules]\n"
            "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


# ---- TensorBoard -------------------------------------------------------------------------------


def test_tensorboard_scalars_pictures_and_resume(tmp_path, fresh_accelerate):
    pytest.importorskip("tensorboard", reason='TensorBoard not installed: pip install -e ".[tensorboard]"')
    from tensorboard.backend.event_processing.event_accumulator import (
        IMAGES,
        SCALARS,
        EventAccumulator,
    )

    out = _crash_then_resume(tmp_path, "tensorboard")
    ids = json.loads((out / "trackers.json").read_text())
    assert ids["tensorboard"] == {"log_dir": "tensorboard/tracked"}
    events = sorted((out / "tensorboard" / "tracked").glob("events.out.tfevents.*"))
    assert len(events) == 2  # the killed process's file and the resume's, in one folder
    acc = EventAccumulator(str(out / "tensorboard" / "tracked"),
                           size_guidance={SCALARS: 0, IMAGES: 0})
    acc.Reload()
    want: dict[str, list[tuple[int, float]]] = {}  # every record's scalars, in order
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for key, value in scalars(rec).items():
            want.setdefault(key, []).append((rec["step"], value))
    assert set(want) <= set(acc.Tags()["scalars"]) and {"loss", "knn_top1", "epoch"} <= set(want)
    for key, series in want.items():
        # step 3 was written twice (before the kill, after the resume): purge_step hid the first
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in series], key
        assert [v for _, v in got] == pytest.approx([v for _, v in series], rel=1e-6), key
    for name in ("curves", "embedding"):
        (image,) = acc.Images(name)
        assert image.step == 4 and image.width > 100 and image.height > 100


# ---- W&B (offline) -----------------------------------------------------------------------------


def _wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` file: W&B's transaction log (a header ``:W&B`` + magic +
    version, then LevelDB-log blocks of 32 KiB: each chunk crc32, length, type 1 full / 2
    first / 3 middle / 4 last) of ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", path
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        pending += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


def test_wandb_offline_scalars_pictures_and_resume(tmp_path, fresh_accelerate, monkeypatch):
    pytest.importorskip("wandb", reason='W&B not installed: pip install -e ".[wandb]"')
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                       "WANDB_CONFIG_DIR": tmp_path / "cfg", "WANDB_CACHE_DIR": tmp_path / "c",
                       "WANDB_DATA_DIR": tmp_path / "d"}.items():
        monkeypatch.setenv(var, str(value))
    out = _crash_then_resume(tmp_path, "wandb")
    import wandb

    wandb.teardown()  # the W&B service writes the .wandb files on its own: wait for it
    run_id = json.loads((out / "trackers.json").read_text())["wandb"]["run_id"]
    dirs = sorted((out / "wandb").glob("offline-run-*"))
    # offline-run-<date>_<time>-<id>; W&B appends "-1" to the second when both start in one second
    assert len(dirs) == 2 and all(
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", d.name) for d in dirs), dirs
    history: dict[int, dict] = {}
    for d in dirs:  # in order: the resumed values replace the killed run's at step 3
        records = _wandb_records(d / f"run-{run_id}.wandb")
        kinds = [r.WhichOneof("record_type") for r in records]
        assert kinds.count("run") == 1 and kinds[-1] == "exit", d  # complete, one run each
        assert next(r.run.run_id for r in records if r.WhichOneof("record_type") == "run") == run_id
        for r in records:
            if r.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                       for i in r.history.item}
                history.setdefault(r.history.step.num, {}).update(row)
    want = _jsonl(out)
    assert sorted(s for s in history if s in want) == sorted(want)
    for step, values in want.items():
        assert {k: history[step][k] for k in values} == pytest.approx(values, rel=1e-9), step
    assert history[1]["epoch"] == 0.5 and "knn_top1" in history[2]
    assert not [k for row in history.values() for k in row if k.endswith("_when")]
    for name in ("curves", "embedding"):
        assert history[4][f"{name}/_type"] == "images/separated"
        assert list((dirs[-1] / "files" / "media" / "images").glob(f"{name}_4_*.png"))
    config = _config_of(dirs[0] / f"run-{run_id}.wandb")
    assert config["batch_size"] == 16 and config["recipe"] == "tracked"


def _config_of(path: Path) -> dict:
    config = {}
    for r in _wandb_records(path):
        if r.WhichOneof("record_type") == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                           for i in r.config.update})
    return config


# ---- MLflow (SQLite store in the run folder) ---------------------------------------------------


def test_mlflow_sqlite_scalars_pictures_and_resume(tmp_path, fresh_accelerate, monkeypatch):
    pytest.importorskip("mlflow", reason='MLflow not installed: pip install -e ".[mlflow]"')
    pytest.importorskip("sqlalchemy", reason='MLflow\'s SQLite store needs sqlalchemy: pip install -e ".[mlflow]"')
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    out = tmp_path / "run"
    cfg = _Cfg(output_dir=str(out), report_to="mlflow")
    with pytest.raises(_Crash):
        train(cfg, lambda c, data: _SimCLR(CRASH_AT), _pipeline, recipe="tracked")
    ids = json.loads((out / "trackers.json").read_text())["mlflow"]
    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    assert ids["tracking_uri"] == uri and ids["in_run_folder"] is True
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(ids["run_id"]).info.status == "FAILED"
    result = train(dataclasses.replace(cfg, resume="auto"), lambda c, data: _SimCLR(-1), _pipeline,
                   recipe="tracked")
    assert result.status == "completed"
    assert json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"] == ids["run_id"]
    run = client.get_run(ids["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["batch_size"] == "16" and run.data.params["resume"] == ""
    (experiment,) = [e for e in client.search_experiments() if e.name == "tracked"]
    assert len(client.search_runs([experiment.experiment_id])) == 1  # one run, continued
    want = _jsonl(out)
    for key in set().union(*want.values()):
        history = client.get_metric_history(ids["run_id"], key)
        last = {m.step: m.value for m in sorted(history, key=lambda m: m.timestamp)}
        assert last == pytest.approx({s: v[key] for s, v in want.items() if key in v},
                                     rel=1e-6), key
    steps = sorted(m.step for m in client.get_metric_history(ids["run_id"], "loss"))
    assert steps == [1, 2, 3, 3, 4]  # step 3 from both processes (MLflow keeps both)
    pictures = {Path(f.path).name for f in client.list_artifacts(ids["run_id"], "pictures")}
    assert pictures == {"curves.png", "embedding.png"}
    from contrastive.eval.cli import plot_main

    # the very pictures of `contrastive-plot RUN --data DATA` (same code, same seed)
    assert plot_main([str(out), "--data", cfg.data, "--out", str(tmp_path / "curves.png"),
                      "--embedding-out", str(tmp_path / "embedding.png"),
                      "--num-workers", "0"]) == 0
    for name in pictures:
        (sent,) = (out / "mlartifacts").rglob(name)
        assert sent.read_bytes() == (tmp_path / name).read_bytes(), name
    import mlflow

    assert mlflow.get_tracking_uri() != uri  # the run folder's store was this run's only
