"""``--data`` strings -> data sets: one grammar for every command.

Grammar::

    spec    := PATH | NAME [":" ARGS]
    ARGS    := ARG ("," ARG)*
    ARG     := KEY "=" VALUE | VALUE        a bare VALUE is the root folder (at most one)

    shapes                              built-in generated shapes (5,000 train images, 32 px)
    shapes:n=2000,size=32,seed=0        options: n, n_test, size, seed, clutter
    synthetic[:n=..,size=..,seed=..,num_classes=..,n_test=..]    uniform noise (smoke runs)
    cifar10 | cifar100[:ROOT][,download=false]   official pickles, downloaded to ROOT
                                        (default $CONTRASTIVE_DATA or ~/.cache/contrastive);
                                        a ROOT holding train/ is read as an image folder
    stl10[:ROOT][,unlabeled=true]       "train" includes the 100k unlabelled images if set
    imagefolder:PATH[,labels=false] | folder:PATH | PATH
                                        PATH/train + PATH/val (or PATH/test) if PATH/train
                                        exists, else PATH is the training set (no test split)
    wds:DIR | wds:DIR/train.json | wds:/data/train-{000000..000146}.tar
                                        tar shards (contrastive.data.shards; write them with
                                        contrastive-make-shards); option decode=auto|pil|full|reduced|fast

Every data set also takes ``fraction=F`` (a stratified, seeded subset: 0.01 for 1 % labels)
and ``fraction_seed=S``. VALUEs are parsed as bool (true/false/yes/no/on/off), int, float or
string. A PATH containing "," or "=" must be given bare (not after ``imagefolder:``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from contrastive.data.cifar import CIFARDataset, STL10Dataset
from contrastive.data.folder import ImageFolderDataset, resolve_folder_split
from contrastive.data.generated import ShapesDataset, SyntheticDataset
from contrastive.data.subset import subset_fraction
from contrastive.registry import Registry, RegistryKeyError

COMMON_KEYS = ("fraction", "fraction_seed")

SPEC_HELP = (
    "data set: 'shapes' (built in, generated; options n, n_test, size, seed, clutter, e.g. "
    "shapes:n=20000,size=32), 'synthetic' (noise), 'cifar10[:ROOT]', 'cifar100[:ROOT]', "
    "'stl10[:ROOT][,unlabeled=true]', 'imagefolder:PATH' or a PATH (PATH/train + PATH/val or "
    "PATH/test if PATH/train exists, else PATH is the training set; subfolders are classes), "
    "'wds:DIR' or 'wds:/data/train-{000000..000146}.tar' (tar shards from contrastive-make-shards); "
    "any of them with ',fraction=0.01' for a stratified 1%% subset"
)
"""One-line grammar for ``argparse`` help (``%%`` is argparse's escaped percent sign)."""


@dataclass
class DatasetEntry:
    """A registered data set: ``factory(root, split, transform, strict, **options) -> Dataset``."""

    factory: Callable[..., Dataset]
    keys: tuple[str, ...]
    splits: Callable[[str | None, dict, str], bool]
    doc: str


class UnknownDatasetError(RegistryKeyError):
    """A data set name that is not registered (and not a folder path)."""


# the policy shared by the package's registries is in contrastive.registry
_REGISTRY: Registry[DatasetEntry] = Registry("data set", normalize=str.lower,
                                             error=UnknownDatasetError)


def register_dataset(
    name: str,
    *aliases: str,
    keys: tuple[str, ...] = (),
    splits: Callable[[str | None, dict, str], bool] | tuple[str, ...] = ("train", "test"),
    doc: str = "",
    override: bool = False,
) -> Callable[[Callable[..., Dataset]], Callable[..., Dataset]]:
    """Decorator registering a factory ``f(root, split, transform, strict, **options)``.

    ``keys``: accepted option names; ``splits``: the split names it provides (or a function
    ``(root, options) -> bool`` per split, see :func:`has_split`). A taken name or alias raises
    ``ValueError`` unless ``override=True`` (the policy of :mod:`contrastive.registry`).
    """

    def wrap(factory: Callable[..., Dataset]) -> Callable[..., Dataset]:
        if isinstance(splits, tuple):
            fixed = splits

            def check(root: str | None, opts: dict, split: str) -> bool:
                return split in fixed

            split_fn: Any = check
        else:
            split_fn = splits
        entry = DatasetEntry(factory, tuple(keys), split_fn, doc or (factory.__doc__ or ""))
        _REGISTRY.add(name, entry, *aliases, override=override)
        return factory

    return wrap


def list_datasets() -> list[str]:
    return _REGISTRY.names()


@dataclass(frozen=True)
class ParsedSpec:
    name: str
    root: str | None
    options: dict[str, Any]


_BOOL = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _value(text: str) -> Any:
    t = text.strip()
    if t.lower() in _BOOL:
        return _BOOL[t.lower()]
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return t


def _looks_like_path(spec: str) -> bool:
    return (
        spec.startswith(("/", "./", "../", "~", "."))
        or os.sep in spec.split(":", 1)[0]
        or bool(re.match(r"^[A-Za-z]:[\\/]", spec))  # a Windows drive
    )


def parse_spec(spec: str) -> ParsedSpec:
    """Split a spec string into (name, root, options); see the module docstring for the grammar."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"data spec must be a non-empty string such as 'shapes' or '/path'; got {spec!r}")
    spec = spec.strip()
    head, sep, rest = spec.partition(":")
    if head not in _REGISTRY:
        if _looks_like_path(spec) or Path(spec).expanduser().exists():
            return ParsedSpec("imagefolder", spec, {})
        close = _REGISTRY.suggestions(head)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownDatasetError(
            f"unknown data set {head!r} in spec {spec!r}{hint} Known: {', '.join(list_datasets())}, "
            "or a folder path"
        )
    root: str | None = None
    options: dict[str, Any] = {}
    if sep and rest:
        for part in rest.split(","):
            if not part.strip():
                continue
            if "=" in part:
                k, _, v = part.partition("=")
                k = k.strip()
                if not k:
                    raise ValueError(f"empty option name in data spec {spec!r}")
                options[k] = _value(v)
            elif root is None:
                root = part.strip()
            else:
                raise ValueError(
                    f"data spec {spec!r}: a second bare value {part!r}; options are key=value "
                    f"(the one bare value is the root folder)"
                )
    key = _REGISTRY.resolve(head)
    entry = _REGISTRY.get(key)
    unknown = sorted(set(options) - set(entry.keys) - set(COMMON_KEYS))
    if unknown:
        raise ValueError(
            f"data spec {spec!r}: unknown option(s) {unknown}; {key} accepts "
            f"{sorted(set(entry.keys) | set(COMMON_KEYS))}"
        )
    return ParsedSpec(key, root, options)


def get_dataset(
    spec: str,
    split: str = "train",
    transform: Callable[[Any], Any] | None = None,
    strict: bool = False,
) -> Dataset:
    """The data set named by ``spec`` (module docstring), yielding ``(transform(image), label)``.

    ``image`` is an RGB PIL image for files (folders, CIFAR, STL-10) and a uint8 (3, H, W)
    tensor for the generated sets (shapes, synthetic); every pipeline of
    :mod:`contrastive.augment` takes both. ``label`` is an int, -1 when unlabelled.
    ``split``: "train" or "test" (folders: val/ or test/; generated sets: their held-out split).
    ``strict``: unreadable images raise instead of being skipped (folders).
    """
    p = parse_spec(spec)
    if not has_split(spec, split):
        where = f" under {Path(p.root).expanduser()}" if p.root else ""
        raise ValueError(
            f"data spec {spec!r} has no {split!r} split{where}"
            + (" (a folder needs train/ plus val/ or test/ for a test split)" if p.name == "imagefolder" else "")
        )
    opts = dict(p.options)
    fraction = opts.pop("fraction", None)
    fraction_seed = int(opts.pop("fraction_seed", 0))
    ds = _REGISTRY.get(p.name).factory(p.root, split, transform, strict, **opts)
    if fraction is not None and float(fraction) < 1.0:
        ds = subset_fraction(ds, float(fraction), seed=fraction_seed)
    return ds


def has_split(spec: str, split: str) -> bool:
    """Whether ``spec`` provides ``split`` (for folders: whether the folder exists)."""
    p = parse_spec(spec)
    return bool(_REGISTRY.get(p.name).splits(p.root, p.options, split))


def num_classes(dataset: Dataset) -> int | None:
    """Number of classes of a data set (None when unlabelled or unknown); sees through subsets
    and wrappers with a ``dataset`` attribute."""
    seen = 0
    node: object = dataset  # then the wrapped data sets, which may be any object
    while node is not None and seen < 16:
        n = getattr(node, "num_classes", None)
        if isinstance(n, int):
            return n
        classes = getattr(node, "classes", None)
        if classes:
            return len(classes)
        node = getattr(node, "dataset", None)
        seen += 1
    return None


# ---- the built-in data sets ----------------------------------------------------------------

def _no_root(name: str, root: str | None) -> None:
    if root is not None:
        raise ValueError(f"data spec {name}: takes no folder (got {root!r}); options are key=value")


def _generated_n(split: str, n: int, n_test: int | None) -> int:
    if split == "train":
        return int(n)
    return int(n_test) if n_test is not None else max(100, int(n) // 5)


@register_dataset("shapes", keys=("n", "n_test", "size", "seed", "clutter"))
def _shapes(root, split, transform, strict, n=5000, n_test=None, size=32, seed=0, clutter=0):
    """Generated shapes, 10 classes (contrastive.data.generated)."""
    _no_root("shapes", root)
    return ShapesDataset(_generated_n(split, n, n_test), int(size), int(seed), split, int(clutter), transform)


@register_dataset("synthetic", keys=("n", "n_test", "size", "seed", "num_classes"))
def _synthetic(root, split, transform, strict, n=1000, n_test=None, size=32, seed=0, num_classes=10):
    """Uniform noise with arbitrary labels (smoke runs)."""
    _no_root("synthetic", root)
    return SyntheticDataset(_generated_n(split, n, n_test), int(size), int(seed), split, int(num_classes), transform)


def _cifar(variant: str):
    def factory(root, split, transform, strict, download=True):
        if root is not None and (Path(root).expanduser() / "train").is_dir():
            folder = resolve_folder_split(root, split)
            if folder is None:
                raise ValueError(f"{variant}: {root} has train/ but no val/ or test/")
            return ImageFolderDataset(folder, transform, strict=strict)
        return CIFARDataset(root, split, transform, variant=variant, download=bool(download))

    factory.__doc__ = f"{variant}: official python pickles (downloaded), or an image folder with train/"
    return factory


register_dataset("cifar10", keys=("download",))(_cifar("cifar10"))
register_dataset("cifar100", keys=("download",))(_cifar("cifar100"))


def _stl_splits(root: str | None, opts: dict, split: str) -> bool:
    return split in ("train", "test", "unlabeled", "train+unlabeled")


@register_dataset("stl10", keys=("download", "unlabeled"), splits=_stl_splits)
def _stl10(root, split, transform, strict, download=True, unlabeled=False):
    """STL-10 binary files (downloaded); ``unlabeled=true`` adds the 100k images to train."""
    if split == "train" and unlabeled:
        split = "train+unlabeled"
    return STL10Dataset(root, split, transform, download=bool(download))


def _folder_splits(root: str | None, opts: dict, split: str) -> bool:
    if root is None:
        raise ValueError("data spec imagefolder needs a path: imagefolder:/path/to/images")
    if split not in ("train", "test"):
        return False
    path = Path(root).expanduser()
    if not path.is_dir():
        return split == "train"  # let get_dataset report the missing folder with its path
    return resolve_folder_split(path, split) is not None


@register_dataset("imagefolder", "folder", keys=("labels",), splits=_folder_splits)
def _imagefolder(root, split, transform, strict, labels=None):
    """A folder of images (see resolve_folder_split for train/test)."""
    if root is None:
        raise ValueError("data spec imagefolder needs a path: imagefolder:/path/to/images")
    folder = resolve_folder_split(root, split)
    if folder is None:
        raise ValueError(f"no {split!r} split under {Path(root).expanduser()}")
    return ImageFolderDataset(folder, transform, labels=labels, strict=strict)


def _wds_splits(root: str | None, opts: dict, split: str) -> bool:
    from contrastive.data.shard_index import resolve_shards

    if root is None:
        raise ValueError("data spec wds needs shards: wds:DIR or wds:/data/train-{000000..000146}.tar")
    return split in ("train", "test") and (split == "train" or resolve_shards(root, split) is not None)


@register_dataset("wds", "shards", keys=("decode",), splits=_wds_splits)
def _wds(root, split, transform, strict, decode="auto"):
    """Tar shards in the WebDataset layout, random access (contrastive.data.shards)."""
    from contrastive.data.shard_index import resolve_shards
    from contrastive.data.shards import ShardDataset

    if root is None:
        raise ValueError("data spec wds needs shards: wds:DIR or wds:/data/train-{000000..000146}.tar")
    found = resolve_shards(root, split)
    if found is None:
        raise ValueError(f"no {split!r} shards for wds:{root}")
    paths, classes = found
    return ShardDataset(paths, transform, classes=classes, strict=strict, decode=str(decode))
