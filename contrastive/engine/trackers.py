"""Experiment trackers through ``--report-to``: accelerate's integrations, continued on resume.

``--report-to`` names one or several (comma-separated) of accelerate's trackers, ``all`` (every
one installed) or ``none``. A name that accelerate does not know, or whose package is missing,
is a one-line error before anything is built (accelerate itself would skip a missing tracker
silently). Tested here: ``tensorboard``, ``wandb``, ``mlflow`` (extras ``[tensorboard]``,
``[wandb]``, ``[mlflow]``, all three ``[trackers]``); ``comet_ml``, ``aim``, ``clearml``,
``dvclive``, ``swanlab`` and ``trackio`` are passed to accelerate as they are.

What a tracker receives (on the main process):

- at the start, the run's configuration (its numbers, strings and booleans) as hyper-parameters;
- every record of ``metrics.jsonl`` as it is written, with the same keys at the same step
  (``step`` is the axis; text such as ``knn_when`` and empty values are not sent);
- at the end of a run that finished (not of one stopped to be resumed), the pictures
  ``contrastive-plot`` draws: ``curves`` (:func:`contrastive.eval.plot.plot_curves`) and, for
  image runs with a labelled held-out split, ``embedding`` (t-SNE of up to 2,000 held-out images
  encoded by the run's ``encoder.pt``, :func:`contrastive.eval.plot.plot_encoder_embedding`): as
  images through accelerate's ``log_images`` (TensorBoard, W&B, Aim, ClearML, SwanLab), as
  artefact files ``pictures/*.png`` in MLflow; trackers without images get none.

Where each tracked run lives, and how a resume continues it. The ids are kept in the run
folder's ``trackers.json`` and reused by a resume from a checkpoint (a new run without a
checkpoint starts new tracker runs):

- ``tensorboard``: event files in ``<run>/tensorboard/<recipe>/``. A resume writes into the same
  folder with ``purge_step`` = the checkpoint's step + 1 (torch's ``SummaryWriter``: TensorBoard
  hides what the stopped process wrote after the checkpoint, which the resume writes again).
- ``wandb``: ``wandb.init(project=<recipe>, name=<run folder name>, dir=<run>)`` (files in
  ``<run>/wandb/``; ``WANDB_MODE=offline``, ``WANDB_ENTITY`` ... as W&B reads them). A resume
  passes the stored id with ``resume="allow"`` (W&B's guide "Resume a run",
  docs.wandb.ai/guides/runs/resuming) and skips the steps W&B already holds (it drops a step
  below its counter; the resume recomputes the same values there).
- ``mlflow``: the store that ``MLFLOW_TRACKING_URI`` (or ``mlflow.set_tracking_uri``) names, else a
  SQLite store in the run folder, ``<run>/mlflow.db`` with artefacts in ``<run>/mlartifacts/``
  (``mlflow ui --backend-store-uri sqlite:///<run>/mlflow.db``); experiment = the recipe, run
  name = the run folder's name. A resume passes the stored run id to ``mlflow.start_run(run_id=
  ...)``, which reopens that run (MLflow's ``start_run`` documentation), when the store is the
  same; MLflow never changes a logged parameter, so a resume adds only new ones. MLflow keeps
  both values of a step logged twice (between the checkpoint and the stop).

References: accelerate 1.x, the "Experiment trackers" guide and reference
(huggingface.co/docs/accelerate/usage_guides/tracking, .../package_reference/tracking):
``Accelerator(log_with=...)``, ``init_trackers(project_name,
init_kwargs={name: {...}})`` (kwargs passed to each tracker's constructor: ``SummaryWriter``,
``wandb.init``, ``MLflowTracker``), ``Accelerator.trackers`` and each tracker's ``tracker``
(the W&B run, the MLflow active run), ``log``, ``log_images``, ``store_init_configuration`` and
``finish``; W&B's "Resume a run" (id + ``resume="allow"``); MLflow's ``mlflow.start_run``
(``run_id``: "get the run with the specified UUID and log parameters and metrics under that
run"); torch's ``SummaryWriter(purge_step=...)``. Nothing here imports a tracker's package
unless that tracker was asked for.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contrastive.records import TRACKERS_FILE

__all__ = ["EXTRAS", "parse_report_to", "install_hint", "scalars", "read_tracker_ids", "Trackers"]

logger = logging.getLogger(__name__)

#: The trackers this project tests, each the name of an extra that installs it (``[trackers]``
#: installs the three).
EXTRAS = ("tensorboard", "wandb", "mlflow")
MLFLOW_DB = "mlflow.db"  # the run folder's own MLflow store (when no tracking URI is set)
MLFLOW_ARTIFACTS = "mlartifacts"


def install_hint(name: str) -> str:
    """The command that installs tracker ``name``."""
    return f'pip install -e ".[{name}]"' if name in EXTRAS else f"pip install {name}"


def parse_report_to(value: str) -> tuple[str, ...]:
    """The trackers ``--report-to value`` asks for (``()`` for ``none``); ``all`` = those
    installed. Raises ``ValueError`` (one line naming the fix) for an unknown name or a tracker
    whose package is not installed."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names or names == ["none"]:
        return ()
    if "none" in names or ("all" in names and len(names) > 1):
        raise ValueError(f"--report-to {value}: 'none' and 'all' stand alone; give them alone "
                         "or a comma-separated list of trackers")
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

    installed = [str(t) for t in get_available_trackers()]
    if names == ["all"]:
        if not installed:
            raise ValueError("--report-to all: no tracker is installed; install one, e.g. "
                             "pip install -e \".[trackers]\" (TensorBoard, W&B and MLflow)")
        return tuple(installed)
    unknown = [n for n in names if n not in LOGGER_TYPE_TO_CLASS]
    if unknown:
        raise ValueError(f"--report-to: unknown tracker {', '.join(unknown)}; choose none, all "
                         f"or a comma-separated list of {', '.join(sorted(LOGGER_TYPE_TO_CLASS))}")
    for n in names:
        if n not in installed:
            raise ValueError(f"--report-to {n}: the {n} package is not installed: "
                             f"{install_hint(n)}")
    return tuple(dict.fromkeys(names))


def scalars(record: Mapping[str, Any]) -> dict[str, int | float]:
    """The values of a ``metrics.jsonl`` record that a tracker logs: its numbers, but ``step``
    (the axis)."""
    return {k: v for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def read_tracker_ids(out: Path) -> dict[str, Any]:
    """``<out>/trackers.json`` (``{}`` when absent or unreadable, with a warning for the latter)."""
    path = Path(out) / TRACKERS_FILE
    if not path.is_file():
        return {}
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        logger.warning("%s is unreadable (%s): the trackers start new runs", path, e)
        return {}
    return ids if isinstance(ids, dict) else {}


def _mlflow_uri_chosen() -> bool:
    """Whether the user chose an MLflow store (environment or ``mlflow.set_tracking_uri``)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return True
    try:  # MLflow's own test of the same; private, hence the fallback above
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set
    except ImportError:
        return False
    return bool(is_tracking_uri_set())


class Trackers:
    """The run's trackers (``names``: :func:`parse_report_to`); every method is a no-op without
    any and on processes other than the main one (accelerate starts trackers there only)."""

    def __init__(self, accelerator: Any, out: Path, names: Sequence[str]) -> None:
        self.acc, self.out, self.names = accelerator, Path(out), tuple(names)
        self._mlflow_own_store = False  # the run folder's store, set for this run only
        self._mlflow_continued = False

    # ---- start -----------------------------------------------------------------------------

    def start(self, project: str, config: Mapping[str, Any], resume_step: int | None) -> None:
        """Start (or, resuming from the checkpoint at ``resume_step``, continue) a tracked run
        named ``project`` (the recipe); log ``config``'s plain values; write ``trackers.json``."""
        if not self.names:
            return
        saved = read_tracker_ids(self.out) if resume_step is not None else {}
        kwargs: dict[str, dict[str, Any]] = {}
        if "tensorboard" in self.names and resume_step is not None:
            kwargs["tensorboard"] = {"purge_step": resume_step + 1}
        if "wandb" in self.names:
            kwargs["wandb"] = {"dir": str(self.out), "name": self.out.name}
            run_id = saved.get("wandb", {}).get("run_id")
            if run_id:
                kwargs["wandb"].update(id=run_id, resume="allow")
        if "mlflow" in self.names and self.acc.is_main_process:
            kwargs["mlflow"] = self._mlflow_kwargs(saved.get("mlflow", {}))
        self.acc.init_trackers(project, init_kwargs=kwargs)
        if not self.acc.is_main_process:
            return
        values = {k: v for k, v in config.items() if isinstance(v, (int, float, str, bool))}
        for tracker in self.acc.trackers:
            if tracker.name == "mlflow" and self._mlflow_continued:
                values_new = self._mlflow_new_params(tracker, values)
                if values_new:
                    tracker.store_init_configuration(values_new)
            else:
                tracker.store_init_configuration(values)
        self._write_ids(saved, continued=resume_step is not None)

    def _mlflow_kwargs(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """``MLflowTracker`` kwargs: the store (the user's, else the run folder's), the run name,
        and the saved run id when it lives in this store."""
        import mlflow

        kwargs: dict[str, Any] = {"run_name": self.out.name}
        if _mlflow_uri_chosen():
            uri, own = mlflow.get_tracking_uri(), False
        else:
            uri, own = f"sqlite:///{(self.out / MLFLOW_DB).resolve()}", True
            mlflow.set_tracking_uri(uri)
            self._mlflow_own_store = True
            kwargs["logging_dir"] = str((self.out / MLFLOW_ARTIFACTS).resolve())
        run_id = saved.get("run_id")
        same_store = bool(saved.get("in_run_folder")) if own else saved.get("tracking_uri") == uri
        if run_id and same_store:
            kwargs["run_id"] = run_id
            self._mlflow_continued = True
        elif run_id:
            logger.warning("MLflow run %s is in another store (%s) than this run's (%s): "
                           "starting a new MLflow run", run_id, saved.get("tracking_uri"), uri)
        return kwargs

    def _mlflow_new_params(self, tracker: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters the continued MLflow run does not hold yet (MLflow refuses to change
        a logged one); changed values are named in the log."""
        import mlflow

        have = mlflow.get_run(tracker.tracker.info.run_id).data.params
        changed = sorted(k for k, v in values.items() if k in have and have[k] != str(v))
        if changed:
            logger.info("MLflow keeps the first value of a parameter; not updated on resume: %s",
                        ", ".join(changed))
        return {k: v for k, v in values.items() if k not in have}

    def _write_ids(self, saved: Mapping[str, Any], *, continued: bool) -> None:
        ids: dict[str, Any] = dict(saved)
        for tracker in self.acc.trackers:
            if tracker.name == "tensorboard":
                ids["tensorboard"] = {"log_dir": os.path.relpath(tracker.logging_dir, self.out)}
            elif tracker.name == "wandb":
                run = tracker.tracker
                ids["wandb"] = {"run_id": run.id, "project": run.project}
            elif tracker.name == "mlflow":
                import mlflow

                info = tracker.tracker.info
                ids["mlflow"] = {"run_id": info.run_id, "experiment_id": info.experiment_id,
                                 "tracking_uri": mlflow.get_tracking_uri(),
                                 "in_run_folder": self._mlflow_own_store}
        path = self.out / TRACKERS_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(ids, indent=1))
        os.replace(tmp, path)
        for name in self.names:
            run_id = ids.get(name, {}).get("run_id")
            if run_id:
                same = continued and saved.get(name, {}).get("run_id") == run_id
                logger.info("%s run %s (%s)", name, run_id, "continued" if same else "new")

    # ---- during the run --------------------------------------------------------------------

    def log(self, record: Mapping[str, Any]) -> None:
        """A ``metrics.jsonl`` record, at its ``step``."""
        if not self.names:
            return
        step = int(record["step"])
        values = scalars(record)
        for tracker in self.acc.trackers:
            if tracker.name == "wandb" and step < getattr(tracker.tracker, "step", 0):
                continue  # W&B already holds this step (a resume recomputes it)
            tracker.log(values, step=step)

    # ---- the end ---------------------------------------------------------------------------

    def finish(self, *, step: int, status: str, data: str | None = None,
               device: Any = None) -> None:
        """Close the tracked runs. A run that finished (``status`` not ``"interrupted"`` or
        ``"failed"``) first logs its pictures at ``step``: the curves of ``metrics.jsonl``, and
        the embedding map of ``data``'s held-out split when ``data`` is given (image runs).
        Pictures are extras: a failure to draw or send one is a warning, not a failed run."""
        if not self.names or not self.acc.is_main_process:
            return
        try:
            if status not in ("interrupted", "failed"):
                with tempfile.TemporaryDirectory() as tmp:
                    self.log_pictures(self._draw(Path(tmp), data, device), step)
        finally:
            self._close(status)

    def _draw(self, folder: Path, data: str | None, device: Any) -> dict[str, Path]:
        from contrastive.eval import plot

        pictures: dict[str, Path] = {}
        try:
            pictures["curves"] = plot.plot_curves(self.out, folder / "curves.png")
        except (OSError, ValueError) as e:
            logger.warning("no curves picture for the trackers: %s", e)
        if data is None:
            return pictures
        try:
            embedding = self._draw_embedding(folder / "embedding.png", data, device)
        except Exception as e:  # noqa: BLE001 - data sets fail in many ways; the run is done
            logger.warning("no embedding map for the trackers: %s", e)
        else:
            if embedding is not None:
                pictures["embedding"] = embedding
        return pictures

    def _draw_embedding(self, out: Path, data: str, device: Any) -> Path | None:
        from contrastive.data import has_split
        from contrastive.eval.checkpoint import load_encoder
        from contrastive.eval.plot import plot_encoder_embedding
        from contrastive.records import ENCODER_FILE

        if not has_split(data, "test"):
            logger.info("no embedding map for the trackers: --data %s has no held-out split", data)
            return None
        loaded = load_encoder(self.out / ENCODER_FILE)
        return plot_encoder_embedding(loaded, data, out, image_size=loaded.image_size or 224,
                                      mean=loaded.mean, std=loaded.std, num_workers=0,
                                      device=device, progress=False)

    def log_pictures(self, pictures: Mapping[str, Path], step: int) -> None:
        """PNG files as images (``log_images``) or, in MLflow, as artefacts ``pictures/``."""
        if not pictures:
            return
        import numpy as np
        from PIL import Image

        arrays = {}
        for name, path in pictures.items():
            with Image.open(path) as im:
                arrays[name] = np.asarray(im.convert("RGB"))
        for tracker in self.acc.trackers:
            try:
                if tracker.name == "mlflow":
                    for path in pictures.values():
                        tracker.log_artifact(str(path), artifact_path="pictures")
                elif tracker.name == "tensorboard":  # add_images takes a batch: N x H x W x C
                    tracker.log_images({k: a[None] for k, a in arrays.items()}, step=step,
                                       dataformats="NHWC")
                elif hasattr(tracker, "log_images"):
                    tracker.log_images({k: [a] for k, a in arrays.items()}, step=step)
                else:
                    logger.info("%s takes no images: the pictures are not sent to it",
                                tracker.name)
            except Exception as e:  # noqa: BLE001 - a tracker's own failure; the run is done
                logger.warning("could not send the pictures to %s: %s", tracker.name, e)

    def _close(self, status: str) -> None:
        """Finish each tracked run; MLflow and W&B record a failure as such. A tracker that
        cannot close is a warning: the run itself is over (or already failing)."""
        for tracker in self.acc.trackers:
            try:
                if status == "failed" and tracker.name == "mlflow":
                    import mlflow

                    mlflow.end_run(status="FAILED")
                elif status == "failed" and tracker.name == "wandb":
                    tracker.tracker.finish(exit_code=1)
                else:
                    tracker.finish()
            except Exception as e:  # noqa: BLE001 - the tracker's own failure
                logger.warning("could not close the %s run: %s", tracker.name, e)
        self.acc.trackers.clear()
        if self._mlflow_own_store:  # back to MLflow's default for whatever runs next
            import mlflow

            mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None is MLflow's "unset"
            self._mlflow_own_store = False
