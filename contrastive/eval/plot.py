"""Pictures of a run: training curves from ``metrics.jsonl`` and a 2-D map of embeddings.

Uses matplotlib and scikit-learn (dependencies of the package); the UMAP map needs the optional
extra: ``pip install -e ".[umap]"`` (umap-learn). Figures are written with the non-interactive
Agg back-end (no display needed).

- :func:`plot_curves`: one panel per logged quantity (loss, lr, kNN accuracy, positive-pair
  accuracy, ...) against the optimiser step; records without a value for a quantity are skipped,
  so sparse entries (a kNN monitor every few epochs) plot as their own points.
- :func:`plot_embedding`: a 2-D map of L2-normalised features, one colour per class: t-SNE
  (van der Maaten & Hinton, JMLR 2008; scikit-learn's implementation, PCA initialisation),
  UMAP (McInnes, Healy & Melville, arXiv:1802.03426, 2018; umap-learn) or PCA.

The pictures of a model (ViT self-attention, MAE reconstructions, retrieval grids) are in
:mod:`contrastive.eval.pictures`.

Seeds: PCA is exact (no randomness). t-SNE and UMAP take ``seed``; with it umap-learn runs
single-threaded and gives the same map for the same input, seed, versions and machine (its own
random generator and float32 numba code: nothing is promised across umap-learn / numba versions
or platforms).
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

__all__ = ["MAP_METHODS", "use_agg", "save_figure", "read_metrics", "plot_curves", "embed_2d", "plot_embedding",
           "plot_encoder_embedding", "require_umap"]

MAP_METHODS = ("tsne", "umap", "pca")
"""The 2-D maps :func:`embed_2d` draws."""
UMAP_INSTALL = 'pip install -e ".[umap]"'

# Panels first in this order, then any other numeric series; never these as y values.
_PREFERRED = ("loss", "lr", "knn_top1", "zeroshot_top1", "probe_top1", "knn", "pos_acc", "embedding_std", "pos_sim", "neg_sim")
_X_KEYS = ("step", "global_step", "iteration")
_SKIP = {"step", "global_step", "iteration", "epoch", "time", "timestamp", "wall", "elapsed", "rank"}


def use_agg() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg back-end (an ImportError of one line
    without matplotlib)."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("contrastive-plot needs matplotlib: pip install matplotlib scikit-learn") from e
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: str | Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to the PNG ``out`` (its folder made), close it; returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    use_agg().close(fig)
    return out


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a run folder or the file); bad lines are skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: give a run folder holding metrics.jsonl")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s:%d is not JSON; skipped", path, n)
            continue
        if isinstance(rec, dict):
            records.append(_flatten(rec))
    if not records:
        raise ValueError(f"{path} holds no metric records")
    return records


def _flatten(rec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}/")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def plot_curves(run: str | Path, out: str | Path, *, keys: Sequence[str] | None = None) -> Path:
    """Training curves of a run to a PNG; returns its path.

    Args:
        run: a run folder (with ``metrics.jsonl``) or the file itself.
        out: output PNG.
        keys: the quantities to plot (default: every numeric series, preferred ones first).
    """
    plt = use_agg()
    records = read_metrics(run)
    xkey = next((k for k in _X_KEYS if any(k in r for r in records)), None)
    series: dict[str, tuple[list[float], list[float]]] = {}
    for i, r in enumerate(records):
        x = r.get(xkey, i) if xkey else i
        if not _is_number(x):
            continue
        for k, v in r.items():
            if k in _SKIP or not _is_number(v):
                continue
            xs, ys = series.setdefault(k, ([], []))
            xs.append(float(x))
            ys.append(float(v))
    if keys is not None:
        unknown = [k for k in keys if k not in series]
        if unknown:
            raise KeyError(f"no numeric series {unknown} in the metrics; found {sorted(series)}")
        names = list(keys)
    else:
        rank = {k: i for i, k in enumerate(_PREFERRED)}
        names = sorted(series, key=lambda k: (rank.get(k.split("/")[-1], len(rank)), k))
    if not names:
        raise ValueError(f"no numeric series to plot in {run}")
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        xs, ys = series[name]
        style = "-" if len(xs) > 30 else "o-"
        ax.plot(xs, ys, style, lw=1.2, ms=3)
        if name.split("/")[-1] == "lr" and min(ys) > 0 and max(ys) / min(ys) > 100:
            ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel(xkey or "record")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle(str(Path(run).name))
    fig.tight_layout()
    return save_figure(fig, out)


def require_umap() -> Any:
    """The ``umap`` module, or an ``ImportError`` of one line that names the install command."""
    try:
        import umap
    except ImportError as e:
        raise ImportError(f"the UMAP map needs umap-learn: {UMAP_INSTALL}") from e
    return umap


def embed_2d(features: Tensor, *, method: str = "tsne", seed: int = 0, perplexity: float = 30.0,
             n_neighbors: int = 15, min_dist: float = 0.1) -> Tensor:
    """2-D coordinates (N, 2) of L2-normalised features (N, D), float32.

    ``method``: ``"tsne"`` (``perplexity``, capped at (N - 1) / 3), ``"umap"`` (``n_neighbors``,
    capped at N - 1, and ``min_dist``: umap-learn's defaults 15 and 0.1; euclidean distance
    between unit rows, i.e. ordered as the cosine) or ``"pca"``. ``seed``: see the module
    docstring for what it guarantees.
    """
    if method not in MAP_METHODS:
        raise ValueError(f"method {method!r} is not one of {MAP_METHODS}")
    x = torch.nn.functional.normalize(features.float(), dim=1)
    if x.shape[0] < 3:
        raise ValueError(f"need at least 3 samples for a 2-D map, got {x.shape[0]}")
    if method == "pca":
        x = x - x.mean(dim=0)
        _, _, v = torch.pca_lowrank(x, q=min(2, x.shape[1]), center=False)
        return x @ v[:, :2]
    if method == "umap":
        return _umap(x, seed=seed, n_neighbors=n_neighbors, min_dist=min_dist)
    try:
        from sklearn.manifold import TSNE
    except ImportError as e:
        raise ImportError("the t-SNE map needs scikit-learn: pip install scikit-learn") from e
    tsne = TSNE(n_components=2, perplexity=min(perplexity, (x.shape[0] - 1) / 3), init="pca",
                random_state=seed)
    return torch.from_numpy(tsne.fit_transform(x.numpy().astype("float64"))).float()


def _umap(x: Tensor, *, seed: int, n_neighbors: int, min_dist: float) -> Tensor:
    umap = require_umap()
    if n_neighbors < 2:
        raise ValueError(f"n_neighbors must be >= 2, got {n_neighbors}")
    reducer = umap.UMAP(n_components=2, n_neighbors=min(n_neighbors, x.shape[0] - 1),
                        min_dist=min_dist, metric="euclidean", random_state=seed)
    with warnings.catch_warnings():  # the seed makes it single-threaded: that is the point
        warnings.filterwarnings("ignore", message="n_jobs value", category=UserWarning)
        xy = reducer.fit_transform(x.numpy())
    return torch.as_tensor(xy, dtype=torch.float32)


def plot_embedding(
    features: Tensor,
    labels: Tensor,
    out: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    method: str = "tsne",
    title: str | None = None,
    seed: int = 0,
) -> Path:
    """Scatter the 2-D map of ``features`` (N, D) coloured by ``labels`` (N,) to a PNG."""
    plt = use_agg()
    xy = embed_2d(features, method=method, seed=seed).numpy()
    labels = labels.cpu().long()
    classes = sorted(labels.unique().tolist())
    cmap = plt.get_cmap("tab10" if len(classes) <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    for i, c in enumerate(classes):
        m = (labels == c).numpy()
        name = class_names[c] if class_names is not None and 0 <= c < len(class_names) else str(c)
        ax.scatter(xy[m, 0], xy[m, 1], s=6, color=cmap(i % cmap.N), label=name, alpha=0.8)
    if len(classes) <= 20:
        ax.legend(markerscale=2.5, fontsize=7, loc="best", frameon=False)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title or f"{method.upper()} of {len(labels)} embeddings")
    fig.tight_layout()
    return save_figure(fig, out)


def plot_encoder_embedding(
    loaded: Any,
    data: str,
    out: str | Path,
    *,
    image_size: int,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    split: str = "test",
    max_samples: int = 2000,
    method: str = "tsne",
    seed: int = 0,
    num_workers: int = 2,
    device: Any = None,
    progress: bool = True,
) -> Path:
    """The embedding map of ``contrastive-plot --data``: up to ``max_samples`` items of
    ``data``'s ``split`` (evenly spread over it) under the evaluation transform (``image_size``,
    ``mean``/``std``), encoded by ``loaded`` (a :class:`~contrastive.eval.checkpoint.LoadedEncoder`)
    on ``device`` (default: the CPU; ``progress``: a bar while encoding), drawn by :func:`plot_embedding` to ``out``. The trackers
    (``--report-to``) send the same picture at the end of a run."""
    from torch.utils.data import Subset

    from contrastive.data import dataset_len
    from contrastive.eval.runner import encode_split, eval_transform, load_split

    ds: Any = load_split(data, split, eval_transform(image_size, mean=mean, std=std))
    n = dataset_len(ds)
    if n > max_samples:  # class-balanced-ish: an even spread over the split
        idx = torch.linspace(0, n - 1, max_samples).long().unique().tolist()
        ds = Subset(ds, idx)
    feats, labels = encode_split(loaded, ds, num_workers=num_workers, device=device,
                                 progress=progress)
    base = ds.dataset if isinstance(ds, Subset) else ds
    title = f"{method.upper()} of {len(labels)} {split} embeddings ({loaded.name})"
    return plot_embedding(feats, labels, out, class_names=getattr(base, "classes", None),
                          method=method, title=title, seed=seed)
