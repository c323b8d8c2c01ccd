"""Whole evaluations from a data spec: linear probe (cached / standard) and weighted kNN.

These glue :mod:`contrastive.data` (datasets from a spec string), :mod:`contrastive.augment`
(the evaluation transforms) and the probes; the command-line tools and the demo call them.
Evaluation split: ``"test"`` (``val/`` or ``test/`` of a folder); the probe's hyper-parameters
never look at it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence, Sized
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from contrastive.eval.checkpoint import LoadedEncoder
from contrastive.eval.features import Encoder, extract_features
from contrastive.eval.knn import knn_accuracy
from contrastive.eval.linear import (
    DEFAULT_LRS,
    DEFAULT_WEIGHT_DECAYS,
    assert_unchanged,
    check_classes,
    check_labels,
    evaluate_head,
    evaluate_standard,
    fit_linear_cached,
    label_fraction_indices,
    snapshot_state,
    train_linear_standard,
)

log = logging.getLogger(__name__)

__all__ = [
    "PROTOCOLS",
    "eval_transform",
    "linear_train_transform",
    "load_split",
    "dataset_labels",
    "encode_split",
    "linear_eval",
    "knn_eval",
    "knn_on_splits",
    "check_label_fraction",
]

PROTOCOLS = ("cached", "standard")


Norm = Sequence[float] | None


def _norm(mean: Norm, std: Norm) -> dict[str, tuple[float, ...]]:
    from contrastive.augment import IMAGENET_MEAN, IMAGENET_STD

    return {"mean": tuple(mean or IMAGENET_MEAN), "std": tuple(std or IMAGENET_STD)}


def eval_transform(image_size: int, mean: Norm = None, std: Norm = None):
    """Centre crop (resize 256 / crop 224 at ImageNet size; whole image at <= 64 px), normalised
    with ``mean`` / ``std`` (ImageNet statistics by default: use the pretraining ones)."""
    from contrastive.augment import get_pipeline

    return get_pipeline("eval", image_size=image_size, **_norm(mean, std))


def linear_train_transform(image_size: int, mean: Norm = None, std: Norm = None):
    """The MoCo linear-probe augmentation: RandomResizedCrop(scale 0.08-1) + horizontal flip."""
    from contrastive.augment import Pipeline, ViewConfig

    return Pipeline([ViewConfig(size=image_size, crop="random", scale=(0.08, 1.0), flip_p=0.5)],
                    name="linear-train", **_norm(mean, std))


def check_label_fraction(fraction: float) -> float:
    """``fraction`` if 0 < fraction <= 1, else ValueError naming the accepted range (checked
    before any data is read or encoded)."""
    if not (isinstance(fraction, (int, float)) and 0.0 < float(fraction) <= 1.0):
        raise ValueError(
            f"label fraction must be in (0, 1] (e.g. 0.01 for 1 % of the labels, 1 for all); got {fraction!r}"
        )
    return float(fraction)


def load_split(data: str, split: str, transform: Any) -> Dataset:
    """``get_dataset(data, split, transform)``, with clear errors for a missing path or a missing
    or empty split."""
    from contrastive.data import get_dataset, has_split
    from contrastive.data.spec import parse_spec

    spec = parse_spec(data)
    if spec.name == "imagefolder" and spec.root is not None and not Path(spec.root).expanduser().exists():
        raise FileNotFoundError(f"--data {data!r}: the path {Path(spec.root).expanduser()} does not exist")
    if not has_split(data, split):
        raise ValueError(
            f"--data {data!r} has no {split!r} split; evaluation needs a labelled train split "
            "and an evaluation split (an ImageFolder root with train/ and val/ or test/)"
        )
    ds: Any = get_dataset(data, split=split, transform=transform)
    if len(ds) == 0:
        raise ValueError(f"the {split!r} split of --data {data!r} is empty (0 images)")
    return ds


def dataset_labels(ds: Any) -> Tensor:
    """All labels of a dataset, from ``targets``/``labels`` when it has them, else by iterating."""
    if isinstance(ds, Subset):
        return dataset_labels(ds.dataset)[torch.as_tensor(ds.indices)]
    for attr in ("targets", "labels"):
        values = getattr(ds, attr, None)
        if values is not None and len(values) == len(ds):
            return torch.as_tensor(list(values) if not isinstance(values, Tensor) else values).long()
    log.info("dataset has no .targets: reading %d samples to collect the labels", len(ds))
    return torch.tensor([int(ds[i][1]) for i in range(len(ds))])


def _num_classes(ds: Dataset, labels: Tensor) -> int:
    from contrastive.data import num_classes

    n = num_classes(ds)
    n = n if n is not None else check_labels(labels, None, "training labels")
    check_labels(labels, n, "training labels")
    return n


def _loader(ds: Dataset, batch_size: int, *, shuffle: bool, num_workers: int, seed: int, accelerator: Any):
    from contrastive.data import build_loader

    # one pass (features): no persistent workers, which a prepared loader would keep alive
    loader = build_loader(ds, batch_size, shuffle=shuffle, num_workers=num_workers, seed=seed, drop_last=False,
                          persistent_workers=shuffle)
    if accelerator is not None:
        loader = accelerator.prepare_data_loader(loader)
    return loader


def autocast_dtype(accelerator: Any) -> torch.dtype | None:
    mp = getattr(accelerator, "mixed_precision", "no") if accelerator is not None else "no"
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(mp))


def encode_split(
    loaded: LoadedEncoder | Encoder,
    ds: Dataset,
    *,
    batch_size: int = 256,
    num_workers: int = 2,
    accelerator: Any | None = None,
    device: str | None = None,
    device_transform: Callable[[Tensor], Tensor] | None = None,
    progress: bool = True,
) -> tuple[Tensor, Tensor]:
    """Features (N, D) and labels (N,) of a dataset (in order), gathered over processes.

    ``loaded``: a loaded checkpoint, a module, or a function of the image batch (the module is
    moved to the device; a function is the caller's to place)."""
    encoder = loaded.encoder if isinstance(loaded, LoadedEncoder) else loaded
    dev = accelerator.device if accelerator is not None else torch.device(device or "cpu")
    if isinstance(encoder, torch.nn.Module):
        encoder.to(dev)
    loader = _loader(ds, batch_size, shuffle=False, num_workers=num_workers, seed=0, accelerator=accelerator)
    return extract_features(encoder, loader, accelerator=accelerator, device=dev,
                            device_transform=device_transform, autocast_dtype=autocast_dtype(accelerator),
                            progress=progress)


def _class_names(ds: Any) -> list[str] | None:
    seen = 0
    while ds is not None and seen < 16:
        classes = getattr(ds, "classes", None)
        if classes:
            return [str(c) for c in classes]
        ds = getattr(ds, "dataset", None)
        seen += 1
    return None


def rows_per_class(ds: Dataset, labels: Tensor) -> dict[str, int]:
    """Labelled rows per class, keyed by class name (the class index when the data set has no
    names), for the result files: what a probe was actually trained on."""
    names = _class_names(ds)
    counts = torch.bincount(labels.long().cpu()).tolist() if labels.numel() else []
    return {(names[c] if names and c < len(names) else str(c)): n for c, n in enumerate(counts) if n}


def _subset(ds: Dataset, labels: Tensor, fraction: float, seed: int) -> tuple[Dataset, Tensor]:
    if fraction >= 1.0:
        return ds, labels
    idx = label_fraction_indices(labels, fraction, seed)
    log.info("label fraction %g: %d of %d training images", fraction, idx.numel(), labels.numel())
    return Subset(ds, idx.tolist()), labels[idx]


def linear_eval(
    loaded: LoadedEncoder,
    data: str,
    *,
    protocol: str = "cached",
    image_size: int = 224,
    mean: Norm = None,
    std: Norm = None,
    epochs: int | None = None,
    batch_size: int = 256,
    label_fraction: float = 1.0,
    lr: float | None = None,
    lrs: Sequence[float] = DEFAULT_LRS,
    weight_decays: Sequence[float] = DEFAULT_WEIGHT_DECAYS,
    num_workers: int = 2,
    seed: int = 0,
    accelerator: Any | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Linear-probe top-1 / top-5 on the evaluation split of ``data``.

    ``mean`` / ``std``: the normalisation of the pretraining pipeline (default ImageNet's).
    ``protocol="cached"``: centre-crop features once, (lr, wd) sweep on a held-out 10 % of the
    training set (cross-validation, or a fixed pair, when too few labelled rows remain: see
    :mod:`contrastive.eval.linear`), 100 epochs by default. ``label_fraction`` must lie in (0, 1]
    and fewer than two classes are refused, both before any feature is extracted. ``"standard"``: the MoCo protocol (augmented crops every
    epoch, SGD lr 30 (``lr``), momentum 0.9, wd 0, lr x0.1 at 60 % and 80 % of 100 epochs).

    Returns the result dict written by ``contrastive-linear-eval``: ``top1``, ``top5``,
    ``settings`` (including the lr / wd used and ``lr_wd_selection``: how they were chosen),
    ``train_per_class`` (labelled rows per class), ``checkpoint`` (with the sha256 of every file
    read), ``sweep``.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not one of {PROTOCOLS}")
    label_fraction = check_label_fraction(label_fraction)
    t0 = time.perf_counter()
    main = accelerator is None or accelerator.is_main_process
    test_ds = load_split(data, "test", eval_transform(image_size, mean, std))
    settings: dict[str, Any] = {"image_size": image_size, "batch_size": batch_size,
                                "label_fraction": label_fraction, "seed": seed, **_norm(mean, std)}
    extra: dict[str, Any] = {}
    if protocol == "cached":
        train_ds = load_split(data, "train", eval_transform(image_size, mean, std))
        labels = dataset_labels(train_ds)
        n_classes = _num_classes(train_ds, labels)
        train_ds, labels = _subset(train_ds, labels, label_fraction, seed)
        check_classes(labels, f"training labels of --data {data!r}")
        per_class = rows_per_class(train_ds, labels)
        before = snapshot_state(loaded.encoder)
        xtr, ytr = encode_split(loaded, train_ds, batch_size=batch_size, num_workers=num_workers,
                                accelerator=accelerator, device=device)
        xte, yte = encode_split(loaded, test_ds, batch_size=batch_size, num_workers=num_workers,
                                accelerator=accelerator, device=device)
        assert_unchanged(loaded.encoder, before)  # eval mode: BN statistics must not move
        check_labels(yte, n_classes, f"evaluation labels of --data {data!r}")
        epochs = 100 if epochs is None else epochs
        res = fit_linear_cached(xtr, ytr, num_classes=n_classes, epochs=epochs, batch_size=batch_size,
                                lrs=(lr,) if lr is not None else lrs, weight_decays=weight_decays, seed=seed)
        acc = evaluate_head(res.head, xte, yte)
        settings |= {"epochs": epochs, "lr": res.lr, "weight_decay": res.weight_decay,
                     "lr_wd_selection": res.selection, "selection_rows": res.val_rows, "cv_folds": res.folds,
                     "optimizer": "SGD momentum 0.9, cosine lr", "features": "standardised",
                     "sweep_lrs": list(lrs) if lr is None else [lr], "sweep_weight_decays": list(weight_decays),
                     "val_fraction": 0.1}
        extra["sweep"] = res.sweep
        n_train = xtr.shape[0]
    else:
        train_ds = load_split(data, "train", linear_train_transform(image_size, mean, std))
        labels = dataset_labels(train_ds)
        n_classes = _num_classes(train_ds, labels)
        test_labels = dataset_labels(test_ds)
        check_labels(test_labels, n_classes, f"evaluation labels of --data {data!r}")
        train_ds, labels = _subset(train_ds, labels, label_fraction, seed)
        check_classes(labels, f"training labels of --data {data!r}")
        per_class = rows_per_class(train_ds, labels)
        epochs = 100 if epochs is None else epochs
        lr_selection = "given" if lr is not None else "default (MoCo: 30)"
        lr = 30.0 if lr is None else lr
        loader = _loader(train_ds, batch_size, shuffle=True, num_workers=num_workers, seed=seed,
                         accelerator=accelerator)
        encoder = loaded.encoder
        head = train_linear_standard(encoder, loader, num_classes=n_classes, epochs=epochs, lr=lr,
                                     accelerator=accelerator, device=device,
                                     autocast_dtype=autocast_dtype(accelerator), seed=seed, progress=main)
        test_loader = _loader(test_ds, batch_size, shuffle=False, num_workers=num_workers, seed=0,
                              accelerator=accelerator)
        acc = evaluate_standard(encoder, head, test_loader, accelerator=accelerator, device=device,
                                autocast_dtype=autocast_dtype(accelerator))
        settings |= {"epochs": epochs, "lr": lr, "lr_wd_selection": lr_selection, "momentum": 0.9, "weight_decay": 0.0,
                     "lr_steps": [round(0.6 * epochs), round(0.8 * epochs)], "gamma": 0.1,
                     "train_augmentation": "RandomResizedCrop(0.08-1) + flip", "backbone": "frozen, eval mode"}
        n_train = labels.numel()
    return {
        "top1": acc["top1"],
        "top5": acc["top5"],
        "protocol": protocol,
        "settings": settings,
        "checkpoint": loaded.describe(),
        "data": data,
        "num_classes": n_classes,
        "num_train": n_train,
        "train_per_class": per_class,
        "num_test": len(cast(Sized, test_ds)),
        "seconds": round(time.perf_counter() - t0, 2),
        **extra,
    }


def knn_on_splits(
    encoder: LoadedEncoder | Encoder,
    bank_ds: Dataset,
    query_ds: Dataset,
    *,
    k: int = 200,
    temperature: float = 0.1,
    num_classes: int | None = None,
    batch_size: int = 256,
    store: str = "float32",
    num_workers: int = 2,
    accelerator: Any | None = None,
    device: str | None = None,
    device_transform: Callable[[Tensor], Tensor] | None = None,
    progress: bool = True,
    what: str = "the data",
) -> dict[str, Any]:
    """Weighted-kNN accuracy of ``query_ds`` against the labelled bank ``bank_ds``: the one
    computation behind ``contrastive-knn-eval`` and the training monitor
    (:class:`contrastive.engine.evaluators.KNNEvaluator`).

    Both splits are encoded (:func:`encode_split`, every process gets all rows), ``k`` is clamped
    to the bank size, and faiss (exact ``IndexFlatIP``, or fp16 with ``store="float16"``) finds
    the neighbours. Returns ``accuracy`` ({top1, top5} in percent), ``k`` (used), ``num_classes``,
    ``bank_labels``, ``num_bank`` and ``num_queries``.
    """
    kw: dict[str, Any] = dict(batch_size=batch_size, num_workers=num_workers, accelerator=accelerator,
                              device=device, device_transform=device_transform, progress=progress)
    xtr, ytr = encode_split(encoder, bank_ds, **kw)
    xte, yte = encode_split(encoder, query_ds, **kw)
    n_classes = check_labels(ytr, num_classes, f"training labels of {what}")
    check_labels(yte, n_classes, f"evaluation labels of {what}")
    k_used = min(k, xtr.shape[0])
    if k_used < k:
        log.warning("k=%d is larger than the bank (%d training images): using k=%d", k, xtr.shape[0], k_used)
    acc = knn_accuracy(xtr, ytr, xte, yte, k=k_used, temperature=temperature, num_classes=n_classes, store=store)
    return {"accuracy": acc, "k": k_used, "num_classes": n_classes, "bank_labels": ytr,
            "num_bank": xtr.shape[0], "num_queries": xte.shape[0]}


def knn_eval(
    loaded: LoadedEncoder,
    data: str,
    *,
    k: int = 200,
    temperature: float = 0.1,
    image_size: int = 224,
    mean: Norm = None,
    std: Norm = None,
    batch_size: int = 256,
    store: str = "float32",
    num_workers: int = 2,
    accelerator: Any | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Weighted-kNN top-1 / top-5: bank = train split, queries = evaluation split (centre crops).

    ``k`` is clamped to the bank size; the result records the k used (``settings.k``) and the
    one asked for (``settings.k_requested``).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    t0 = time.perf_counter()
    transform = eval_transform(image_size, mean, std)
    train_ds = load_split(data, "train", transform)
    test_ds = load_split(data, "test", transform)
    bank_labels = dataset_labels(train_ds)
    check_labels(bank_labels, None, f"training labels of --data {data!r}")
    check_classes(bank_labels, f"training labels of --data {data!r}")
    from contrastive.data import num_classes

    res = knn_on_splits(loaded, train_ds, test_ds, k=k, temperature=temperature, num_classes=num_classes(train_ds),
                        batch_size=batch_size, store=store, num_workers=num_workers, accelerator=accelerator,
                        device=device, what=f"--data {data!r}")
    acc, k_used, n_classes, ytr = res["accuracy"], res["k"], res["num_classes"], res["bank_labels"]
    return {
        "top1": acc["top1"],
        "top5": acc["top5"],
        "protocol": "knn",
        "settings": {"k": k_used, "k_requested": k, "temperature": temperature, "image_size": image_size, "store": store,
                     **_norm(mean, std),
                     "features": "L2-normalised", "index": "faiss IndexFlatIP" if store == "float32"
                     else "faiss IndexScalarQuantizer fp16 (approximate)"},
        "checkpoint": loaded.describe(),
        "data": data,
        "num_classes": n_classes,
        "num_train": res["num_bank"],
        "train_per_class": rows_per_class(train_ds, ytr),
        "num_test": res["num_queries"],
        "seconds": round(time.perf_counter() - t0, 2),
    }
