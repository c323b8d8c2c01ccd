"""CIFAR-10 / CIFAR-100 in the official python pickle format, and STL-10 in its binary format."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from contrastive.data.base import UNLABELLED, LabelledDataset
from contrastive.data.download import fetch_and_extract


def default_root() -> Path:
    """Where downloads go: ``$CONTRASTIVE_DATA`` or ``~/.cache/contrastive``."""
    return Path(os.environ.get("CONTRASTIVE_DATA", "~/.cache/contrastive")).expanduser()


# name -> (url, md5 of the archive, folder in the archive, train files, test files, label key,
#          meta file, class-name key)
CIFAR_SOURCES: dict[str, tuple[str, str, str, list[str], list[str], str, str, str]] = {
    "cifar10": (
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a",
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        "labels",
        "batches.meta",
        "label_names",
    ),
    "cifar100": (
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "eb9058c3a382ffc7106e4002c42a8d85",
        "cifar-100-python",
        ["train"],
        ["test"],
        "fine_labels",
        "meta",
        "fine_label_names",
    ),
}


# What the official batches hold: a dict of lists, bytes/str and one uint8 numpy array. Pickle
# can call any importable function while loading, so only the globals that rebuild a numpy
# array (protocols 2-5, numpy 1.x and 2.x module names) are admitted; nothing else is imported.
_ALLOWED_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
})


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles written by Python 3 use it for ``bytes``."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"refusing _codecs.encode(..., {encoding!r})")
    return text.encode("latin1")


class _BatchUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain containers, strings/bytes and numpy arrays."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def _unpickle(path: Path) -> dict:
    """Read an official CIFAR python batch without running code from it."""
    try:
        with open(path, "rb") as f:
            d = _BatchUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not an official CIFAR python batch ({e}); it was not "
                         "loaded (only dicts, lists, strings and numpy arrays are read). "
                         "Replace it with the file from the official archive") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} is not an official CIFAR python batch (it holds a "
                         f"{type(d).__name__}, not a dict); replace it with the file from the "
                         "official archive")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}


class CIFARDataset(LabelledDataset):
    """CIFAR-10 or CIFAR-100 (Krizhevsky 2009) from the official ``cifar-*-python`` pickles.

    Items ``(transform(rgb_pil_image_32x32), label)``; CIFAR-100 uses the 100 fine labels.

    Args:
        root: folder holding ``cifar-10-batches-py`` (or ``cifar-100-python``), or that folder
            itself; None: :func:`default_root`. Downloaded there (md5-checked, atomic) when
            missing and ``download`` is true.
        split: "train" (50,000) or "test" (10,000).
        variant: "cifar10" or "cifar100".
        url, md5: override the source (a mirror, or a local ``file://`` URL).
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        split: str = "train",
        transform: Callable[[Any], Any] | None = None,
        *,
        variant: str = "cifar10",
        download: bool = True,
        url: str | None = None,
        md5: str | None = None,
    ) -> None:
        if variant not in CIFAR_SOURCES:
            raise ValueError(f"variant must be one of {sorted(CIFAR_SOURCES)}; got {variant!r}")
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test' for {variant}; got {split!r}")
        src_url, src_md5, member, train_files, test_files, label_key, meta, names_key = CIFAR_SOURCES[variant]
        root = Path(root).expanduser() if root is not None else default_root()
        if (root / train_files[0]).exists():  # pointed at the batches folder itself
            folder = root
        else:
            hint = (f"Download {src_url} elsewhere and extract it so that {root / member} exists "
                    f"(or pass the spec '{variant}:/path/to/folder' holding {member})")
            folder = fetch_and_extract(url or src_url, md5 or src_md5, root, member,
                                       download_ok=download, local_hint=hint)
        data, labels = [], []
        for name in train_files if split == "train" else test_files:
            path = folder / name
            if not path.exists():
                raise FileNotFoundError(f"{variant}: missing {path}; the folder {folder} is incomplete")
            d = _unpickle(path)
            data.append(np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels += [int(v) for v in d[label_key]]
        self.data = np.ascontiguousarray(np.concatenate(data).transpose(0, 2, 3, 1))  # N, 32, 32, 3
        meta_path = folder / meta
        names = [n.decode() if isinstance(n, bytes) else n for n in _unpickle(meta_path)[names_key]] \
            if meta_path.exists() else [str(i) for i in range(max(labels) + 1)]
        super().__init__(labels, transform, num_classes=len(names))
        self.classes = names
        self.folder, self.split, self.variant = folder, split, variant

    def load(self, index: int) -> Image.Image:
        return Image.fromarray(self.data[index])

    def __repr__(self) -> str:
        return f"CIFARDataset({self.variant}, split={self.split!r}, {len(self)} images, {str(self.folder)!r})"


STL10_SOURCE = (
    "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz",
    "91f7769df0f17e558f3565bffb0c7dfb",
    "stl10_binary",
)
STL10_SPLITS = ("train", "test", "unlabeled", "train+unlabeled")


class STL10Dataset(LabelledDataset):
    """STL-10 (Coates et al. 2011), 96 x 96, from the official binary files.

    Splits: "train" (5,000 labelled), "test" (8,000), "unlabeled" (100,000, label -1) and
    "train+unlabeled" (the usual self-supervised pretraining set). Images are memory-mapped.
    Items ``(transform(rgb_pil_image_96x96), label)``.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        split: str = "train",
        transform: Callable[[Any], Any] | None = None,
        *,
        download: bool = True,
        url: str | None = None,
        md5: str | None = None,
    ) -> None:
        if split not in STL10_SPLITS:
            raise ValueError(f"split must be one of {STL10_SPLITS} for stl10; got {split!r}")
        src_url, src_md5, member = STL10_SOURCE
        root = Path(root).expanduser() if root is not None else default_root()
        if (root / "train_X.bin").exists():
            folder = root
        else:
            hint = (f"Download {src_url} elsewhere and extract it so that {root / member} exists "
                    f"(or pass the spec 'stl10:/path/to/folder' holding {member})")
            folder = fetch_and_extract(url or src_url, md5 or src_md5, root, member,
                                       download_ok=download, local_hint=hint)
        parts = {"train+unlabeled": ["train", "unlabeled"]}.get(split, [split])
        self._arrays, targets = [], []
        for part in parts:
            x_path = folder / f"{part}_X.bin"
            if not x_path.exists():
                raise FileNotFoundError(f"stl10: missing {x_path}; the folder {folder} is incomplete")
            x = np.memmap(x_path, dtype=np.uint8, mode="r").reshape(-1, 3, 96, 96)
            self._arrays.append(x)
            y_path = folder / f"{part}_y.bin"
            if y_path.exists():
                targets += [int(v) - 1 for v in np.fromfile(y_path, dtype=np.uint8)]
            else:
                targets += [UNLABELLED] * x.shape[0]
        self._offsets = np.cumsum([0] + [a.shape[0] for a in self._arrays])
        names_path = folder / "class_names.txt"
        names = names_path.read_text().split() if names_path.exists() else [str(i) for i in range(10)]
        super().__init__(targets, transform, num_classes=len(names))
        self.classes = names
        self.folder, self.split = folder, split

    def load(self, index: int) -> Image.Image:
        part = int(np.searchsorted(self._offsets, index, side="right")) - 1
        chw = self._arrays[part][index - self._offsets[part]]
        # the files store each channel column-major
        return Image.fromarray(np.ascontiguousarray(chw.transpose(2, 1, 0)))

    def __repr__(self) -> str:
        return f"STL10Dataset(split={self.split!r}, {len(self)} images, {str(self.folder)!r})"
