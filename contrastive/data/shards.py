"""Tar shards in the WebDataset layout, read as a MAP-STYLE data set through a tar index.

Layout (what ``webdataset`` writes and reads): consecutive tar members sharing a key form one
sample; the key is the member name up to the first dot of its base name, the rest is the
extension: ``000000042.jpg`` + ``000000042.cls`` (class index as decimal text) + optionally
``000000042.txt`` (a caption per line, UTF-8: image-text shards for CLIP). Shards are
plain (uncompressed) tar files: random access reads a member at its byte offset.

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
training from the folder. A ``NAME.json`` index beside the shards lists them with their sample
counts in the ``wids`` shard-list format (``wids.ShardListDataset`` reads it) plus the class
names.

Spec forms (``--data``): ``wds:DIR`` (``DIR/train.json`` and, if present, ``DIR/test.json``),
``wds:DIR/train.json``, ``wds:/data/train-{000000..000146}.tar`` (brace range) or a glob
``wds:/data/train-*.tar`` (training split only).
"""

from __future__ import annotations

import glob
import io
import json
import logging
import os
import re
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contrastive.data.base import UNLABELLED, LabelledDataset
from contrastive.data.decode import EncodedImage
from contrastive.data.io import IMAGE_EXTENSIONS, CorruptImageError, to_rgb

logger = logging.getLogger(__name__)

__all__ = ["ShardDataset", "build_shard_index", "load_shard_index", "expand_shard_spec",
           "resolve_shards", "IMAGE_KEYS", "LABEL_KEY", "TEXT_KEY"]

IMAGE_KEYS: frozenset[str] = frozenset(e.lstrip(".") for e in IMAGE_EXTENSIONS)
"""Member extensions read as the image (lower case): jpg, jpeg, png, webp, ..."""
LABEL_KEY = "cls"
"""The member holding the class index as decimal text (webdataset's convention)."""
TEXT_KEY = "txt"
"""The member holding the captions, one per line (UTF-8; webdataset's ``.txt``)."""
INDEX_FORMAT = "contrastive-shard-index"
INDEX_VERSION = 2  # 2: the txt member's offset and size (an older cached index is rebuilt)
_KEY_RE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
_MAX_OPEN = 64
DECODE_MODES = ("auto", "pil", "full", "reduced", "fast")


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name (webdataset's rule), extension lower case; None
    for a name without an extension."""
    m = _KEY_RE.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


# ---- the index ---------------------------------------------------------------------------------

def _index_path(shard: Path) -> Path:
    return shard.with_name(shard.name + ".idx.json")


def build_shard_index(shard: str | os.PathLike) -> dict[str, Any]:
    """Scan one tar's headers: one entry ``[key, image_ext, offset, size, label, text_offset,
    text_size]`` per sample that has an image member (label -1 without a ``cls`` member, text
    offset and size -1 without a ``txt`` member); samples without an image are
    listed under ``"no_image"``, other members only counted by extension under ``"ignored"``
    (never read). Only the small ``cls`` members are read."""
    shard = Path(shard)
    samples: list[list[Any]] = []
    no_image: list[str] = []
    ignored: dict[str, int] = {}
    order: list[str] = []
    members: dict[str, dict[str, tarfile.TarInfo]] = {}
    try:
        with tarfile.open(shard, mode="r:") as tf:
            for info in tf:
                parts = split_name(info.name) if info.isfile() else None
                if parts is None:
                    if info.isfile():
                        ignored[""] = ignored.get("", 0) + 1
                    continue
                key, ext = parts
                if key not in members:
                    members[key] = {}
                    order.append(key)
                members[key].setdefault(ext, info)
            for key in order:
                group = members[key]
                image = next((e for e in group if e in IMAGE_KEYS), None)
                for e in group:
                    if e not in (image, LABEL_KEY, TEXT_KEY):
                        ignored[e] = ignored.get(e, 0) + 1
                if image is None:
                    no_image.append(key)
                    continue
                label = UNLABELLED
                if LABEL_KEY in group:
                    f = tf.extractfile(group[LABEL_KEY])
                    text = f.read(64).decode("ascii", "replace").strip() if f else ""
                    try:
                        label = int(text)
                    except ValueError:
                        raise ValueError(f"{shard}: member {key}.{LABEL_KEY} holds {text!r}, not a "
                                         "class index (decimal text)") from None
                info = group[image]
                txt = group.get(TEXT_KEY)
                samples.append([key, image, info.offset_data, info.size, label,
                                txt.offset_data if txt else -1, txt.size if txt else -1])
    except tarfile.ReadError as e:
        raise ValueError(f"{shard} is not a readable uncompressed tar file ({e}); shards must be "
                         "plain .tar (random access reads members at their offsets): write them "
                         "with contrastive-make-shards or `tar cf`") from e
    st = shard.stat()
    return {"format": INDEX_FORMAT, "version": INDEX_VERSION, "tar_size": st.st_size,
            "tar_mtime_ns": st.st_mtime_ns, "samples": samples, "no_image": no_image, "ignored": ignored}


def load_shard_index(shard: str | os.PathLike, *, cache: bool = True) -> dict[str, Any]:
    """The index of ``shard``: read from ``NAME.tar.idx.json`` when it matches the tar's size and
    modification time (a copy that does not keep the time costs one header scan), else built
    from the tar headers and (``cache``) written there, if the folder is writable."""
    shard = Path(shard)
    if not shard.is_file():
        raise FileNotFoundError(f"shard not found: {shard}")
    path = _index_path(shard)
    st = shard.stat()
    if path.is_file():
        try:
            idx = json.loads(path.read_text())
            if (idx.get("format"), idx.get("version"), idx.get("tar_size"), idx.get("tar_mtime_ns")) \
                    == (INDEX_FORMAT, INDEX_VERSION, st.st_size, st.st_mtime_ns):
                return idx
            logger.info("index %s is stale (the tar changed): rebuilding it", path)
        except (OSError, ValueError):
            logger.warning("unreadable index %s: rebuilding it", path)
    idx = build_shard_index(shard)
    if cache:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(idx, separators=(",", ":")))
            os.replace(tmp, path)
        except OSError as e:
            logger.info("cannot cache the index of %s beside it (%s); it is rebuilt next time",
                        shard, e)
            tmp.unlink(missing_ok=True)
    return idx


# ---- shard specs -------------------------------------------------------------------------------

_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_shard_spec(pattern: str) -> list[Path]:
    """Shard paths of a pattern: brace ranges ``{000000..000146}`` (zero padding kept, several
    allowed) and shell globs (sorted); a plain path is itself."""
    pattern = os.path.expanduser(pattern)
    names = [pattern]
    while any(_BRACE.search(n) for n in names):
        out = []
        for n in names:
            m = _BRACE.search(n)
            if m is None:
                out.append(n)
                continue
            lo, hi = m.group(1), m.group(2)
            if int(hi) < int(lo):
                raise ValueError(f"shard pattern {pattern!r}: empty range {{{lo}..{hi}}}")
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            out += [n[:m.start()] + str(i).zfill(width) + n[m.end():] for i in range(int(lo), int(hi) + 1)]
        names = out
    paths: list[Path] = []
    for n in names:
        if glob.has_magic(n):
            found = sorted(glob.glob(n))
            if not found:
                raise FileNotFoundError(f"no shard matches {n!r}")
            paths += [Path(f) for f in found]
        else:
            paths.append(Path(n))
    return paths


def _split_index(root: Path, split: str) -> Path | None:
    p = root / f"{split}.json"
    return p if p.is_file() else None


def resolve_shards(spec_root: str, split: str) -> tuple[list[Path], list[str]] | None:
    """(shard paths, class names) of ``split`` for a ``wds:`` root (module docstring); None when
    the root has no such split."""
    root = Path(os.path.expanduser(spec_root))
    if root.is_dir():
        index = _split_index(root, split)
        if index is None:
            if split == "train":
                raise FileNotFoundError(
                    f"no {split}.json shard list in {root}: write shards with contrastive-make-shards "
                    f"or name the shards, e.g. wds:{root}/train-{{000000..000009}}.tar")
            return None
        return _read_shard_list(index)
    if root.suffix == ".json":
        if split != "train":
            sibling = root.with_name(f"{split}.json")
            return _read_shard_list(sibling) if sibling.is_file() and sibling != root else None
        if not root.is_file():
            raise FileNotFoundError(f"shard list not found: {root}")
        return _read_shard_list(root)
    if split != "train":
        return None
    return expand_shard_spec(spec_root), []


def _read_shard_list(path: Path) -> tuple[list[Path], list[str]]:
    try:
        meta = json.loads(path.read_text())
        urls = [entry["url"] for entry in meta["shardlist"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a shard list (JSON with a 'shardlist' of {{'url': ...}} "
                         f"entries): {e}") from e
    base = path.parent
    return [Path(u) if os.path.isabs(u) else base / u for u in urls], list(meta.get("classes") or [])


# ---- the data set ------------------------------------------------------------------------------

class ShardDataset(LabelledDataset):
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

    Unreadable images (strict off): named once, counted in :attr:`num_skipped` (shared by the
    loader workers) and replaced by the next readable sample, as the folder data set does;
    samples without an image member are named and left out when the index is read.
    """

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
        self.strict = strict
        self.decode = decode
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._bad = torch.zeros(len(keys), dtype=torch.uint8).share_memory_()
        if strict:
            self._check_all()

    # ---- reading ---------------------------------------------------------------------------

    def name(self, index: int) -> str:
        """``shard.tar:key.ext`` of sample ``index`` (for messages)."""
        return f"{self.shards[int(self._shard[index])]}:{self.keys[index]}.{self.exts[index]}"

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
            return _pil_rgb(data, self.name(index))
        return EncodedImage(data, self.name(index), reduced=mode in ("reduced", "fast"),
                            fast=mode == "fast")

    def _check_all(self) -> None:
        t0 = time.perf_counter()
        for j in range(len(self)):
            problem = _check_bytes(self.read_bytes(j), self.name(j))
            if problem is not None:
                raise CorruptImageError(
                    f"{problem} (sample {j + 1} of {len(self)}; strict mode (--strict-data) checks every "
                    "sample before training: fix the shard, or leave strict mode off to skip it)")
        logger.info("strict mode: checked all %d samples of %d shard(s) in %.1f s, all readable",
                    len(self), len(self.shards), time.perf_counter() - t0)

    def _mark_bad(self, j: int, err: BaseException) -> None:
        if not self._bad[j]:
            self._bad[j] = 1
            logger.warning("skipping unreadable image %s (%s; %d skipped so far; strict=True makes "
                           "this an error)", self.name(j), err, self.num_skipped)

    @property
    def num_skipped(self) -> int:
        """Distinct unreadable samples met so far (all loader workers together)."""
        return int(self._bad.sum())

    @property
    def skipped_samples(self) -> list[str]:
        return [self.name(i) for i in self._bad.nonzero().flatten().tolist()]

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a data set of {n} items")
        index %= n
        for step in range(n):
            j = (index + step) % n
            if self._bad[j]:
                continue
            # an encoded image fails inside the transform: restore the generator so that the
            # replacement sample draws what it would have drawn had the bad one been skipped first
            state = torch.get_rng_state() if self.transform is not None else None
            try:
                img = self.load(j)
                if self.transform is not None:
                    img = self.transform(img)
            except CorruptImageError as e:
                if self.strict:
                    raise
                self._mark_bad(j, e)
                if state is not None:
                    torch.set_rng_state(state)
                continue
            if self.with_text:  # the text of the sample actually returned
                return img, self.targets[j], self.captions(j)
            return img, self.targets[j]
        raise CorruptImageError(f"no readable image in {len(self.shards)} shard(s) ({n} samples, all unreadable)")

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


def _pil_rgb(data: bytes, name: str):
    """Bytes -> RGB PIL image with the EXIF orientation applied (what load_rgb does for files)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if im.getexif().get(0x0112, 1) != 1:
                im = ImageOps.exif_transpose(im)
            return to_rgb(im)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise CorruptImageError(f"cannot read image {name}: {type(e).__name__}: {e}") from e


def _check_bytes(data: bytes, name: str) -> str | None:
    """None when ``data`` decodes (check_image's rule for bytes: header + verify, JPEG end
    marker, a full decode only for suspects), else the reason naming ``name``."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            im.verify()
        suspect = fmt == "JPEG" and not data.rstrip(b"\x00").endswith(b"\xff\xd9")
    except Exception:  # any parse failure only makes it a suspect; the full decode decides
        suspect = True
    if not suspect:
        return None
    try:
        _pil_rgb(data, name)
    except CorruptImageError as e:
        return str(e)
    return None
