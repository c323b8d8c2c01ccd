"""The files of ``contrastive-embed``: vector shards, their manifest, a faiss index, and searches.

Layout of an output folder (``--out``)::

    manifest.json              the job: encoder, its sha256, normalisation, dtype, count, shards
    shard-000000.npy           (n, D) float32 or float16 vectors (numpy .npy), rows in corpus order
    shard-000000.ids.json      the n ids of those rows (image paths / shard member names, or the
                               1-based line numbers of sentences), a JSON list
    index.faiss                optional: a faiss index over all rows, in shard order
    duplicates.csv, query.json optional results

Shard ``k`` holds corpus rows ``[k * S, (k + 1) * S)`` for the shard size ``S``: which rows a
shard holds never depends on the number of processes, so a job resumed with another process
count writes the same files. A shard is written atomically (a temporary name, then
``os.replace``): ids first, vectors last, so the vectors file marks a complete shard and an
interrupted job redoes only the shard it was writing.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "MANIFEST",
    "INDEX_FILE",
    "FLAT_BELOW",
    "IVFPQ_MIN",
    "shard_name",
    "shard_rows",
    "complete_shards",
    "write_shard",
    "read_vectors",
    "index_rule",
    "build_index",
    "search",
    "near_duplicates",
    "write_duplicates",
]

MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
#: ``--index auto``: an exact (flat) index below this many vectors, IVF-PQ from it on
FLAT_BELOW = 100_000
IVFPQ_MIN = 39 * 256
_PQ_SUBVECTORS = (64, 48, 32, 24, 16, 12, 8, 4, 2, 1)


def shard_name(k: int) -> str:
    return f"shard-{k:06d}"


def shard_rows(count: int, shard_size: int) -> list[range]:
    """The corpus rows of each shard: ``[k * shard_size, (k + 1) * shard_size)``, the last one short."""
    return [range(s, min(s + shard_size, count)) for s in range(0, count, shard_size)]


def complete_shards(out: Path) -> set[int]:
    """Numbers of the shards whose vectors file (written last) exists."""
    done = set()
    for path in out.glob("shard-*.npy"):
        stem = path.name[len("shard-"):-len(".npy")]
        if stem.isdigit() and (out / f"{shard_name(int(stem))}.ids.json").is_file():
            done.add(int(stem))
    return done


def _replace(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shard(out: Path, k: int, vectors: np.ndarray, ids: Sequence[str]) -> None:
    """Shard ``k``: ids, then vectors (the completion mark), each atomically."""
    if len(vectors) != len(ids):
        raise ValueError(f"shard {k}: {len(vectors)} vectors but {len(ids)} ids")
    _replace(out / f"{shard_name(k)}.ids.json", lambda f: f.write(json.dumps(list(ids)).encode()))
    _replace(out / f"{shard_name(k)}.npy", lambda f: np.save(f, vectors, allow_pickle=False))


def read_vectors(out: Path, manifest: dict[str, Any]) -> tuple[np.ndarray, list[str]]:
    """All vectors (N, D) float32 and their ids, in corpus order, from the manifest's shards."""
    vecs, ids = [], []
    for shard in manifest["shards"]:
        vecs.append(np.load(out / shard["vectors"], allow_pickle=False).astype(np.float32))
        ids += json.loads((out / shard["ids"]).read_text(encoding="utf-8"))
    return np.concatenate(vecs), ids


def index_rule(kind: str, count: int, dim: int) -> dict[str, Any]:
    """The index for ``--index kind`` over ``count`` vectors of ``dim``, with the rule that chose
    it (recorded in the manifest). IVF-PQ: ``nlist = 4 sqrt(N)`` lists (faiss's guideline of
    4-16 sqrt(N), at most N / 39 so k-means sees 39 points per centroid), ``m`` sub-quantisers
    (the largest of 64, 48, 32 ... dividing D into sub-vectors of 8 or more: faiss's k-means is
    slow on fewer dimensions), 8 bits each, ``nprobe = min(nlist, 16)``."""
    rule = f"--index {kind}" + (f": flat below {FLAT_BELOW} vectors, else IVF-PQ" if kind == "auto" else "")
    if kind == "flat" or (kind == "auto" and count < FLAT_BELOW):
        return {"type": "flat", "faiss": "IndexFlatIP", "exact": True, "rule": rule}
    if count < IVFPQ_MIN:
        raise ValueError(f"--index {kind}: IVF-PQ trains 256 centroids per sub-quantiser on 39 points each, "
                         f"so it needs >= {IVFPQ_MIN} vectors (got {count}); use --index flat (exact)")
    nlist = max(1, min(round(4 * math.sqrt(count)), count // 39))
    m = next((m for m in _PQ_SUBVECTORS if dim % m == 0 and dim // m >= 8), 1)
    return {"type": "ivfpq", "faiss": f"IVF{nlist},PQ{m}x8", "exact": False, "rule": rule,
            "nlist": nlist, "m": m, "nbits": 8, "nprobe": min(nlist, 16)}


def _unit(vectors: np.ndarray) -> np.ndarray:
    return F.normalize(torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)), dim=1).numpy()


def build_index(vectors: np.ndarray, spec: dict[str, Any], path: Path) -> None:
    """A faiss inner-product index of the L2-normalised ``vectors`` (cosine), written to ``path``."""
    import faiss
    x = _unit(vectors)
    index: Any
    if spec["type"] == "flat":
        index = faiss.IndexFlatIP(x.shape[1])
    else:
        index = faiss.index_factory(x.shape[1], spec["faiss"], faiss.METRIC_INNER_PRODUCT)
        index.train(x)
    index.add(x)
    faiss.write_index(index, str(path))


def search(out: Path, manifest: dict[str, Any], query: Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` rows most similar (cosine) to ``query`` (D,): through ``index.faiss`` when the
    manifest lists one, else an exact search over the shards. ``[(row, similarity)]``, best first."""
    q = _unit(query.reshape(1, -1).numpy())
    k = min(k, int(manifest["count"]))
    index = manifest.get("index")
    if index:
        import faiss

        found = faiss.read_index(str(out / INDEX_FILE))
        if index["type"] == "ivfpq":
            faiss.extract_index_ivf(found).nprobe = index["nprobe"]
        sims, rows = found.search(q, k)
        return [(int(r), float(s)) for r, s in zip(rows[0], sims[0]) if r >= 0]
    vectors, _ = read_vectors(out, manifest)
    sims_t, rows_t = torch.from_numpy(_unit(vectors) @ q[0]).topk(k)
    return [(int(r), float(s)) for r, s in zip(rows_t, sims_t)]


def near_duplicates(vectors: np.ndarray, threshold: float, block: int = 4096) -> list[tuple[int, int, float]]:
    """Pairs ``(i, j, cosine)`` with ``i < j`` and cosine >= ``threshold``, exact, in row order;
    blocks of ``block`` rows keep the similarity matrix small."""
    x = torch.from_numpy(_unit(vectors))
    pairs: list[tuple[int, int, float]] = []
    for start in range(0, len(x), block):
        sims = x[start:start + block] @ x.T  # (b, N)
        rows, cols = torch.nonzero(sims >= threshold, as_tuple=True)
        for r, c in zip(rows.tolist(), cols.tolist()):
            if start + r < c:
                pairs.append((start + r, c, float(sims[r, c])))
    return sorted(pairs)


def write_duplicates(path: Path, pairs: Sequence[tuple[int, int, float]], ids: Sequence[str]) -> None:
    """The CSV ``id_a,id_b,similarity`` (header line first), one row per pair."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id_a", "id_b", "similarity"])
        for i, j, s in pairs:
            w.writerow([ids[i], ids[j], f"{s:.6f}"])
