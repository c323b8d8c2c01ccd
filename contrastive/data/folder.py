"""Folders of image files: labelled (one subfolder per class) or unlabelled, with bad files skipped."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from contrastive.data.base import UNLABELLED, SkipUnreadable
from contrastive.data.decode import EncodedImage
from contrastive.data.io import (
    IMAGE_EXTENSIONS,
    CorruptImageError,
    check_image,
    is_image_file,
    load_rgb,
)

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


_CHECK_THREADS = 8  # file checks wait on storage more than on the CPU: a few threads overlap them
_CHECK_CHUNK = 256


def _checked(paths: list[Path]) -> Iterator[tuple[int, str | None]]:
    """``(index, check_image(path))`` for every path, in order, checked a chunk at a time by a
    few threads; stop iterating to stop checking."""
    with ThreadPoolExecutor(max_workers=min(_CHECK_THREADS, os.cpu_count() or 1)) as pool:
        for start in range(0, len(paths), _CHECK_CHUNK):
            chunk = paths[start : start + _CHECK_CHUNK]
            yield from enumerate(pool.map(check_image, chunk), start)


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


class ImageFolderDataset(SkipUnreadable):
    """Images under a folder; items ``(transform(rgb_pil_image), label)``.

    Layouts: ``root/<class>/**/<image>`` (labelled: classes are the sorted subfolder names, as
    torchvision's ImageFolder) or images anywhere under ``root`` (``labels=False``: label -1).
    ``labels=None`` picks labelled when ``root`` has subfolders holding images, else unlabelled.
    Files without an image extension are ignored; images are converted to RGB with their EXIF
    orientation applied (:func:`contrastive.data.io.load_rgb`); a transform that
    ``wants_encoded`` (``--decode device``) gets the file's bytes instead (:meth:`load`).

    Unreadable images (:class:`~contrastive.data.base.SkipUnreadable`): with ``strict=False``
    (default) a corrupt file is logged once (naming it), counted in :attr:`num_skipped` (across
    loader workers) and replaced by the next readable image (with that image's label), the
    generator restored for the replacement's views. ``strict=True`` checks every file up front
    (:func:`~contrastive.data.io.check_image`: header and end marker, a full decode only for
    suspects) and raises :class:`~contrastive.data.io.CorruptImageError` naming the first bad
    one, before any training starts; a file that passes the check but fails to decode later
    still raises when met. In both modes the files are checked up front until one is readable:
    a folder of nothing but unreadable files fails at once, naming the folder.

    Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` naming the folder when
    it holds no image.
    """

    unit = "file"
    fix = "replace or delete it"

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
        self._init_skips(strict)
        self._check_up_front(_checked(paths) if strict else
                             ((j, check_image(p)) for j, p in enumerate(paths)))

    def item_name(self, index: int) -> str:
        return str(self.paths[index])

    def where(self) -> str:
        return f"under {self.root}"

    def load(self, index: int) -> Any:
        """The image at ``index``: an RGB PIL image, or its undecoded bytes (an
        :class:`~contrastive.data.decode.EncodedImage`, full-size decoding) for a transform that
        ``wants_encoded`` (JPEGs decoded on the training device)."""
        path = self.paths[index]
        if not getattr(self.transform, "wants_encoded", False):
            return load_rgb(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptImageError(f"cannot read image {path}: {type(e).__name__}: {e}") from e
        return EncodedImage(data, str(path), reduced=False)  # a bad header: CorruptImageError

    @property
    def skipped_files(self) -> list[Path]:
        """The unreadable files met so far."""
        return [self.paths[i] for i in self.skipped()]

    def __repr__(self) -> str:
        kind = f"{len(self.classes)} classes" if self.classes else "unlabelled"
        return f"ImageFolderDataset({str(self.root)!r}, {len(self)} images, {kind})"
