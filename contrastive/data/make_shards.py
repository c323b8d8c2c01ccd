"""``contrastive-make-shards``: write any ``--data`` spec as tar shards (WebDataset layout).

    contrastive-make-shards --data /data/imagenet --out /data/imagenet-wds --max-size 1G
    accelerate launch recipes/moco_r50.py --data wds:/data/imagenet-wds

Files keep their original bytes (no re-encoding) and order; decoded data (CIFAR arrays,
generated shapes) is stored as lossless PNG. Every split the spec has (train, and test when
present) is written; see :func:`contrastive.data.shards.write_shards`.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys

from contrastive.data.shards import write_shards
from contrastive.data.spec import SPEC_HELP, get_dataset, has_split

logger = logging.getLogger("contrastive.make_shards")
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
