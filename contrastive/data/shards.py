"""Tar shards in the WebDataset layout read as a MAP-STYLE data set (:class:`ShardDataset`).

The format, its byte-offset index and the spec forms (``wds:DIR`` ...) are in
:mod:`contrastive.data.shard_index`.

Why our own index rather than ``webdataset``'s iterable pipeline or its ``wids`` reader: the
engine's promises (one global order from the seed, the same number of samples on every process
whatever the shard sizes, a mid-epoch resume that skips micro-batches by count, and per-sample
views seeded from (seed, epoch, index)) come from a map-style data set driven by
:class:`~contrastive.engine.loader.GlobalBatchSampler`; an index of byte offsets, built once
from the tar headers with the standard ``tarfile`` module and cached beside each shard
(``NAME.tar.idx.json``), gives exactly that with no new dependency. ``wids`` would give it too,
but its default decoders unpickle ``.pyd``/``.pickle`` members and hand ``.pth`` to
``torch.load``; here only the members the toolkit uses are ever read (the image, the ``cls``
label, the ``txt`` caption when asked), everything else is skipped unread, so nothing in a
shard can run code.

The shards written by :func:`contrastive.data.make_shards.write_shards` keep each source image's original bytes in the
source order, so sample i of the shards is image i of the source: the same ``--seed`` gives
the same global order, and (per-image path, ``decode=full`` or ``pil``) the same views, as
training from the folder.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contrastive.data.base import UNLABELLED, SkipUnreadable
from contrastive.data.decode import EncodedImage
from contrastive.data.io import CorruptImageError, check_image_bytes, decode_rgb
from contrastive.data.shard_index import (
    IMAGE_KEYS,
    LABEL_KEY,
    TEXT_KEY,
    build_shard_index,
    expand_shard_spec,
    load_shard_index,
    resolve_shards,
    split_name,
)

logger = logging.getLogger(__name__)

# the index names stay importable from here (they were defined here before the split)
__all__ = ["ShardDataset", "build_shard_index", "load_shard_index", "expand_shard_spec",
           "resolve_shards", "split_name", "IMAGE_KEYS", "LABEL_KEY", "TEXT_KEY"]

_MAX_OPEN = 64
DECODE_MODES = ("auto", "pil", "full", "reduced", "fast")


class ShardDataset(SkipUnreadable):
    """Samples of tar shards, random access; items ``(transform(image), label)``.

    Args:
        shards: tar paths, in order (sample indices run through them in that order).
        transform: applied to the image.
        classes: class names (the shard list's), else ``0 .. max label`` when labelled.
        strict: every sample is checked before training (header and end marker, as
            :class:`~contrastive.data.folder.ImageFolderDataset`) and the first bad one, or a
            sample with no image member, raises :class:`CorruptImageError` naming shard and key.
        decode: ``"pil"``: the image is an RGB PIL image (any transform); ``"full"``: an
            :class:`~contrastive.data.decode.EncodedImage` decoded at full size (the same pixels
            as "pil", faster); ``"reduced"``: also reduced-scale decoding where a crop allows;
            ``"fast"`` (opt-in): "reduced" with libjpeg-turbo's fast inverse DCT and chroma
            upsampling (less exact: PSNR in ``benchmarks/results/decode.md``; needs simplejpeg);
            ``"auto"`` (default): "full" when the transform decodes on the training device
            (``wants_encoded``: ``--decode device``), "reduced" when it takes encoded images
            (the pipelines of :mod:`contrastive.augment`), else "pil".
        cache_index: write each shard's index beside it (``NAME.tar.idx.json``).
        with_text: items are ``(image, label, captions)``, the captions the lines of the
            sample's ``.txt`` member (every sample must have one; see :meth:`captions`).

    Unreadable images (:class:`~contrastive.data.base.SkipUnreadable`, as the folder data set):
    strict off, named once, counted in :attr:`num_skipped` (shared by the loader workers) and
    replaced by the next readable sample, the generator restored for the replacement's views;
    the samples are checked up front until one is readable (shards of nothing but unreadable
    images fail at once). Samples without an image member are named and left out when the index
    is read.
    """

    unit = "sample"
    fix = "fix the shard"

    def __init__(self, shards: Sequence[str | os.PathLike], transform: Callable[[Any], Any] | None = None,
                 *, classes: Sequence[str] = (), strict: bool = False, decode: str = "auto",
                 cache_index: bool = True, with_text: bool = False) -> None:
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(map(repr, DECODE_MODES))}; got {decode!r}")
        self.shards = [Path(s) for s in shards]
        if not self.shards:
            raise ValueError("no shards given")
        keys: list[str] = []
        exts: list[str] = []
        shard_of: list[int] = []
        offsets: list[int] = []
        sizes: list[int] = []
        targets: list[int] = []
        text_at: list[tuple[int, int]] = []
        missing: list[str] = []
        ignored: dict[str, int] = {}
        self.shard_sizes: list[int] = []
        for s, path in enumerate(self.shards):
            idx = load_shard_index(path, cache=cache_index)
            for key, ext, off, size, label, t_off, t_size in idx["samples"]:
                text_at.append((t_off, t_size))
                keys.append(key)
                exts.append(ext)
                shard_of.append(s)
                offsets.append(off)
                sizes.append(size)
                targets.append(int(label))
            self.shard_sizes.append(len(idx["samples"]))
            missing += [f"{path}:{k}" for k in idx["no_image"]]
            for e, n in idx["ignored"].items():
                ignored[e] = ignored.get(e, 0) + n
        if missing:
            msg = (f"{len(missing)} sample(s) have no image member ({', '.join(sorted(IMAGE_KEYS))}); "
                   f"first: {missing[0]}")
            if strict:
                raise CorruptImageError(msg + " (strict mode (--strict-data): fix the shards or leave "
                                        "strict mode off to skip them)")
            logger.warning("%s: left out", msg)
        if ignored:
            logger.info("shards hold members the toolkit does not read (left unread): %s",
                        ", ".join(f"{n} x .{e or '(no extension)'}" for e, n in sorted(ignored.items())))
        if not keys:
            raise ValueError(f"no image samples in {len(self.shards)} shard(s) (first: {self.shards[0]})")
        labelled = [t for t in targets if t != UNLABELLED]
        if classes:
            classes = list(classes)
        elif labelled:
            classes = [str(i) for i in range(max(labelled) + 1)]
        if labelled and max(labelled) >= len(classes):
            raise ValueError(f"label {max(labelled)} in the shards but only {len(classes)} class names")
        super().__init__(targets, transform, num_classes=len(classes) or None)
        self.classes = list(classes)
        self.keys, self.exts = keys, exts
        self._shard = np.asarray(shard_of, dtype=np.int32)
        self._offset = np.asarray(offsets, dtype=np.int64)
        self._size = np.asarray(sizes, dtype=np.int64)
        self._text = np.asarray(text_at, dtype=np.int64).reshape(-1, 2)
        if with_text and (self._text[:, 0] < 0).any():
            first = int(np.flatnonzero(self._text[:, 0] < 0)[0])
            raise ValueError(f"{int((self._text[:, 0] < 0).sum())} sample(s) have no .{TEXT_KEY} "
                             f"member (first: {self.name(first)}); image-text shards need a "
                             "caption per image")
        self.with_text = with_text
        self.num_missing = len(missing)
        self.decode = decode
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._init_skips(strict)
        self._check_up_front((j, self._problem(j)) for j in range(len(self)))

    # ---- reading ---------------------------------------------------------------------------

    def name(self, index: int) -> str:
        """``shard.tar:key.ext`` of sample ``index`` (for messages)."""
        return f"{self.shards[int(self._shard[index])]}:{self.keys[index]}.{self.exts[index]}"

    item_name = name

    def where(self) -> str:
        return f"in {len(self.shards)} shard(s)"

    def _fd(self, s: int) -> int:
        """An open descriptor of shard ``s`` (per process, at most ``_MAX_OPEN`` at once)."""
        if os.getpid() != self._pid:  # a forked worker: never share the parent's file offsets
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(s)
        if fd is None:
            if len(self._fds) >= _MAX_OPEN:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = self._fds[s] = os.open(self.shards[s], os.O_RDONLY)
        return fd

    def read_bytes(self, index: int) -> bytes:
        """The encoded image of sample ``index``, as stored."""
        size = int(self._size[index])
        data = os.pread(self._fd(int(self._shard[index])), size, int(self._offset[index]))
        if len(data) != size:
            raise CorruptImageError(f"cannot read image {self.name(index)}: the shard ends early "
                                    f"({len(data)} of {size} bytes)")
        return data

    def captions(self, index: int) -> list[str]:
        """The non-empty lines of sample ``index``'s ``.txt`` member (UTF-8)."""
        off, size = (int(v) for v in self._text[index])
        if off < 0:
            raise ValueError(f"sample {self.name(index)} has no .{TEXT_KEY} member")
        data = os.pread(self._fd(int(self._shard[index])), size, off)
        if len(data) != size:
            raise ValueError(f"cannot read the .{TEXT_KEY} member of {self.name(index)}: the "
                             "shard ends early")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"the .{TEXT_KEY} member of {self.name(index)} is not UTF-8 ({e})") \
                from None
        return [line.strip() for line in text.splitlines() if line.strip()]

    def _problem(self, index: int) -> str | None:
        """None when sample ``index`` is readable, else why not (:func:`check_image_bytes`)."""
        try:
            return check_image_bytes(self.read_bytes(index), self.name(index))
        except CorruptImageError as e:
            return str(e)

    def _mode(self) -> str:
        if self.decode != "auto":
            return self.decode
        if getattr(self.transform, "wants_encoded", False):
            return "full"  # decoded on the training device: a reduced scale has no meaning there
        return "reduced" if getattr(self.transform, "accepts_encoded", False) else "pil"

    def load(self, index: int) -> Any:
        """The image of sample ``index``: an RGB PIL image ("pil") or an :class:`EncodedImage`."""
        data = self.read_bytes(index)
        mode = self._mode()
        if mode == "pil":
            return decode_rgb(data, self.name(index))
        return EncodedImage(data, self.name(index), reduced=mode in ("reduced", "fast"),
                            fast=mode == "fast")

    @property
    def skipped_samples(self) -> list[str]:
        """The unreadable samples met so far, named ``shard.tar:key.ext``."""
        return [self.name(i) for i in self.skipped()]

    def _item(self, index: int, image: Any) -> tuple[Any, ...]:
        if self.with_text:  # the text of the sample actually returned
            return image, self.targets[index], self.captions(index)
        return image, self.targets[index]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"] = {}
        return state

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            for fd in getattr(self, "_fds", {}).values():
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __repr__(self) -> str:
        kind = f"{len(self.classes)} classes" if self.classes else "unlabelled"
        return f"ShardDataset({len(self.shards)} shard(s), {len(self)} samples, {kind}, decode={self.decode!r})"
