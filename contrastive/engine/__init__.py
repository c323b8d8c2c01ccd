"""The training engine: config -> data, method, optimiser on ``accelerate`` -> checkpoints, logs.

Only this package (and :mod:`contrastive.eval`) imports accelerate. A recipe is a dataclass of
the paper's hyper-parameters (an :class:`ImageConfig` subclass) plus one call::

    from contrastive.engine import ImageConfig, run
    run(MyConfig, build_method, build_pipeline)          # images; build_method(cfg, data)
    run(MyConfig, build_method, adapter=ImageTextAdapter(model_config))  # image-text
    run(MyConfig, build_method, adapter=TextAdapter(training_groups))    # text
    run(MyConfig, build_method, adapter=LabelledTextAdapter(model_folder))  # labelled text

- :mod:`~contrastive.engine.config`: dataclass -> argparse, every field a flag
  (:class:`RunConfig`, what every run has; fields declared with :mod:`~contrastive.engine.fields`);
  :func:`run`, and :func:`cli` / :func:`bad_input` for recipes that read their own input first
  (one-line errors);
- :mod:`~contrastive.engine.kits`: one kit per modality, each its configuration, data adapter,
  evaluators and artefacts in one module (:class:`ImageConfig` images, :class:`DualEncoderConfig`
  image-text pairs, :class:`TextConfig` sentences, :class:`LabelledTextConfig` labelled
  sentences / pairs); the engine sees them through :class:`DataAdapter`;
- :mod:`~contrastive.engine.handoff`: :class:`DataInfo`, what the method is given of the data
  (steps per epoch, batch geometry, tokenizer, task, teacher ...);
- :mod:`~contrastive.engine.evaluators`: the monitors' protocol (each kit has its own: kNN,
  zero-shot and retrieval, STS Spearman, the GLUE dev metric) and keep-best;
- :mod:`~contrastive.engine.optim`: SGD / AdamW / LARS with bias and norm parameters excluded;
- :mod:`~contrastive.engine.schedules`: lr schedules as plain functions of the step;
- :mod:`~contrastive.engine.loader`: deterministic, resumable data order (built on the seeded
  loader stack of :mod:`contrastive.data.loader`);
- :mod:`~contrastive.engine.checkpoint`: atomic checkpoints in safe formats (safetensors,
  ``weights_only`` torch files, JSON with each file's hash), compatibility and exactness checks;
- :mod:`~contrastive.engine.trainer`: the loop, told top to bottom, with its pieces in
  :mod:`~contrastive.engine.setup` (set-up), :mod:`~contrastive.engine.step` (the step),
  :mod:`~contrastive.engine.run_log` (metrics.jsonl) and :mod:`~contrastive.engine.stop`
  (signals);
- :mod:`~contrastive.engine.trackers`: ``--report-to`` (TensorBoard, W&B, MLflow ... through
  accelerate): the metrics.jsonl records and the end pictures, the same tracker runs on resume.

What a run leaves on disk (``encoder.pt``, the run-folder layout) is defined in
:mod:`contrastive.records`, which evaluation reads.
"""

from contrastive.engine.checkpoint import (
    IncompatibleCheckpointError,
    ResumeMismatchError,
    find_latest,
    model_signature,
)
from contrastive.engine.config import (
    RunConfig,
    config_from_dict,
    config_to_dict,
    parse_config,
)
from contrastive.engine.evaluators import Evaluator
from contrastive.engine.fields import help_field, override
from contrastive.engine.handoff import DataInfo, data_info
from contrastive.engine.kits import (
    BertOptimiser,
    BertSizes,
    CifarConfig,
    DataAdapter,
    DIMConfig,
    DualEncoderConfig,
    ImageAdapter,
    ImageConfig,
    ImageTextAdapter,
    ImageTextConfig,
    LabelledTextAdapter,
    LabelledTextConfig,
    TextAdapter,
    TextConfig,
    TextRunConfig,
    dual_encoder_kwargs,
)
from contrastive.engine.kits.labelled_text import GlueEvaluator
from contrastive.engine.optim import build_optimizer, param_groups
from contrastive.engine.run import bad_input, cli, run, setup_logging
from contrastive.engine.schedules import cosine_lr, linear_lr, lr_at, scaled_lr, step_lr
from contrastive.engine.setup import reset_accelerate_state
from contrastive.engine.trainer import NonFiniteLossError, TrainResult, train, write_encoder

__all__ = [
    "BertOptimiser",
    "BertSizes",
    "CifarConfig",
    "DIMConfig",
    "DataAdapter",
    "DataInfo",
    "Evaluator",
    "GlueEvaluator",
    "ImageAdapter",
    "ImageTextAdapter",
    "DualEncoderConfig",
    "ImageTextConfig",
    "LabelledTextAdapter",
    "LabelledTextConfig",
    "RunConfig",
    "IncompatibleCheckpointError",
    "NonFiniteLossError",
    "ResumeMismatchError",
    "TextAdapter",
    "TextConfig",
    "TextRunConfig",
    "ImageConfig",
    "TrainResult",
    "bad_input",
    "build_optimizer",
    "cli",
    "config_from_dict",
    "config_to_dict",
    "cosine_lr",
    "data_info",
    "dual_encoder_kwargs",
    "find_latest",
    "help_field",
    "override",
    "linear_lr",
    "lr_at",
    "model_signature",
    "param_groups",
    "parse_config",
    "reset_accelerate_state",
    "run",
    "scaled_lr",
    "setup_logging",
    "step_lr",
    "train",
    "write_encoder",
]

#: names renamed since: old -> new (still importable from here, with a one-time notice)
_RENAMED = {"TrainConfig": "ImageConfig"}


def __getattr__(name: str) -> object:
    """``TrainConfig``, the image kit's configuration's old name: ``ImageConfig`` with a
    ``FutureWarning`` (recipes written before the kits keep working)."""
    if name in _RENAMED:
        from contrastive.engine.compat import warn_renamed

        warn_renamed(f"contrastive.engine.{name}", _RENAMED[name])
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
