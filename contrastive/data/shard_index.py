"""Tar shards in the WebDataset layout: the format, the byte-offset index and the shard specs.

Layout (what ``webdataset`` writes and reads): consecutive tar members sharing a key form one
sample; the key is the member name up to the first dot of its base name, the rest is the
extension: ``000000042.jpg`` + ``000000042.cls`` (class index as decimal text) + optionally
``000000042.txt`` (a caption per line, UTF-8: image-text shards for CLIP). Shards are
plain (uncompressed) tar files: random access reads a member at its byte offset.

The index (:func:`build_shard_index`, cached beside each shard as ``NAME.tar.idx.json`` by
:func:`load_shard_index`) lists each sample's image member by byte offset and size, its label
and its caption member, from the tar headers with the standard ``tarfile`` module; only the
small ``cls`` members are read. The data set that reads samples through it is
:class:`contrastive.data.shards.ShardDataset` (why a map-style data set: there).

A ``NAME.json`` shard list beside the shards lists them with their sample counts in the
``wids`` shard-list format (``wids.ShardListDataset`` reads it) plus the class names. Spec
forms (``--data``): ``wds:DIR`` (``DIR/train.json`` and, if present, ``DIR/test.json``),
``wds:DIR/train.json``, ``wds:/data/train-{000000..000146}.tar`` (brace range) or a glob
``wds:/data/train-*.tar`` (training split only); :func:`resolve_shards` resolves them.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import tarfile
from pathlib import Path
from typing import Any

from contrastive.data.base import UNLABELLED
from contrastive.data.io import IMAGE_EXTENSIONS

logger = logging.getLogger(__name__)

__all__ = ["build_shard_index", "load_shard_index", "expand_shard_spec", "resolve_shards",
           "split_name", "IMAGE_KEYS", "LABEL_KEY", "TEXT_KEY"]

IMAGE_KEYS: frozenset[str] = frozenset(e.lstrip(".") for e in IMAGE_EXTENSIONS)
"""Member extensions read as the image (lower case): jpg, jpeg, png, webp, ..."""
LABEL_KEY = "cls"
"""The member holding the class index as decimal text (webdataset's convention)."""
TEXT_KEY = "txt"
"""The member holding the captions, one per line (UTF-8; webdataset's ``.txt``)."""
INDEX_FORMAT = "contrastive-shard-index"
INDEX_VERSION = 2  # 2: the txt member's offset and size (an older cached index is rebuilt)
_KEY_RE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


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
