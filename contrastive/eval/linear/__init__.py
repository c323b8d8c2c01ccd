"""Linear probes on a frozen backbone: the MoCo protocol and a fast cached-feature protocol.

- :mod:`~contrastive.eval.linear.standard`: the standard (MoCo) protocol, a classifier trained
  on augmented crops through the frozen backbone (:func:`train_linear_standard`,
  :func:`evaluate_standard`), and the backbone-unchanged check (:func:`snapshot_state`,
  :func:`assert_unchanged`);
- :mod:`~contrastive.eval.linear.cached`: ours, for speed: features extracted once, an (lr,
  weight decay) grid trained at once and chosen on the training set (:func:`fit_linear_cached`);
- :mod:`~contrastive.eval.linear.common`: what both share: label checks (a probe needs at least
  two classes: with one, every head scores 100 % and the number means nothing, so
  :func:`check_classes` refuses), low-shot subsets (:func:`label_fraction_indices`) and scoring
  a head on features (:func:`evaluate_head`).

Every public name is importable from here.
"""

from __future__ import annotations

from contrastive.eval.linear.cached import (
    CV_FOLDS,
    DEFAULT_LRS,
    DEFAULT_WEIGHT_DECAYS,
    FALLBACK_LR,
    FALLBACK_WD,
    MIN_CV_ROWS,
    MIN_VAL_ROWS,
    CachedProbeResult,
    LinearHead,
    fit_linear_cached,
)
from contrastive.eval.linear.common import (
    check_classes,
    check_labels,
    evaluate_head,
    label_fraction_indices,
)
from contrastive.eval.linear.standard import (
    assert_unchanged,
    evaluate_standard,
    snapshot_state,
    train_linear_standard,
)

__all__ = [
    "LinearHead",
    "CachedProbeResult",
    "check_labels",
    "check_classes",
    "label_fraction_indices",
    "fit_linear_cached",
    "train_linear_standard",
    "evaluate_standard",
    "evaluate_head",
    "snapshot_state",
    "assert_unchanged",
    "DEFAULT_LRS",
    "DEFAULT_WEIGHT_DECAYS",
    "MIN_VAL_ROWS",
    "CV_FOLDS",
    "MIN_CV_ROWS",
    "FALLBACK_LR",
    "FALLBACK_WD",
]
