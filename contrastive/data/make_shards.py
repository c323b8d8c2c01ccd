"""``contrastive-make-shards``: write any ``--data`` spec as tar shards (WebDataset layout).

    contrastive-make-shards --data /data/imagenet --out /data/imagenet-wds --max-size 1G
    accelerate launch recipes/moco_r50.py --data wds:/data/imagenet-wds

Files keep their original bytes (no re-encoding) and order; decoded data (CIFAR arrays,
generated shapes) is stored as lossless PNG. Every split the spec has (train, and test when
present) is written; see :func:`write_shards`. Reading: :mod:`contrastive.data.shards`.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contrastive.data.base import UNLABELLED
from contrastive.data.io import to_rgb
from contrastive.data.shard_index import IMAGE_KEYS, LABEL_KEY, load_shard_index
from contrastive.data.shards import ShardDataset
from contrastive.data.spec import SPEC_HELP, get_dataset, has_split

logger = logging.getLogger(__name__)


def _encoded_items(dataset: Any) -> Iterator[tuple[bytes, str, int]]:
    """``(encoded bytes, extension, label)`` per item of a data set, in index order: a file's
    or a shard's bytes as they are, anything else (arrays, tensors, PIL images) as lossless PNG."""
    base, indices = dataset, None
    if hasattr(base, "indices") and hasattr(base, "dataset"):  # a SubsetDataset (fraction=)
        base, indices = base.dataset, base.indices
    n = len(indices) if indices is not None else len(base)
    targets = getattr(dataset, "targets", None)
    saved = getattr(base, "transform", None)
    try:
        if hasattr(base, "transform"):
            base.transform = None
        for i in range(n):
            j = indices[i] if indices is not None else i
            label = int(targets[i]) if targets is not None else UNLABELLED
            if hasattr(base, "paths"):
                path = Path(base.paths[j])
                yield path.read_bytes(), path.suffix.lower().lstrip("."), label
            elif isinstance(base, ShardDataset):
                yield base.read_bytes(j), base.exts[j], label
            else:
                img = base.load(j) if hasattr(base, "load") else base[j][0]
                yield _png(img), "png", label
    finally:
        if hasattr(base, "transform"):
            base.transform = saved


def _png(img: Any) -> bytes:
    from PIL import Image

    if isinstance(img, torch.Tensor):
        arr = img.detach().cpu()
        if arr.ndim == 3 and arr.shape[0] in (1, 3):
            arr = arr.permute(1, 2, 0)
        img = Image.fromarray(arr.squeeze(-1).numpy() if arr.shape[-1] == 1 else arr.numpy())
    elif isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    if not isinstance(img, Image.Image):
        raise TypeError(f"cannot encode a {type(img).__name__} as an image")
    buf = io.BytesIO()
    to_rgb(img).save(buf, format="PNG")
    return buf.getvalue()


def _member(name: str, data: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o444, 0
    info.uname = info.gname = ""
    return info, io.BytesIO(data)


def _tar_size(members: int) -> int:
    """File size of a tar whose members take ``members`` bytes: two zero end blocks, then
    ``tarfile`` pads the file to a multiple of its 10240-byte record."""
    return -(-(members + 1024) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def write_shards(dataset: Any, out_dir: str | os.PathLike, split: str = "train", *,
                 max_count: int = 10000, max_bytes: int = 1 << 30,
                 classes: Sequence[str] | None = None) -> dict[str, Any]:
    """Write ``dataset`` as tar shards ``out_dir/SPLIT-000000.tar ...`` plus ``SPLIT.json``.

    Sample i (key ``%09d`` of i) holds the i-th image, its original encoded bytes for files
    (folders, shards) and lossless PNG for decoded data (CIFAR arrays, generated shapes), and
    ``cls`` (the label) when labelled. A shard is closed before it would exceed ``max_count``
    samples or ``max_bytes`` bytes on disk (a single larger sample gets a shard of its own). Each tar is
    written under a temporary name and renamed when complete, then indexed
    (``NAME.tar.idx.json``). Bytes are copied without decoding: an unreadable source image is
    carried over, and skipped (named and counted) when the shards are read, as it would be in
    the folder. Returns the shard list (the content of ``SPLIT.json``).
    """
    if max_count < 1 or max_bytes < 1:
        raise ValueError(f"max_count and max_bytes must be positive; got {max_count}, {max_bytes}")
    if not re.fullmatch(r"[A-Za-z0-9_]+", split):
        raise ValueError(f"split name {split!r}: letters, digits and '_' only")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    classes = list(classes if classes is not None else getattr(dataset, "classes", None) or [])
    shardlist: list[dict[str, Any]] = []
    tf: tarfile.TarFile | None = None
    count = size = 0
    t0 = time.perf_counter()

    def close() -> None:
        nonlocal tf
        if tf is None:
            return
        tf.close()
        final = out / f"{split}-{len(shardlist):06d}.tar"
        os.replace(tmp, final)
        load_shard_index(final)  # write the index now (checks the tar too)
        shardlist.append({"url": final.name, "nsamples": count})
        tf = None

    for i, (data, ext, label) in enumerate(_encoded_items(dataset)):
        if ext not in IMAGE_KEYS:
            raise ValueError(f"item {i} has extension {ext!r}, not an image extension")
        # tar bytes of this sample: a 512-byte header per member, data padded to 512 bytes
        entry = 512 + -(-len(data) // 512) * 512 + (1024 if label != UNLABELLED else 0)
        if tf is not None and (count >= max_count or _tar_size(size + entry) > max_bytes):
            close()
        if tf is None:
            tmp = out / f".{split}-{len(shardlist):06d}.tar.tmp"
            tf = tarfile.open(tmp, mode="w", format=tarfile.USTAR_FORMAT)
            count = size = 0
        key = f"{i:09d}"
        tf.addfile(*_member(f"{key}.{ext}", data))
        if label != UNLABELLED:
            tf.addfile(*_member(f"{key}.{LABEL_KEY}", str(int(label)).encode()))
        count += 1
        size += entry
    close()
    if not shardlist:
        raise ValueError("the data set is empty: no shard written")
    meta = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": split,
            "format": "contrastive-shards", "version": 1, "classes": classes,
            "num_samples": sum(s["nsamples"] for s in shardlist), "shardlist": shardlist}
    (out / f"{split}.json").write_text(json.dumps(meta, indent=1))
    logger.info("wrote %d samples in %d shard(s) to %s in %.1f s", meta["num_samples"],
                len(shardlist), out, time.perf_counter() - t0)
    return meta


# ---- the command ---------------------------------------------------------------------------------

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'1G', '500M', '64K' or a number of bytes -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), flags=re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected bytes or a number with K, M, G, T")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="contrastive-make-shards", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help=SPEC_HELP)
    p.add_argument("--out", required=True, help="output folder (train-000000.tar ..., train.json)")
    p.add_argument("--splits", nargs="+", default=["train", "test"],
                   help="splits to write, where the spec has them (default: train test)")
    p.add_argument("--max-count", type=int, default=10000, help="samples per shard at most")
    p.add_argument("--max-size", type=parse_size, default=parse_size("1G"),
                   help="bytes per shard at most, e.g. 500M, 1G (default 1G)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    written = 0
    for split in args.splits:
        if not has_split(args.data, split):
            if split == "train":
                logger.error("--data %s has no train split", args.data)
                return 2
            logger.info("%s: not in --data %s, skipped", split, args.data)
            continue
        ds = get_dataset(args.data, split)
        meta = write_shards(ds, args.out, split, max_count=args.max_count, max_bytes=args.max_size)
        logger.info("%s: %d samples in %d shard(s) -> %s/%s.json", split, meta["num_samples"],
                    len(meta["shardlist"]), args.out, split)
        written += 1
    logger.info("train with: --data wds:%s", args.out)
    return 0 if written else 2


if __name__ == "__main__":
    sys.exit(main())
