"""``contrastive-embed``: embed a corpus of images or sentences into vector shards, then search it.

    contrastive-embed --checkpoint runs/moco --data /photos --out emb/ --index auto
    contrastive-embed --out emb/ --query cat.jpg --top-k 5
    contrastive-embed --out emb/ --duplicates 0.95
    contrastive-embed --checkpoint hf:all-MiniLM-L6-v2 --data sentences.txt --out emb/

Images go through the evaluation centre crop (:func:`contrastive.eval.runner.eval_transform`)
normalised as the weights record it (``encoder.pt``, an ``--init`` source's published
statistics), sentences through the text model's own pooling
(:func:`contrastive.eval.sts.load_sentence_model`). Files: :mod:`contrastive.eval.embed_store`.
Under ``accelerate launch`` process ``r`` of ``W`` writes the shards ``k`` with ``k % W == r``;
process 0 then lists them all in the manifest (and builds the index).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from contrastive.eval.embed_store import (
    INDEX_FILE,
    MANIFEST,
    build_index,
    complete_shards,
    index_rule,
    near_duplicates,
    read_vectors,
    search,
    shard_name,
    shard_rows,
    write_duplicates,
    write_shard,
)
from contrastive.records import MODEL_DIR, SENTENCE_CONFIG

__all__ = ["main", "Corpus", "is_text_model", "TEXT_SUFFIXES", "BadInput", "image_encoder", "image_dataset",
           "load_manifest", "query_corpus"]

log = logging.getLogger("contrastive.eval.embed")

TEXT_SUFFIXES = (".txt", ".tsv")
_DTYPES = {"float32": np.float32, "float16": np.float16}
# settings that must match for a job to resume in a folder (the rest may change between runs)
# (the batch size too: a kernel may sum in another order for another batch size)
_RESUME_KEYS = ("modality", "encoder", "data", "count", "dtype", "normalize", "shard_size", "batch_size")


class BadInput(ValueError):
    """The user's input cannot be used; one line: the problem and the fix."""


@dataclass
class Corpus:
    """What to embed and how: ``encode(rows)`` -> (n, D) float32 on the CPU for corpus rows."""

    modality: str  # "image" or "text"
    ids: list[str]
    encode: Callable[[Sequence[int]], Tensor]
    encode_query: Callable[[str], Tensor]  # an image path or a sentence -> (D,)
    encoder: dict[str, Any]  # provenance: spec, sha256, normalisation or pooling


def is_text_model(spec: str) -> bool:
    """Whether ``spec`` names a text model: ``hf:FOLDER``, a Hugging Face or sentence-transformers
    folder, or a text run folder (``model/`` with ``simcse.json``)."""
    if spec.startswith("hf:"):
        return True
    p = Path(spec).expanduser()
    if (p / "modules.json").is_file() or (p / SENTENCE_CONFIG).is_file() or (p / MODEL_DIR / "config.json").is_file():
        return True
    try:
        return "model_type" in json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def _text_folder(spec: str) -> Path:
    p = Path(spec[len("hf:"):] if spec.startswith("hf:") else spec).expanduser()
    return p / MODEL_DIR if (p / MODEL_DIR / "config.json").is_file() else p


def _read_sentences(path: Path, column: str | None) -> tuple[list[str], list[str]]:
    """(sentences, ids): the non-empty lines of a text file (ids: 1-based line numbers), or one
    column of a TSV with a header line (``column``: its name; default ``sentence``, else the first)."""
    if not path.is_file():
        raise BadInput(f"--data {path}: no such file (a text corpus is a .txt or .tsv file)")
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix != ".tsv":
        rows = [(str(n), line) for n, line in enumerate(lines, 1) if line.strip()]
    else:
        header = lines[0].split("\t") if lines else []
        name = column or ("sentence" if "sentence" in header else header[0] if header else "")
        if name not in header:
            raise BadInput(f"--data {path}: no column {name!r} in its header {header}; pass --column")
        c = header.index(name)
        rows = [(str(n), f[c]) for n, line in enumerate(lines[1:], 2)
                if len(f := line.split("\t")) > c and f[c].strip()]
    if not rows:
        raise BadInput(f"--data {path}: no sentence in it")
    return [t for _, t in rows], [i for i, _ in rows]


def _text_corpus(args: argparse.Namespace, device: torch.device) -> Corpus:
    from contrastive.eval.sts import embed_texts, load_sentence_model

    texts, ids = (_read_sentences(Path(args.data), args.column) if args.data else ([], []))
    model = load_sentence_model(_text_folder(args.checkpoint), pooling=args.pooling, max_length=args.max_length,
                                device=device)
    model.encoder.eval()

    def embed(sentences: Sequence[str]) -> Tensor:
        return embed_texts(model.embed, model.tokenizer, sentences, args.batch_size, device)

    from contrastive.eval.checkpoint import file_sha256

    weights = next((model.model_dir / f for f in ("model.safetensors", "pytorch_model.bin")
                    if (model.model_dir / f).is_file()), None)
    return Corpus("text", ids, lambda rows: embed([texts[i] for i in rows]), lambda s: embed([s])[0], {
        "checkpoint": args.checkpoint, "sha256": file_sha256(weights) if weights else None,
        "pooling": model.pooling, "pooling_from": model.pooling_from})


def _image_corpus(args: argparse.Namespace, device: torch.device) -> Corpus:
    from torch.utils.data import Subset

    from contrastive.data.io import load_rgb
    from contrastive.eval.features import unwrap_views
    from contrastive.eval.runner import encode_split, eval_transform

    encoder, size, mean, std, provenance = image_encoder(args)
    encoder.to(device).eval()
    transform = eval_transform(size, mean, std)
    ds: Any = image_dataset(args.data, args.split, transform) if args.data else None
    ids = [_item_id(ds, i) for i in range(len(ds))] if ds is not None else []

    def encode(rows: Sequence[int]) -> Tensor:
        feats, _ = encode_split(encoder, Subset(ds, list(rows)), batch_size=args.batch_size,
                                num_workers=args.num_workers, device=str(device), progress=False)
        # the data set replaces an unreadable image by the next readable one (training's policy,
        # data.base.SkipUnreadable): here its id would get another image's vector, so refuse
        # before the shard is written (the complete shards stay; a rerun continues)
        bad = sorted(set(getattr(ds, "skipped", list)()) & set(rows))
        if bad:
            raise BadInput(f"--data {args.data}: {len(bad)} unreadable image(s), the first "
                           f"{_item_id(ds, bad[0])}: replace or remove them and run again (the "
                           "shards written so far are kept)")
        return feats

    @torch.no_grad()
    def encode_query(path: str) -> Tensor:
        if not Path(path).is_file():
            raise BadInput(f"--query {path}: no such image file (a text query needs a text model)")
        return encoder(unwrap_views(transform(load_rgb(path))).unsqueeze(0).to(device))[0].float().cpu()

    return Corpus("image", ids, encode, encode_query,
                  {**provenance, "image_size": size, "mean": list(mean), "std": list(std)})


def image_encoder(args: argparse.Namespace) -> tuple[torch.nn.Module, int, Sequence[float], Sequence[float],
                                                     dict[str, Any]]:
    """The backbone, crop size, normalisation and provenance of ``args.checkpoint`` or
    ``args.init`` (with ``encoder``, ``image_size``, ``mean``, ``std``): the image source every
    command that takes ``--checkpoint`` / ``--init`` reads (``contrastive-embed``,
    ``contrastive-plot attention``)."""
    if args.init:
        from contrastive.eval.init import choose_normalisation, load_into, resolve_init
        from contrastive.nn.encoders import create_encoder

        init = resolve_init(args.init)
        name = args.encoder or init.encoder
        if not name:
            raise BadInput(f"--init {args.init} does not name its architecture; pass --encoder NAME")
        encoder = create_encoder(name)
        load_into(encoder, init)
        size = args.image_size
        mean, std, norm_from = choose_normalisation(args.mean, args.std, recorded=(init.mean, init.std),
                                                    recorded_from=init.norm_from or "")
        provenance = {"checkpoint": args.init, "encoder": name, "sha256": init.sha256}
    else:
        from contrastive.eval.checkpoint import load_encoder

        loaded = load_encoder(args.checkpoint, encoder=args.encoder)
        encoder, size = loaded.encoder, args.image_size or loaded.image_size
        mean, std, norm_from = loaded.normalisation(args.mean, args.std)
        provenance = {"checkpoint": args.checkpoint, "encoder": loaded.name, "sha256": loaded.sha256}
    return encoder, size or 224, mean, std, {**provenance, "norm_from": norm_from}


def image_dataset(data: str, split: str, transform: Any) -> Any:
    """A split of ``data`` (folder, spec, shards) through ``transform``; a missing path is a
    one-line :class:`BadInput`."""
    from contrastive.data.spec import UnknownDatasetError
    from contrastive.eval.runner import load_split

    try:
        return load_split(data, split, transform)
    except UnknownDatasetError:
        if not Path(data).expanduser().exists():
            raise BadInput(f"--data {data}: no such folder or file (give an image folder, a data spec such "
                           "as wds:/shards, or a .txt / .tsv file of sentences)") from None
        raise


def _item_id(ds: Any, i: int) -> str:
    for name in ("item_name", "name"):
        fn = getattr(ds, name, None)
        if callable(fn):
            return str(fn(i))
    return str(i)


def _corpus(args: argparse.Namespace, device: torch.device) -> Corpus:
    text_model = not args.init and is_text_model(args.checkpoint)
    text_data = args.data is not None and Path(args.data).suffix in TEXT_SUFFIXES
    if args.data and text_data != text_model:
        what = "a text model" if text_model else "an image encoder"
        fix = "give a .txt / .tsv file of sentences" if text_model else "give images (a folder, shards)"
        source = f"--checkpoint {args.checkpoint}" if args.checkpoint else f"--init {args.init}"
        raise BadInput(f"{source} is {what}, but --data {args.data} is "
                       f"{'text' if text_data else 'images'}: {fix}, or another --checkpoint")
    return _text_corpus(args, device) if text_model else _image_corpus(args, device)


def _rebuild_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that rebuild the encoder and its input pipeline (for a later ``--query``)."""
    flags = {k: getattr(args, k) for k in ("checkpoint", "init", "encoder", "image_size", "mean", "std",
                                           "pooling", "max_length")}
    for key in ("checkpoint", "init"):  # a local path made absolute: --query may run elsewhere
        spec = flags[key]
        local = spec[len("hf:"):] if spec and spec.startswith("hf:") else spec
        if local and Path(local).expanduser().exists():
            flags[key] = ("hf:" if local != spec else "") + str(Path(local).expanduser().resolve())
    return flags


def _check_resume(out: Path, settings: dict[str, Any]) -> None:
    for stale in out.glob(".shard-*.tmp*"):  # a killed job's half-written file (no process writes yet)
        stale.unlink()
    path = out / MANIFEST
    if not path.is_file():
        if complete_shards(out):
            raise BadInput(f"--out {out} holds shards but no {MANIFEST}: use an empty folder")
        return
    old = json.loads(path.read_text(encoding="utf-8"))
    differ = [k for k in _RESUME_KEYS if old.get(k) != settings.get(k)]
    if differ:
        raise BadInput(f"--out {out} holds embeddings of another job (it differs in {', '.join(differ)}): "
                       "give a new --out, or delete that folder to start again")
    done = len(complete_shards(out))
    if done:
        log.info("resuming: %d of %d shards in %s are complete", done, len(shard_rows(settings["count"],
                                                                                   settings["shard_size"])), out)


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / MANIFEST)


def _embed(args: argparse.Namespace, corpus: Corpus, out: Path, rank: int, world: int) -> bool:
    """Write this process's missing shards (at most ``--max-shards``); whether all of its are done."""
    plan = shard_rows(len(corpus.ids), args.shard_size)
    mine = [k for k in range(len(plan)) if k % world == rank]
    todo = [k for k in mine if k not in complete_shards(out)]
    if args.max_shards is not None:
        todo, stopped = todo[:args.max_shards], len(todo) > args.max_shards
    else:
        stopped = False
    bar = None
    if args.progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(len(plan[k]) for k in mine), desc="embed", unit=corpus.modality,
                   initial=sum(len(plan[k]) for k in mine if k not in todo))
    for k in todo:
        vectors = corpus.encode(plan[k])  # (n, D) float32
        if args.normalize:
            vectors = F.normalize(vectors, dim=1)
        write_shard(out, k, vectors.numpy().astype(_DTYPES[args.dtype]), [corpus.ids[i] for i in plan[k]])
        if bar is not None:
            bar.update(len(plan[k]))
    if bar is not None:
        bar.close()
    if stopped:
        log.info("process %d: stopped after %d new shards (--max-shards); run again to continue", rank, len(todo))
    return not stopped


def _finish(args: argparse.Namespace, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """List the shards in the manifest, build the index, mark the job complete."""
    plan = shard_rows(manifest["count"], manifest["shard_size"])
    missing = sorted(set(range(len(plan))) - complete_shards(out))
    if missing:
        raise RuntimeError(f"shards {missing[:5]} are missing in {out}; run the same command again")
    shards: list[dict[str, Any]] = [{"vectors": f"{shard_name(k)}.npy", "ids": f"{shard_name(k)}.ids.json", "rows": [r.start, r.stop]}
              for k, r in enumerate(plan)]
    manifest.update(shards=shards, complete=True)
    manifest["dim"] = int(np.load(out / shards[0]["vectors"], mmap_mode="r").shape[1])
    if args.index != "none":
        vectors, _ = read_vectors(out, manifest)
        spec = index_rule(args.index, len(vectors), vectors.shape[1])
        build_index(vectors, spec, out / INDEX_FILE)
        manifest["index"] = {**spec, "file": INDEX_FILE, "metric": "cosine (inner product of L2-normalised vectors)"}
    _write_manifest(out, manifest)
    return manifest


def load_manifest(out: Path) -> dict[str, Any]:
    """An embed folder's ``manifest.json`` (a missing or unfinished folder is a :class:`BadInput`)."""
    path = out / MANIFEST
    if not path.is_file():
        raise BadInput(f"--out {out}: no {MANIFEST}; embed a corpus there first (--data, --checkpoint)")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if not manifest.get("complete"):
        raise BadInput(f"--out {out}: the embedding job there is not finished; run it again to complete it")
    return manifest


def _query(args: argparse.Namespace, corpus: Corpus, out: Path, manifest: dict[str, Any]) -> None:
    ids = read_vectors(out, manifest)[1]
    found = search(out, manifest, corpus.encode_query(args.query), args.top_k)
    result = {"query": args.query, "top_k": args.top_k, "index": (manifest.get("index") or {}).get("type", "exact"),
              "neighbours": [{"rank": n, "id": ids[r], "row": r, "similarity": round(s, 6)}
                             for n, (r, s) in enumerate(found, 1)]}
    target = Path(args.output) if args.output else out / "query.json"
    target.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for hit in result["neighbours"]:
        sys.stdout.write(f"{hit['rank']:>3}  {hit['similarity']:.4f}  {hit['id']}\n")
    log.info("wrote %s", target)


def _duplicates(args: argparse.Namespace, out: Path, manifest: dict[str, Any]) -> None:
    vectors, ids = read_vectors(out, manifest)
    pairs = near_duplicates(vectors, args.duplicates)
    target = Path(args.output) if args.output else out / "duplicates.csv"
    write_duplicates(target, pairs, ids)
    sys.stdout.write(json.dumps({"pairs": len(pairs), "threshold": args.duplicates, "csv": str(target)}) + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="contrastive-embed",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Embed images or sentences with a trained encoder into vector shards, then search "
        "them (--query) or list near-duplicates (--duplicates).\n\n"
        "Output (--out): shard-NNNNNN.npy, an (n, D) float32/float16 array (numpy .npy, read with "
        "numpy.load), beside shard-NNNNNN.ids.json, the n ids (image paths or shard member names; "
        "for sentences their 1-based line numbers); manifest.json names the encoder, its sha256, "
        "the normalisation or pooling, dtype, count and the shards in corpus order; index.faiss "
        "with --index.\n"
        "Large corpora: a shard is written atomically every --shard-size items; run an interrupted "
        "command again to continue from the last complete shard (same files, byte for byte, at the "
        "same --batch-size, thread count and CPU kind). Several processes: `accelerate launch -m "
        "contrastive.eval.embed ...` (or --multi_gpu ... $(which contrastive-embed)); each writes its "
        "own shards.\n\n"
        "examples:\n"
        "  contrastive-embed --checkpoint runs/moco --data /photos --out emb --index auto\n"
        "  contrastive-embed --out emb --query cat.jpg --top-k 5\n"
        "  contrastive-embed --out emb --duplicates 0.95\n"
        "  contrastive-embed --checkpoint hf:models/all-MiniLM-L6-v2 --data sentences.txt --out emb",
    )
    src = p.add_argument_group("encoder")
    src.add_argument("--checkpoint", default=None,
                     help="images: encoder.pt, a run folder, a checkpoint folder, 'timm:<model>' / "
                     "'torchvision:<model>'; text: 'hf:FOLDER' (a Hugging Face or sentence-transformers "
                     "folder) or a text run folder (model/ with simcse.json). Default with --query / "
                     "--duplicates: the one recorded in --out's manifest")
    src.add_argument("--init", default=None,
                     help="instead of --checkpoint: an --init source as for training (timm:NAME, "
                     "torchvision:NAME, a weights file) loaded into --encoder, with its published normalisation")
    src.add_argument("--encoder", default=None, help="create_encoder name when the weights do not record it")
    src.add_argument("--image-size", type=int, default=None,
                     help="centre-crop size (default: the recorded pretraining size, else 224)")
    src.add_argument("--mean", type=float, nargs=3, default=None,
                     help="normalisation mean (default: recorded with the weights, else ImageNet's)")
    src.add_argument("--std", type=float, nargs=3, default=None, help="normalisation std (as --mean)")
    src.add_argument("--pooling", default=None, choices=("auto", "pooler", "cls", "mean", "max"),
                     help="text: sentence embedding (default: the folder's simcse.json, else a "
                     "sentence-transformers folder's own pooling, else auto)")
    src.add_argument("--max-length", type=int, default=None, help="text: tokens per sentence (default 128)")
    data = p.add_argument_group("corpus")
    data.add_argument("--data", default=None,
                      help="images: a data spec as for training (a folder, imagefolder:/path, "
                      "wds:/shards, cifar10:/path ...); text: a .txt file (one sentence per line) "
                      "or a .tsv file with a header line (see --column)")
    data.add_argument("--split", default="train", help="split of an image data spec (default train)")
    data.add_argument("--column", default=None, help="TSV column to embed (default: 'sentence', else the first)")
    data.add_argument("--out", required=True, help="output folder (resumed when it holds this job: the same flags, --batch-size included)")
    data.add_argument("--dtype", choices=tuple(_DTYPES), default="float32", help="stored vectors (default float32)")
    data.add_argument("--no-normalize", dest="normalize", action="store_false",
                      help="store the raw features (default: L2-normalised; search is cosine either way)")
    data.add_argument("--shard-size", type=int, default=10_000, help="items per shard (default 10000)")
    data.add_argument("--max-shards", type=int, default=None,
                      help="write at most N new shards per process, then stop (a time-boxed job; run again to continue)")
    data.add_argument("--index", choices=("none", "auto", "flat", "ivfpq"), default="none",
                      help="faiss index over the vectors: flat (exact), ivfpq (approximate), auto "
                      "(flat below 100000 vectors, else IVF-PQ with 4 sqrt(N) lists); the rule and its "
                      "parameters go into the manifest")
    run = p.add_argument_group("running")
    run.add_argument("--batch-size", type=int, default=256)
    run.add_argument("--num-workers", type=int, default=2, help="image loader workers")
    run.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present")
    run.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    use = p.add_argument_group("search (after embedding, or on an existing --out)")
    use.add_argument("--query", default=None, help="an image file (image corpus) or a sentence (text corpus)")
    use.add_argument("--top-k", type=int, default=10, help="neighbours of --query (default 10)")
    use.add_argument("--duplicates", type=float, default=None, metavar="THRESHOLD",
                     help="write the pairs with cosine similarity >= THRESHOLD as a CSV id_a,id_b,similarity")
    use.add_argument("--output", default=None,
                     help="where --query's JSON / --duplicates' CSV go (default: --out/query.json, "
                     "--out/duplicates.csv)")
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.data is None and args.query is None and args.duplicates is None:
        p.error("nothing to do: give --data (embed), --query or --duplicates")
    if args.data is not None and not (args.checkpoint or args.init):
        p.error("--data needs an encoder: --checkpoint or --init")
    if args.checkpoint and args.init:
        p.error("give --checkpoint or --init, not both")
    if (args.mean is None) != (args.std is None):
        p.error("give both --mean and --std (or neither)")
    if args.query is not None and args.duplicates is not None:
        p.error("give --query or --duplicates, not both (they share --output)")
    for flag in ("shard_size", "top_k", "batch_size"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.duplicates is not None and not -1.0 <= args.duplicates <= 1.0:
        p.error(f"--duplicates {args.duplicates}: a cosine similarity threshold in [-1, 1]")


def main(argv: Sequence[str] | None = None) -> int:
    """``contrastive-embed`` (see the module docstring and ``--help``)."""
    p = _parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    from contrastive.nn.text_encoders import UnsafeCheckpointError

    try:
        return _main(args)
    except (BadInput, FileNotFoundError, UnsafeCheckpointError, ValueError) as e:
        p.exit(2, f"{p.prog}: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")


def _main(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    out = Path(args.out).expanduser()
    state = PartialState(cpu=args.cpu)
    corpus = None
    if args.data is not None:
        corpus = _corpus(args, state.device)
        if args.index != "none":
            index_rule(args.index, len(corpus.ids), 1)  # refuse an impossible index before embedding
        manifest = {"modality": corpus.modality, "encoder": corpus.encoder, "data": args.data,
                    "split": args.split if corpus.modality == "image" else None, "count": len(corpus.ids),
                    "dtype": args.dtype, "normalize": "L2" if args.normalize else None,
                    "shard_size": args.shard_size, "batch_size": args.batch_size, "rebuild": _rebuild_flags(args), "complete": False}
        if state.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            _check_resume(out, manifest)
            _write_manifest(out, manifest)
        state.wait_for_everyone()
        done = _embed(args, corpus, out, state.process_index, state.num_processes)
        state.wait_for_everyone()
        if not state.is_main_process:
            return 0
        if not done or len(complete_shards(out)) < len(shard_rows(manifest["count"], args.shard_size)):
            return 0
        manifest = _finish(args, out, manifest)
        sys.stdout.write(json.dumps({"out": str(out), "count": manifest["count"], "dim": manifest["dim"],
                                     "shards": len(manifest["shards"]),
                                     "index": (manifest.get("index") or {}).get("type")}) + "\n")
    if not state.is_main_process:
        return 0
    if args.query is not None or args.duplicates is not None:
        manifest = load_manifest(out)
        if args.duplicates is not None:
            _duplicates(args, out, manifest)
        else:
            if corpus is None:
                corpus = _query_corpus(args, manifest, state.device)
            _query(args, corpus, out, manifest)
    return 0


def query_corpus(out: Path, manifest: dict[str, Any], device: torch.device) -> Corpus:
    """The encoder a finished ``contrastive-embed`` folder records (``manifest``), rebuilt to
    embed new queries as the corpus was (``contrastive-plot retrieval --query``)."""
    return _query_corpus(_parser().parse_args(["--out", str(out)]), manifest, device)


def _query_corpus(args: argparse.Namespace, manifest: dict[str, Any], device: torch.device) -> Corpus:
    """The encoder the manifest records (flags given now take precedence), checked by sha256."""
    for key, value in manifest["rebuild"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    corpus = _corpus(args, device)
    if corpus.encoder.get("sha256") != manifest["encoder"].get("sha256"):
        raise BadInput(f"the encoder of --checkpoint {args.checkpoint or args.init} is not the one that "
                       f"embedded --out {args.out} (sha256 differs); leave --checkpoint out to use that one")
    return corpus


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
