"""Evaluators: the monitor's protocol, its two implementations, and keep-best.

An evaluator measures the live model every ``every`` epochs or optimiser steps (``per``), before
training when ``at_start``, and at the end; the loop writes its metrics into ``metrics.jsonl``
as a record of their own (``{"step", "epoch", <metrics>, "<name>_when": "start" | "epoch 3" |
"step 200" | "end"}``), which the curves picture (:mod:`contrastive.eval.plot`) draws.

- :class:`KNNEvaluator` (image runs): weighted-kNN top-1 on the held-out labelled split
  (:func:`contrastive.eval.runner.knn_on_splits`, ``contrastive-knn-eval``'s computation);
  metric ``knn_top1``.
- :class:`ZeroShotEvaluator` (image-text runs): zero-shot top-1 / top-5 over the held-out
  split's class names and image-text retrieval recall@1/5 both ways
  (:mod:`contrastive.eval.zeroshot`); metrics ``zeroshot_top1`` ... ``text_to_image_R@5``.
- :class:`STSEvaluator` (text runs): Spearman (and Pearson) of the cosine similarities of sentence
  embeddings with the gold scores of STS pairs, SimCSE's protocol (:mod:`contrastive.eval.sts`);
  metrics ``sts_spearman``, ``sts_pearson``. SimCSE selects its checkpoint on STS-B dev
  Spearman (the official ``run_sup_example.sh``: ``--metric_for_best_model stsb_spearman
  --load_best_model_at_end``): ``--keep-best sts_spearman``.
- :class:`GlueEvaluator` (labelled-text runs: fine-tuning, LRC-BERT): the official GLUE dev
  metric(s) of the task (:func:`contrastive.data.glue.glue_metrics`) of the method's
  ``predict`` on the dev set; metrics ``glue_accuracy``, ``glue_f1``, ``glue_mcc``,
  ``glue_pearson``, ``glue_spearman`` (those the task has) and ``glue_score`` (their mean, GLUE's
  task score): ``--keep-best glue_score``.
- :class:`BestKeeper` (``--keep-best METRIC``): the best value of one metric and its step,
  checkpointed with the run (a resume keeps it); the loop writes the run's artefacts into
  ``best/`` when the value improves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.utils.data import Subset

from contrastive.methods.base import encoder_of

__all__ = ["Evaluator", "KNNEvaluator", "ZeroShotEvaluator", "STSEvaluator", "GlueEvaluator",
           "BestKeeper", "feature_fn",
           "build_knn_evaluator", "build_zeroshot_evaluator", "build_sts_evaluator"]

logger = logging.getLogger(__name__)


class Evaluator(Protocol):
    """A monitor the loop runs (module docstring)."""

    name: str  # the "<name>_when" key of its records
    every: int  # 0: only at the start (if at_start) and at the end
    per: str  # "epoch" or "step"
    at_start: bool

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]: ...


class KNNEvaluator:
    """Weighted-kNN top-1 (``knn_top1``, %) of the ``feature`` features (``--knn-feature``:
    ``backbone`` or ``head``) every ``every`` epochs: the InstDisc / MoCo-CIFAR-demo protocol,
    bank = the training split under the evaluation transform, queries = the held-out split.

    Computed by :func:`contrastive.eval.runner.knn_on_splits`, the very function behind
    ``contrastive-knn-eval``: the figure equals the command's on the same encoder, data, crop
    size and batch size by construction. Features in eval mode (the loop sets it) without
    gradients, every process gets all rows (``gather_for_metrics``).

    Args:
        bank_set, query_set: labelled data sets yielding (eval view, label).
        k, t: neighbours and temperature. max_bank, max_query: random subsets (seed 0; 0 = all).
        batch_size, num_workers: extraction loader settings (per process).
    """

    name, per = "knn", "epoch"

    def __init__(self, bank_set: Any, query_set: Any, *, k: int = 200, t: float = 0.1,
                 max_bank: int = 0, max_query: int = 0, batch_size: int = 256,
                 num_workers: int = 0, num_classes: int | None = None, every: int = 1,
                 at_start: bool = False, feature: str = "backbone",
                 channels_last: bool = False) -> None:
        self.bank_set = _subset(bank_set, max_bank)
        self.query_set = _subset(query_set, max_query)
        self.k, self.t, self.num_classes = k, t, num_classes
        self.batch_size, self.num_workers = batch_size, num_workers
        self.every, self.at_start = every, at_start
        self.feature, self.channels_last = feature, channels_last

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        return {"knn_top1": self.top1(feature_fn(module, self.feature), accelerator)}

    @torch.no_grad()
    def top1(self, encode: Callable[[Tensor], Tensor], accelerator: Any) -> float:
        """Top-1 (%) of any feature function ``encode`` (the caller sets the eval mode)."""
        from contrastive.eval.runner import knn_on_splits

        res = knn_on_splits(
            encode, self.bank_set, self.query_set, k=self.k, temperature=self.t,
            num_classes=self.num_classes, batch_size=self.batch_size,
            num_workers=self.num_workers, accelerator=accelerator, progress=False,
            device_transform=_channels_last if self.channels_last else None,
            what="the kNN monitor")
        return float(res["accuracy"]["top1"])


def feature_fn(module: nn.Module, which: str) -> Callable[[Tensor], Tensor]:
    """The features the kNN evaluator sees: the method's backbone (``which="backbone"``) or its
    head/projector output (``"head"``); inputs cast to float64 for a ``--float64`` model."""
    encode: Callable[[Tensor], Tensor]
    if which == "head":
        head = getattr(module, "head", None) or getattr(module, "projector", None)
        if head is None:
            raise ValueError(f"--knn-feature head: {type(module).__name__} has no head/projector")
        backbone = encoder_of(module)

        def encode(x: Tensor) -> Tensor:
            return head(backbone(x))
    else:
        encode = encoder_of(module)
    if any(p.dtype == torch.float64 for p in encoder_of(module).parameters()):  # --float64
        inner = encode
        return lambda x: inner(x.double())
    return encode


def _channels_last(x: Tensor) -> Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def _subset(ds: Any, limit: int) -> Any:
    """``limit`` items of ``ds`` drawn at random (seed 0), in increasing order; all when
    ``limit`` is 0 or >= len. Random, not evenly spaced: a stride would alias with data sets
    whose labels cycle with the index (``shapes``: label = index % 10)."""
    n = len(ds)
    if limit <= 0 or limit >= n:
        return ds
    g = torch.Generator().manual_seed(0)
    return Subset(ds, sorted(torch.randperm(n, generator=g)[:limit].tolist()))


def build_knn_evaluator(cfg: Any, pipeline: Any, world: int) -> KNNEvaluator | None:
    """The kNN evaluator (``--knn-every``), or None when off or the data has no labelled
    held-out split. Bank and queries use the evaluation transform with the pipeline's
    normalisation, as ``contrastive-knn-eval`` on the finished run does."""
    if not cfg.knn_every:
        return None
    from contrastive.augment import get_pipeline
    from contrastive.data import get_dataset, has_split, num_classes

    if not has_split(cfg.data, "test"):
        logger.info("kNN monitor off: --data %s has no held-out labelled split", cfg.data)
        return None
    norm = {k: getattr(pipeline, k) for k in ("mean", "std") if hasattr(pipeline, k)}
    eval_tf = get_pipeline("eval", image_size=cfg.image_size, **norm)
    bank = get_dataset(cfg.data, "train", transform=eval_tf, strict=cfg.strict_data)
    query = get_dataset(cfg.data, "test", transform=eval_tf, strict=cfg.strict_data)
    n_cls = num_classes(bank)
    if n_cls is None:
        logger.info("kNN monitor off: --data %s has no labels", cfg.data)
        return None
    return KNNEvaluator(bank, query, k=cfg.knn_k, t=cfg.knn_t, max_bank=cfg.knn_max_train,
                        max_query=cfg.knn_max_test, batch_size=max(cfg.batch_size // world, 64),
                        num_workers=min(cfg.num_workers, 4), num_classes=n_cls,
                        every=cfg.knn_every, at_start=cfg.knn_at_start, feature=cfg.knn_feature,
                        channels_last=cfg.channels_last)


class ZeroShotEvaluator:
    """Zero-shot top-k and retrieval recall of an image-text model (``encode_image`` /
    ``encode_text``) on held-out image-caption pairs, every ``every`` optimiser steps.

    Every process computes the same figures on its own (no collective): the held-out set is
    monitor-sized (``max_items``).
    """

    name, per = "zeroshot", "step"

    def __init__(self, images: torch.Tensor, captions: Sequence[Sequence[str]], tokenizer: Any,
                 *, labels: torch.Tensor | None = None, classes: Sequence[str] = (),
                 templates: Sequence[str] | None = None, every: int = 0,
                 at_start: bool = False) -> None:
        self.images, self.captions, self.tokenizer = images, captions, tokenizer
        self.labels, self.classes, self.templates = labels, list(classes), templates
        self.every, self.at_start = every, at_start

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        from contrastive.eval.zeroshot import DEFAULT_TEMPLATES, evaluate_pairs

        res = evaluate_pairs(module, self.tokenizer, self.images, self.captions,
                             labels=self.labels, classes=self.classes,
                             templates=self.templates or DEFAULT_TEMPLATES)
        return {(f"zeroshot_{k}" if k.startswith("top") else k): round(v, 4)
                for k, v in res.items()}


def build_zeroshot_evaluator(cfg: Any, pipeline: Any, tokenizer: Any
                             ) -> ZeroShotEvaluator | None:
    """The zero-shot / retrieval evaluator (``--eval-every`` steps; 0 = only at the end), on
    the first ``--eval-max`` pairs of the held-out split (the training split when the data has
    none: retrieval only, a fit measure). Zero-shot needs class names (``classes``) and labels."""
    from contrastive.data import get_dataset, has_split
    from contrastive.eval.zeroshot import heldout_pairs

    if cfg.eval_max <= 0:
        return None
    split = "test" if has_split(cfg.data, "test") else "train"
    ds = get_dataset(cfg.data, split, transform=pipeline, strict=cfg.strict_data)
    images, labels, classes, captions = heldout_pairs(ds, cfg.eval_max)
    if split == "train":
        logger.info("zero-shot evaluator: --data %s has no held-out split; retrieval on the "
                    "first %d training pairs", cfg.data, len(captions))
    return ZeroShotEvaluator(images, captions, tokenizer, labels=labels, classes=classes,
                             every=cfg.eval_every, at_start=cfg.eval_at_start)


class STSEvaluator:
    """STS Spearman of a text method's sentence embeddings every ``every`` optimiser steps.

    The embedding is the method's ``embed(input_ids, attention_mask, token_type_ids)`` (SimCSE:
    the official ``sentemb_forward``, MLP at test only when supervised) or, without one, its
    ``encoder``'s pooled output; in eval mode (no dropout). Every process computes the same
    figures on its own (no collective): the pairs are monitor-sized (``--n-eval``; STS-B dev
    has 1,500).
    """

    name, per = "sts", "step"

    def __init__(self, text_a: Sequence[str], text_b: Sequence[str], scores: Any,
                 tokenizer: Any, *, every: int = 0, at_start: bool = False,
                 batch_size: int = 128) -> None:
        self.text_a, self.text_b, self.scores = list(text_a), list(text_b), scores
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.every, self.at_start = every, at_start

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        from contrastive.eval.sts import evaluate_sts

        embed: Any = getattr(module, "embed", None)
        if not callable(embed):
            embed = module.encoder
        res = evaluate_sts(module, self.tokenizer, self.text_a, self.text_b, self.scores,
                           batch_size=self.batch_size, embed=embed)
        return {"sts_spearman": round(res["spearman"], 6), "sts_pearson": round(res["pearson"], 6)}


def build_sts_evaluator(cfg: Any, tokenizer: Any) -> STSEvaluator | None:
    """The STS evaluator of a text run (``--eval``: ``generated`` = ``--n-eval`` pairs of the
    generated task's test stream, or a GLUE STS-B folder / TSV and ``--eval-split``; ``none``
    = no evaluator), every ``--eval-every`` steps and at the end."""
    if cfg.eval == "none":
        return None
    from contrastive.eval.sts import load_sts_pairs

    if cfg.eval != "generated" and not Path(cfg.eval).exists():
        raise FileNotFoundError(f"--eval {cfg.eval}: no such STS-B folder or file; give "
                                "'generated', a GLUE STS-B folder / TSV, or 'none'")
    a, b, gold = load_sts_pairs(cfg.eval, cfg.eval_split, cfg.n_eval, cfg.data_seed)
    return STSEvaluator(a, b, gold, tokenizer, every=cfg.eval_every, at_start=cfg.eval_at_start)


class GlueEvaluator:
    """The official GLUE dev metric(s) of ``task`` (a GLUE name; the generated tasks are scored
    as SST-2, MNLI, STS-B) of ``module.predict`` on ``dataset`` (items ``{"text_a",
    ["text_b"], "label"}``) every ``every`` optimiser steps, in eval mode
    (:func:`contrastive.methods.text_classifier.evaluate`). Every process computes the same
    figures on its own (no collective, so no process can wait on another that evaluates
    later). ``last``: the latest metrics, which the run's ``results.json`` reports."""

    name, per = "glue", "step"

    def __init__(self, dataset: Any, tokenizer: Any, task: str, *, every: int = 0,
                 at_start: bool = False, batch_size: int = 64) -> None:
        self.dataset, self.tokenizer, self.task = dataset, tokenizer, task
        self.every, self.at_start, self.batch_size = every, at_start, batch_size
        self.last: dict[str, float] | None = None
        # imported now, before the run seeds or restores its generators: importing
        # scikit-learn's metrics imports rich, which draws from Python's global `random`
        # (rich/style.py), so a first import mid-run would make a resumed run's Python random
        # state differ from the uninterrupted run's
        import sklearn.metrics  # noqa: F401

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        from contrastive.eval.glue import evaluate

        res = evaluate(module, self.dataset, self.tokenizer, self.task,
                       batch_size=self.batch_size)
        self.last = {f"glue_{k}": round(v, 6) for k, v in res.items()}
        return dict(self.last)


class BestKeeper:
    """The best value of ``metric`` so far (higher is better) and its step; an extra of the
    checkpoint (``checkpoint_state`` / ``load_checkpoint_state``), so a resume keeps it."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.value: float | None = None
        self.step: int | None = None

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Whether ``metrics`` holds a new best (then it is remembered)."""
        v = metrics.get(self.metric)
        if v is None or (self.value is not None and v <= self.value):
            return False
        self.value, self.step = float(v), step
        return True

    def checkpoint_state(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "step": self.step}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        if state.get("metric") == self.metric:
            self.value, self.step = state.get("value"), state.get("step")
