"""The cached-feature linear probe (ours, for speed): an (lr, weight decay) grid trained at once.

Features of centre crops are extracted once; a linear head on standardised features,
``y = W (f - mu) / sigma + b``, is trained by SGD (momentum 0.9, cosine lr, cross-entropy) for
every (lr, weight decay) pair of a small grid at once (one matmul for all heads). The pair is
chosen on the TRAINING set, never on the evaluation split, and the chosen head is then retrained
on all training rows. How it is chosen depends on how many labelled rows there are
(:func:`fit_linear_cached` records which, in ``CachedProbeResult.selection``):

- ``"held-out"``: a held-out ``val_fraction`` (10 %) of the rows, when that is at least
  ``MIN_VAL_ROWS`` (100) rows: one accuracy point is then at most 1 % of the held-out part;
- ``"cross-validation"``: otherwise, stratified ``CV_FOLDS``-fold (5, fewer when a class has
  fewer rows) cross-validation on all rows, when there are at least ``MIN_CV_ROWS`` (20) rows and
  every class has at least 2 (so that each fold's training part holds every class);
- ``"fallback"``: otherwise (e.g. one label per class) no estimate is worth having: the fixed
  ``FALLBACK_LR`` / ``FALLBACK_WD`` (0.1, 1e-3; the grid values nearest to them), with a warning;
- ``"given"``: the grid has one pair (``--lr`` with one weight decay).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from contrastive.eval.linear.common import check_classes, check_labels

log = logging.getLogger(__name__)

__all__ = ["LinearHead", "CachedProbeResult", "fit_linear_cached", "DEFAULT_LRS",
           "DEFAULT_WEIGHT_DECAYS", "MIN_VAL_ROWS", "CV_FOLDS", "MIN_CV_ROWS", "FALLBACK_LR",
           "FALLBACK_WD"]

DEFAULT_LRS: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
DEFAULT_WEIGHT_DECAYS: tuple[float, ...] = (0.0, 1e-4, 1e-3, 1e-2)
MIN_VAL_ROWS = 100  # a held-out split smaller than this: cross-validation instead
CV_FOLDS = 5
MIN_CV_ROWS = 20  # fewer labelled rows than this: the fixed fallback pair
FALLBACK_LR, FALLBACK_WD = 0.1, 1e-3  # not tuned per data set; used only when nothing can be measured


class LinearHead(nn.Module):
    """``logits = linear((f - mean) / std)``: the cached-protocol classifier, shape (N, D) -> (N, C)."""

    mean: Tensor  # buffer (D,)
    std: Tensor  # buffer (D,)

    def __init__(self, mean: Tensor, std: Tensor, num_classes: int) -> None:
        super().__init__()
        self.register_buffer("mean", mean.clone().float())
        self.register_buffer("std", std.clone().float())
        self.linear = nn.Linear(mean.numel(), num_classes)

    def forward(self, features: Tensor) -> Tensor:
        return self.linear((features.float() - self.mean) / self.std)


@dataclass
class CachedProbeResult:
    """The chosen head and how (lr, wd) were chosen.

    ``selection``: "held-out", "cross-validation", "fallback" or "given" (module docstring);
    ``sweep``: top-1 per (lr, wd) on the held-out rows or pooled over the folds (empty for
    "fallback" / "given"); ``val_rows``: rows scored per pair; ``folds``: 0 unless
    cross-validation.
    """

    head: LinearHead
    lr: float
    weight_decay: float
    sweep: list[dict[str, float]] = field(default_factory=list)
    selection: str = "given"
    val_rows: int = 0
    folds: int = 0


def _train_heads(
    x: Tensor,
    y: Tensor,
    num_classes: int,
    lrs: Tensor,
    wds: Tensor,
    *,
    epochs: int,
    batch_size: int,
    momentum: float,
    seed: int,
) -> tuple[Tensor, Tensor]:
    """SGD with momentum and cosine lr for H linear heads at once, one (lr, wd) each.

    x (N, D) standardised features, y (N,). Returns weights (H, D, C) and biases (H, C).
    The heads are one (D, H*C) matrix, so a step is two matmuls. The cross-entropy gradient is
    written out (no autograd): for logits z = x W + b of a batch of B rows,
    dL/dz = (softmax(z) - onehot(y)) / B, dL/dW = x^T dL/dz, dL/db = sum_rows dL/dz. The update is
    PyTorch SGD's: g = grad + wd * w; buf = momentum * buf + g; w -= lr_t * buf (no decay on the
    bias), lr_t = lr * (1 + cos(pi t / T)) / 2. Heads share minibatches but not parameters, so each
    follows exactly the trajectory it would follow alone.
    """
    n, d = x.shape
    h, c = lrs.numel(), num_classes
    w = torch.zeros(d, h, c, dtype=x.dtype, device=x.device)
    b = torch.zeros(h, c, dtype=x.dtype, device=x.device)
    buf_w, buf_b = torch.zeros_like(w), torch.zeros_like(b)
    lr_w = lrs.to(x).view(1, h, 1)
    lr_b = lrs.to(x).view(h, 1)
    wd_w = wds.to(x).view(1, h, 1)
    gen = torch.Generator().manual_seed(seed)
    total = max(1, epochs * math.ceil(n / batch_size))
    step = 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(x.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            xb, yb = x[idx], y[idx]
            z = torch.addmm(b.view(1, h * c), xb, w.view(d, h * c)).view(-1, h, c)  # B x H x C
            g = torch.softmax(z, dim=2)
            g[torch.arange(yb.numel(), device=x.device), :, yb] -= 1.0
            g /= yb.numel()
            gw = (xb.T @ g.view(-1, h * c)).view(d, h, c)
            gb = g.sum(dim=0)
            scale = 0.5 * (1.0 + math.cos(math.pi * step / total))
            buf_w.mul_(momentum).add_(gw).add_(wd_w * w)
            buf_b.mul_(momentum).add_(gb)
            w.sub_(scale * lr_w * buf_w)
            b.sub_(scale * lr_b * buf_b)
            step += 1
    return w.permute(1, 0, 2).contiguous(), b


def _standardise(x: Tensor) -> tuple[Tensor, Tensor]:
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False).clamp_min(1e-6)
    return mean, std


def fit_linear_cached(
    features: Tensor,
    labels: Tensor,
    *,
    num_classes: int | None = None,
    epochs: int = 100,
    batch_size: int = 256,
    lrs: Sequence[float] = DEFAULT_LRS,
    weight_decays: Sequence[float] = DEFAULT_WEIGHT_DECAYS,
    val_fraction: float = 0.1,
    momentum: float = 0.9,
    seed: int = 0,
    min_val_rows: int = MIN_VAL_ROWS,
) -> CachedProbeResult:
    """Fit a linear head on cached features, choosing (lr, wd) on a split of the training set.

    Args:
        features: (N, D) training features (float; kept on their device).
        labels: (N,) training labels in [0, num_classes).
        num_classes: C; default max(labels) + 1.
        epochs, batch_size, momentum: SGD settings (cosine lr to 0 over all steps).
        lrs, weight_decays: the grid; every pair is trained (all in one batched matmul).
        val_fraction: share of the training rows held out to pick the pair, when that is at least
            ``min_val_rows`` rows; else cross-validation or the fallback pair (module docstring).
        seed: seeds the split, the folds and the minibatch order.
        min_val_rows: the smallest held-out split used (``MIN_VAL_ROWS``).

    Returns:
        :class:`CachedProbeResult` with the head retrained on all N rows with the chosen pair.

    Raises:
        ValueError: mismatched shapes, bad labels, fewer than two classes, an empty grid.
    """
    if features.ndim != 2 or features.shape[0] != labels.shape[0]:
        raise ValueError(
            f"features {tuple(features.shape)} and labels {tuple(labels.shape)} do not match: "
            "expected (N, D) and (N,)"
        )
    num_classes = check_labels(labels, num_classes, "training labels")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    check_classes(labels, "training labels")
    x = features.float()
    y = labels.long().to(x.device)
    grid = [(float(lr), float(wd)) for lr in lrs for wd in weight_decays]
    if not grid:
        raise ValueError("the (lr, weight decay) grid is empty; give at least one of each")

    def correct_on(tr_idx: Tensor, val_idx: Tensor) -> Tensor:
        return _grid_correct(x, y, tr_idx, val_idx, grid, num_classes=num_classes, epochs=epochs,
                             batch_size=batch_size, momentum=momentum, seed=seed)

    n = x.shape[0]
    n_val = int(round(val_fraction * n))
    counts = torch.bincount(y.cpu(), minlength=num_classes)
    smallest = int(counts[counts > 0].min())
    sweep: list[dict[str, float]] = []
    val_rows, folds = 0, 0
    if len(grid) == 1:
        selection, best = "given", grid[0]
    elif min_val_rows <= n_val < n:
        selection, val_rows = "held-out", n_val
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(x.device)
        correct = correct_on(perm[n_val:], perm[:n_val])
        accs = (correct * (100.0 / n_val)).tolist()
    elif n >= MIN_CV_ROWS and smallest >= 2:
        selection, val_rows, folds = "cross-validation", n, min(CV_FOLDS, smallest)
        fold = _stratified_folds(y.cpu(), folds, seed).to(x.device)
        per_fold = [correct_on((fold != f).nonzero().flatten(), (fold == f).nonzero().flatten())
                    for f in range(folds)]
        correct = torch.stack(per_fold).sum(dim=0)  # float64 counts: exact in any order
        accs = (correct * (100.0 / n)).tolist()
    else:
        selection = "fallback"
        best = (_nearest(lrs, FALLBACK_LR), _nearest(weight_decays, FALLBACK_WD))
        log.warning(
            "linear probe: too few labelled rows to choose lr / weight decay (%d rows, smallest "
            "class %d; cross-validation needs >= %d rows and >= 2 per class): using the fixed "
            "fallback lr=%g wd=%g", n, smallest, MIN_CV_ROWS, *best,
        )
    if selection in ("held-out", "cross-validation"):
        sweep = [{"lr": lr, "weight_decay": wd, "val_top1": acc} for (lr, wd), acc in zip(grid, accs)]
        best = grid[max(range(len(grid)), key=lambda i: (accs[i], -i))]  # first best: grid order breaks ties
        how = f"{folds}-fold cross-validation over" if folds else "held-out split of"
        log.info("linear probe: lr / weight decay chosen by %s %d labelled training rows: lr=%g wd=%g",
                 how, val_rows, *best)
    mean, std = _standardise(x)
    w, b = _train_heads(
        (x - mean) / std,
        y,
        num_classes,
        torch.tensor([best[0]]),
        torch.tensor([best[1]]),
        epochs=epochs,
        batch_size=batch_size,
        momentum=momentum,
        seed=seed,
    )
    head = LinearHead(mean, std, num_classes).to(x.device)
    with torch.no_grad():
        head.linear.weight.copy_(w[0].T)
        head.linear.bias.copy_(b[0])
    return CachedProbeResult(head=head, lr=best[0], weight_decay=best[1], sweep=sweep, selection=selection,
                             val_rows=val_rows, folds=folds)


def _grid_correct(x: Tensor, y: Tensor, tr_idx: Tensor, val_idx: Tensor, grid: list[tuple[float, float]],
                  *, num_classes: int, epochs: int, batch_size: int, momentum: float, seed: int) -> Tensor:
    """Correct predictions on ``val_idx`` (H,) of one head per grid pair trained on ``tr_idx``
    (features standardised with the training rows' statistics)."""
    mean, std = _standardise(x[tr_idx])
    w, b = _train_heads((x[tr_idx] - mean) / std, y[tr_idx], num_classes,
                        torch.tensor([g[0] for g in grid]), torch.tensor([g[1] for g in grid]),
                        epochs=epochs, batch_size=batch_size, momentum=momentum, seed=seed)
    logits = torch.einsum("nd,hdc->hnc", (x[val_idx] - mean) / std, w) + b[:, None, :]
    return (logits.argmax(dim=2) == y[val_idx]).sum(dim=1).cpu().double()


def _stratified_folds(y: Tensor, folds: int, seed: int) -> Tensor:
    """Fold number (N,) of every row: each class's rows, shuffled, dealt round-robin, so every
    fold holds floor or ceil(n_c / folds) rows of class c."""
    gen = torch.Generator().manual_seed(seed)
    fold = torch.empty_like(y)
    for c in y.unique().tolist():
        members = (y == c).nonzero().flatten()
        members = members[torch.randperm(members.numel(), generator=gen)]
        fold[members] = torch.arange(members.numel()) % folds
    return fold


def _nearest(values: Sequence[float], target: float) -> float:
    """The first of ``values`` closest to ``target``."""
    return float(min(values, key=lambda v: abs(float(v) - target)))
