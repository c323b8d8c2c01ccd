"""Folders of image files: labelled (one subfolder per class) or unlabelled, with bad files skipped."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from contrastive.data.base import UNLABELLED, LabelledDataset
from contrastive.data.io import IMAGE_EXTENSIONS, CorruptImageError, is_image_file, load_rgb

logger = logging.getLogger(__name__)


def _walk_images(root: Path) -> list[Path]:
    """Image files under ``root`` (recursive, symlinks followed, hidden entries skipped), sorted."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".") and is_image_file(f)
        )
    return found


def _subdirs(root: Path) -> list[Path]:
    return sorted(
        (Path(e.path) for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")),
        key=lambda p: p.name,
    )


def resolve_folder_split(root: str | os.PathLike, split: str) -> Path | None:
    """The folder holding ``split`` of a data set rooted at ``root`` (None when it has none).

    One rule: if ``root/train/`` exists, "train" is ``root/train`` and "test" is ``root/val``
    or else ``root/test``; otherwise ``root`` itself is the training set and there is no
    test split.
    """
    root = Path(root).expanduser()
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test'; got {split!r}")
    if (root / "train").is_dir():
        if split == "train":
            return root / "train"
        for name in ("val", "test"):
            if (root / name).is_dir():
                return root / name
        return None
    return root if split == "train" else None


class ImageFolderDataset(LabelledDataset):
    """Images under a folder; items ``(transform(rgb_pil_image), label)``.

    Layouts: ``root/<class>/**/<image>`` (labelled: classes are the sorted subfolder names, as
    torchvision's ImageFolder) or images anywhere under ``root`` (``labels=False``: label -1).
    ``labels=None`` picks labelled when ``root`` has subfolders holding images, else unlabelled.
    Files without an image extension are ignored; images are converted to RGB with their EXIF
    orientation applied (:func:`contrastive.data.io.load_rgb`).

    Unreadable images: with ``strict=False`` (default) a corrupt file is logged once (naming
    it), counted in :attr:`num_skipped` (across loader workers) and replaced by the next
    readable image (with that image's label); ``strict=True`` raises
    :class:`~contrastive.data.io.CorruptImageError`.

    Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` naming the folder when
    it holds no image.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable[[Any], Any] | None = None,
        *,
        labels: bool | None = None,
        strict: bool = False,
    ) -> None:
        root = Path(root).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"data folder not found: {root}")
        class_dirs = [d for d in _subdirs(root) if _walk_images(d)] if labels is not False else []
        if labels is None:
            labels = bool(class_dirs)
        paths: list[Path] = []
        targets: list[int] = []
        if labels:
            if not class_dirs:
                raise ValueError(
                    f"no class subfolders with images under {root} (labels=True expects "
                    f"{root}/<class>/<image>; use labels=False for a flat folder)"
                )
            loose = [f for f in os.listdir(root) if is_image_file(f)]
            if loose:
                logger.warning(
                    "%d image(s) directly in %s are in no class folder and are ignored "
                    "(labels=False uses every image, unlabelled)", len(loose), root,
                )
            for idx, d in enumerate(class_dirs):
                files = _walk_images(d)
                paths += files
                targets += [idx] * len(files)
            classes = [d.name for d in class_dirs]
        else:
            paths = _walk_images(root)
            targets = [UNLABELLED] * len(paths)
            classes = []
        if not paths:
            raise ValueError(
                f"no images found under {root} (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}); "
                "check the path"
            )
        super().__init__(targets, transform, num_classes=len(classes) or None)
        self.root = root
        self.paths = paths
        self.classes = classes
        self.strict = strict
        # one byte per file, in shared memory so that loader workers see each other's findings
        self._bad = torch.zeros(len(paths), dtype=torch.uint8).share_memory_()

    def load(self, index: int) -> Any:
        return load_rgb(self.paths[index])

    @property
    def num_skipped(self) -> int:
        """Number of distinct unreadable files met so far (all loader workers together)."""
        return int(self._bad.sum())

    @property
    def skipped_files(self) -> list[Path]:
        return [self.paths[i] for i in self._bad.nonzero().flatten().tolist()]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a data set of {n} items")
        index %= n
        for step in range(n):
            j = (index + step) % n
            if self._bad[j]:
                continue
            try:
                img = self.load(j)
            except CorruptImageError:
                if self.strict:
                    raise
                if not self._bad[j]:
                    self._bad[j] = 1
                    logger.warning(
                        "skipping unreadable image %s (%d skipped so far; strict=True makes this "
                        "an error)", self.paths[j], self.num_skipped,
                    )
                continue
            if self.transform is not None:
                img = self.transform(img)
            return img, self.targets[j]
        raise CorruptImageError(f"no readable image under {self.root} ({n} files, all unreadable)")

    def __repr__(self) -> str:
        kind = f"{len(self.classes)} classes" if self.classes else "unlabelled"
        return f"ImageFolderDataset({str(self.root)!r}, {len(self)} images, {kind})"
