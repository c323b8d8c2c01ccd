"""Command-line tools: ``contrastive-linear-eval``, ``contrastive-knn-eval``, ``contrastive-export``,
``contrastive-plot``. Each ``*_main(argv=None)`` parses ``argv`` (default ``sys.argv[1:]``) and
returns 0 on success; ``tools/*.py`` are thin wrappers around them.

Run them under ``accelerate launch`` to spread feature extraction over several GPUs / processes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contrastive.hardware import PRECISIONS, resolve_precision, warn_if_emulated_bf16

__all__ = ["linear_eval_main", "knn_eval_main", "export_main", "plot_main"]

log = logging.getLogger("contrastive.eval")

_CHECKPOINT_HELP = (
    "encoder.pt, run folder, checkpoint folder (checkpoints/step_N), official MoCo / MoCo v3 "
    "checkpoint, 'timm:<model>' / 'torchvision:<model>' (its own pretrained weights), or 'random' "
    "(random init of --encoder: the baseline)"
)
_DATA_HELP = (
    "data spec as for training: a folder with train/ and val/ (or test/), imagefolder:/path, "
    "cifar10[:/path], shapes[:n=..,size=..], synthetic"
)


def _emit(line: str) -> None:
    """The tool's result on stdout (its output, not a log line: logs go to stderr)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help=_CHECKPOINT_HELP)
    p.add_argument("--data", required=True, help=_DATA_HELP)
    p.add_argument("--output", default=None, help="write the result JSON here")
    p.add_argument("--encoder", default=None,
                   help="create_encoder name, when the checkpoint does not record it (or to override)")
    p.add_argument("--prefix", default=None,
                   help="key prefix of the backbone inside the checkpoint (default: found automatically)")
    p.add_argument("--image-size", type=int, default=None,
                   help="evaluation crop size (default: the run's image_size, else 224)")
    _norm_flags(p)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present")
    p.add_argument("--mixed-precision", choices=PRECISIONS, default="auto",
                   help="autocast for the backbone forward (features and the head stay float32); "
                   "auto: accelerate's configuration if set, else bf16 on CUDA devices and CPUs "
                   "with native bf16, fp32 elsewhere")


def _norm_flags(p: argparse._ActionsContainer) -> None:
    p.add_argument("--mean", type=float, nargs=3, default=None,
                   help="normalisation mean of the pretraining pipeline (default: recorded with the "
                   "checkpoint, else ImageNet's)")
    p.add_argument("--std", type=float, nargs=3, default=None, help="normalisation std (as --mean)")


def _label_fraction(text: str) -> float:
    from contrastive.eval.runner import check_label_fraction

    try:
        return check_label_fraction(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e) if "label fraction" in str(e) else
                                          f"label fraction must be a number in (0, 1]; got {text!r}") from e


def _accelerator(args: argparse.Namespace):
    import torch
    from accelerate import Accelerator

    on_cpu = args.cpu or not torch.cuda.is_available()
    precision, why = resolve_precision(args.mixed_precision, on_cpu=on_cpu)
    acc = Accelerator(cpu=args.cpu, mixed_precision=precision)
    if acc.is_main_process:
        log.info("precision: %s (%s)", "fp32" if precision == "no" else precision, why)
        if precision == "bf16" and acc.device.type == "cpu":
            warn_if_emulated_bf16()
    return acc


def _load(args: argparse.Namespace):
    from contrastive.eval.checkpoint import load_encoder

    loaded = load_encoder(args.checkpoint, encoder=args.encoder, prefix=getattr(args, "prefix", None))
    size = args.image_size or loaded.image_size  # the flag, else the pretraining crop size
    if size is None:
        log.info("%s records no image size: evaluating at 224 px (pass --image-size)", args.checkpoint)
        size = 224
    mean, std, source = loaded.normalisation(args.mean, args.std)
    log.info("normalisation: mean %s, std %s (%s)", mean, std, source)
    return loaded, size, {"mean": mean, "std": std}


def _finish(result: dict[str, Any], output: str | None, accelerator: Any) -> None:
    if accelerator is not None and not accelerator.is_main_process:
        return
    summary = {k: result[k] for k in ("top1", "top5") if k in result}
    _emit(json.dumps({"protocol": result.get("protocol"), **summary,
                      "checkpoint": result["checkpoint"]["path"] or result["checkpoint"]["sha256"]}))
    if output:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        log.info("wrote %s", out)


def linear_eval_main(argv: Sequence[str] | None = None) -> int:
    """``contrastive-linear-eval``: linear-probe top-1 / top-5 of a checkpoint on a labelled data set."""
    p = argparse.ArgumentParser(
        prog="contrastive-linear-eval",
        description="Linear probe on a frozen backbone. cached (default): centre-crop features once, "
        "lr/wd chosen on 10%% of the training set; standard: the MoCo protocol (augmented crops "
        "every epoch, SGD lr 30, 100 epochs, lr x0.1 at 60 and 80).",
    )
    _common(p)
    p.add_argument("--protocol", choices=("cached", "standard"), default="cached")
    p.add_argument("--epochs", type=int, default=None, help="default 100 (both protocols)")
    p.add_argument("--lr", type=float, default=None,
                   help="standard: default 30; cached: fixes the lr instead of the sweep")
    p.add_argument("--label-fraction", type=_label_fraction, default=1.0,
                   help="low-shot: train on this class-balanced fraction of the labels, 0 < F <= 1 "
                   "(e.g. 0.01); when too few labelled rows remain to hold out 100 for the lr / wd "
                   "sweep, it cross-validates on them, and below 20 rows (or 2 per class) it uses "
                   "the fixed lr 0.1, wd 1e-3 (the result JSON says which)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    _setup_logging()
    from contrastive.eval.runner import linear_eval

    accelerator = _accelerator(args)
    loaded, size, norm = _load(args)
    result = linear_eval(loaded, args.data, protocol=args.protocol, image_size=size, **norm, epochs=args.epochs,
                         batch_size=args.batch_size, label_fraction=args.label_fraction, lr=args.lr,
                         num_workers=args.num_workers, seed=args.seed, accelerator=accelerator)
    _finish(result, args.output, accelerator)
    return 0


def knn_eval_main(argv: Sequence[str] | None = None) -> int:
    """``contrastive-knn-eval``: weighted-kNN top-1 (bank = train split, queries = val/test split)."""
    p = argparse.ArgumentParser(
        prog="contrastive-knn-eval",
        description="Weighted kNN (InstDisc / MoCo CIFAR demo): L2-normalised features, the k nearest "
        "training images vote with weight exp(similarity / temperature); exact faiss search.",
    )
    _common(p)
    p.add_argument("--k", type=int, default=200,
                   help="neighbours; clamped to the number of training images (the result JSON "
                   "records the k used and the k asked for)")
    p.add_argument("--temperature", type=float, default=0.1)
    p.add_argument("--store", choices=("float32", "float16"), default="float32",
                   help="float16 halves the index memory (faiss IndexScalarQuantizer; approximate)")
    args = p.parse_args(argv)
    _setup_logging()
    from contrastive.eval.runner import knn_eval

    accelerator = _accelerator(args)
    loaded, size, norm = _load(args)
    result = knn_eval(loaded, args.data, k=args.k, temperature=args.temperature, image_size=size, **norm,
                      batch_size=args.batch_size, store=args.store, num_workers=args.num_workers,
                      accelerator=accelerator)
    _finish(result, args.output, accelerator)
    return 0


def export_main(argv: Sequence[str] | None = None) -> int:
    """``contrastive-export``: backbone weights under timm's / torchvision's key names, or a text
    model as a Hugging Face / sentence-transformers folder."""
    p = argparse.ArgumentParser(
        prog="contrastive-export",
        description="Write the backbone of a checkpoint with timm or torchvision key names, loadable "
        "with strict=True into timm.create_model(name, num_classes=0) / the torchvision model with "
        "its classifier set to nn.Identity() (and into the default models with only the "
        "classifier missing). Text: --format hf writes a fine-tuned teacher or distilled student "
        "as a Hugging Face folder (AutoModel / AutoModelForSequenceClassification); --format "
        "sentence-transformers an encoder and its pooling (e.g. SimCSE) as a folder "
        "SentenceTransformer loads. --format onnx: any encoder (ours, timm, torchvision, a "
        "Hugging Face text folder) as one .onnx file of its features, dynamic batch (and "
        "sequence) axis, the expected input in its metadata. Every export is read back and "
        "checked before it is kept (onnx: ONNX Runtime against torch, the largest difference "
        "printed).",
    )
    p.add_argument("--checkpoint", required=True,
                   help=f"{_CHECKPOINT_HELP}; text formats: a classifier folder "
                   "(classifier.json) or, for sentence-transformers, a Hugging Face model folder")
    p.add_argument("--format", required=True,
                   choices=("timm", "torchvision", "hf", "sentence-transformers", "onnx"))
    p.add_argument("--out", required=True,
                   help="output file (.pth / .pt, or .safetensors; .onnx for onnx); a folder for "
                   "the hf and sentence-transformers formats")
    p.add_argument("--model", default=None, help="target model name (default: from the encoder name)")
    p.add_argument("--encoder", default=None, help="the checkpoint's encoder name, if it does not record it")
    p.add_argument("--prefix", default=None, help="key prefix of the backbone inside the checkpoint")
    p.add_argument("--encoder-only", action="store_true",
                   help="hf: the encoder without the classifier head (AutoModel only)")
    p.add_argument("--pooling", default=None, choices=("cls", "mean", "pooler"),
                   help="sentence-transformers, onnx: the pooling (default: the folder's own: "
                   "simcse.json / classifier.json (onnx: also a sentence-transformers folder's "
                   "pipeline), else the model's pooler if it has one)")
    p.add_argument("--normalize", action="store_true",
                   help="sentence-transformers: add a Normalize module (unit-length embeddings)")
    onnx = p.add_argument_group("onnx")
    onnx.add_argument("--image-size", type=int, default=None,
                      help="input height = width (default: recorded with the weights, else 224)")
    _norm_flags(onnx)
    onnx.add_argument("--fold-normalisation", action="store_true",
                      help="the graph normalises: its input is RGB in [0, 1] (default: the "
                      "caller normalises with the mean / std written in the file's metadata)")
    onnx.add_argument("--check-data", default=None,
                      help="inputs of the check: an image data spec (as --data elsewhere) or, "
                      "for a text model, a text file with one sentence a line (default: the "
                      "run's data when it reads here, else a fixed batch: random pixels, fixed "
                      "sentences)")
    onnx.add_argument("--check-count", type=int, default=8, help="rows of the check batch")
    onnx.add_argument("--atol", type=float, default=None,
                      help="largest absolute difference accepted between ONNX Runtime and torch "
                      "(default 1e-4, float32); above it the file is removed")
    onnx.add_argument("--opset", type=int, default=None,
                      help="ONNX opset (default: torch's recommended one)")
    args = p.parse_args(argv)
    _setup_logging()
    if args.format == "onnx":
        return _export_onnx(p, args)
    onnx_only = [flag for flag, value in (
        ("--image-size", args.image_size), ("--mean", args.mean), ("--std", args.std),
        ("--fold-normalisation", args.fold_normalisation or None),
        ("--check-data", args.check_data), ("--atol", args.atol), ("--opset", args.opset))
        if value is not None]
    if onnx_only:
        p.exit(2, f"{p.prog}: error: only --format onnx takes {', '.join(onnx_only)}\n")
    if args.format in ("hf", "sentence-transformers"):
        from contrastive.eval.export_text import export_folder

        try:
            how = export_folder(args.checkpoint, args.out, args.format,
                                head=not args.encoder_only, pooling=args.pooling,
                                normalize=args.normalize)
        except (ValueError, FileNotFoundError, ImportError) as e:  # input / the text extra: one line
            p.exit(2, f"{p.prog}: error: {e}\n")
        _emit(f"wrote {args.out}; load with {how}")
        return 0
    from contrastive.eval.export import export_state_dict, save_export

    try:
        state, model = export_state_dict(args.checkpoint, args.format, model=args.model,
                                         encoder=args.encoder, prefix=args.prefix)
    except (ValueError, FileNotFoundError) as e:  # no counterpart, another architecture: one line
        p.exit(2, f"{p.prog}: error: {_first_line(e)}\n")
    out = save_export(state, args.out, metadata={"format": args.format, "model": model})
    load = (f"timm.create_model({model!r}, num_classes=0)" if args.format == "timm"
            else f"torchvision.models.get_model({model!r}) with its classifier = nn.Identity()")
    _emit(f"wrote {len(state)} tensors to {out}; load with strict=True into {load}")
    return 0


def _export_onnx(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from contrastive.eval.export_onnx import DEFAULT_ATOL, OnnxMismatchError, export_onnx

    try:
        result = export_onnx(args.checkpoint, args.out, encoder=args.encoder, prefix=args.prefix,
                             image_size=args.image_size, mean=args.mean, std=args.std,
                             fold_normalisation=args.fold_normalisation, pooling=args.pooling,
                             check_data=args.check_data, check_count=args.check_count,
                             atol=DEFAULT_ATOL if args.atol is None else args.atol,
                             opset=args.opset)
    except (ValueError, FileNotFoundError, ImportError) as e:  # bad input / the extra: one line
        p.exit(2, f"{p.prog}: error: {_first_line(e)}\n")
    except OnnxMismatchError as e:
        p.exit(1, f"{p.prog}: error: {e}\n")
    _emit(f"wrote {result.path} ({result.modality}; input: {result.metadata['input']}); "
          f"ONNX Runtime vs torch on {result.checked_on}, batch sizes "
          f"{', '.join(map(str, result.batch_sizes))}: largest absolute difference "
          f"{result.max_abs_diff:.3g}")
    return 0


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


PICTURES = ("attention", "mae", "retrieval")
"""The picture modes of ``contrastive-plot MODE ...`` (:mod:`contrastive.eval.pictures`)."""


def plot_main(argv: Sequence[str] | None = None) -> int:
    """``contrastive-plot``: training curves of a run, and optionally a 2-D map of embeddings
    (t-SNE, UMAP or PCA); ``contrastive-plot attention | mae | retrieval ...``: the pictures of
    :mod:`contrastive.eval.pictures`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PICTURES:
        return _pictures_main(argv[0], argv[1:])
    p = argparse.ArgumentParser(
        prog="contrastive-plot",
        description="Training curves (every numeric series of metrics.jsonl against the step) to a "
        "PNG, and with --data a 2-D map (t-SNE, UMAP or PCA) of the encoder's embeddings coloured "
        "by class.",
        epilog="Pictures of a model (each mode has its own --help): 'contrastive-plot attention' "
        "(a ViT's last-layer self-attention per head, DINO's figure), 'contrastive-plot mae RUN' "
        "(MAE reconstructions), 'contrastive-plot retrieval EMBED_FOLDER' (queries and their "
        "nearest neighbours from contrastive-embed).",
    )
    p.add_argument("run", nargs="?", default=None, help="run folder (holds metrics.jsonl)")
    p.add_argument("--run", dest="run_opt", default=None, help="run folder (same as the positional)")
    p.add_argument("--out", default=None, help="curves PNG (default: <run>/curves.png)")
    p.add_argument("--keys", default=None, help="comma-separated series to plot (default: all)")
    p.add_argument("--data", default=None, help="also draw the embedding map of this data spec")
    p.add_argument("--checkpoint", default=None, help="encoder for the map (default: the run)")
    p.add_argument("--encoder", default=None, help="encoder name, if the checkpoint does not record it")
    p.add_argument("--split", default="test", choices=("train", "test"))
    p.add_argument("--max-samples", type=int, default=2000)
    p.add_argument("--method", choices=("tsne", "umap", "pca"), default="tsne",
                   help='the 2-D map (umap needs the extra: pip install -e ".[umap]")')
    p.add_argument("--seed", type=int, default=0, help="seed of the t-SNE / UMAP map")
    p.add_argument("--embedding-out", default=None, help="map PNG (default: <run>/embedding.png)")
    p.add_argument("--image-size", type=int, default=None)
    _norm_flags(p)
    p.add_argument("--num-workers", type=int, default=2)
    args = p.parse_args(argv)
    _setup_logging()
    run = args.run_opt or args.run
    if run is None and args.data is None:
        p.error("give a run folder (curves) and/or --data with --checkpoint (embedding map)")
    from contrastive.eval import plot

    if args.data is not None and args.method == "umap":
        try:  # before any work: one line that says what to install
            plot.require_umap()
        except ImportError as e:
            p.exit(2, f"{p.prog}: error: {e}\n")
    if run is not None:
        keys = args.keys.split(",") if args.keys else None
        out = plot.plot_curves(run, args.out or Path(run) / "curves.png", keys=keys)
        _emit(f"wrote {out}")
    if args.data is not None:
        checkpoint = args.checkpoint or run
        if checkpoint is None:
            p.error("--data needs --checkpoint (or a run folder)")
        args.checkpoint = checkpoint
        loaded, size, norm = _load(args)
        emb_out = args.embedding_out or (Path(run) / "embedding.png" if run else Path("embedding.png"))
        out = plot.plot_encoder_embedding(loaded, args.data, emb_out, image_size=size, **norm,
                                          split=args.split, max_samples=args.max_samples,
                                          method=args.method, seed=args.seed,
                                          num_workers=args.num_workers)
        _emit(f"wrote {out}")
    return 0


_PICTURE_HELP = {
    "attention": (
        "The last-layer self-attention of a ViT (DINO's figure, facebookresearch/dino "
        "visualize_attention.py): for each image a row of panels, the [CLS] query's attention to "
        "the patches for each head (and their mean), upsampled over the image, with the outline "
        "of the patches holding --threshold of the mass. Example: contrastive-plot attention "
        "--checkpoint runs/dinov2_cifar --data cifar10 --num-images 4"),
    "mae": (
        "MAE reconstructions (the paper's figure 2): for each image the original, the masked "
        "input and the reconstruction with the visible patches pasted, from a run of "
        "recipes/mae_cifar.py / mae_in1k.py (its newest training checkpoint: the decoder is not "
        "in encoder.pt). Example: contrastive-plot mae runs/mae_cifar --num-images 6"),
    "retrieval": (
        "A retrieval grid from a contrastive-embed folder: each query (a corpus row, or an image "
        "file embedded by the folder's encoder) and its top-k neighbours, the cosine similarity "
        "under each. Example: contrastive-plot retrieval emb --num-queries 4 --top-k 6"),
}


def _image_flags(p: argparse.ArgumentParser, *, data_default: str) -> None:
    p.add_argument("--images", nargs="+", default=(), metavar="FILE", help="image files to draw")
    p.add_argument("--data", default=None,
                   help=f"or a data spec whose --split gives the images ({data_default})")
    p.add_argument("--split", default="test", choices=("train", "test"))
    p.add_argument("--num-images", type=int, default=4, help="images taken from --data, evenly spread")


def _pictures_main(mode: str, argv: Sequence[str]) -> int:
    """``contrastive-plot attention | mae | retrieval``: one PNG; bad input is one line, exit 2."""
    from contrastive.eval import pictures

    p = argparse.ArgumentParser(prog=f"contrastive-plot {mode}", description=_PICTURE_HELP[mode])
    if mode == "attention":
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument("--checkpoint", help="the ViT: " + _CHECKPOINT_HELP)
        source.add_argument("--init", help="or an --init source (timm:<vit>, a weights file)")
        p.add_argument("--encoder", default=None, help="create_encoder name, when not recorded")
        p.add_argument("--image-size", type=int, default=None,
                       help="input size (default: recorded with the weights, else 224)")
        _norm_flags(p)
        _image_flags(p, data_default="no default")
        p.add_argument("--threshold", type=float, default=0.6,
                       help="outline the patches holding this fraction of the attention (DINO: 0.6; "
                       "0: none)")
        p.add_argument("--no-head-mean", action="store_true", help="leave out the mean over heads")
        p.add_argument("--out", default="attention.png", help="PNG (default: attention.png)")
    elif mode == "mae":
        p.add_argument("run", help="run folder of an MAE recipe, or one of its checkpoints/step_N")
        _image_flags(p, data_default="default: the run's --data")
        p.add_argument("--mask-ratio", type=float, default=None, help="default: the run's")
        p.add_argument("--seed", type=int, default=0, help="seed of the random masks")
        p.add_argument("--out", default=None, help="PNG (default: <run>/mae.png)")
    else:
        p.add_argument("folder", help="a contrastive-embed --out folder of images")
        p.add_argument("--rows", type=pictures.parse_rows, default=None,
                       help="corpus rows as queries, e.g. 0,5,9 (default: --num-queries rows spread "
                       "over the corpus)")
        p.add_argument("--num-queries", type=int, default=4)
        p.add_argument("--query", nargs="+", default=(), metavar="FILE",
                       help="image files as queries (embedded by the folder's encoder)")
        p.add_argument("--top-k", type=int, default=5)
        p.add_argument("--out", default=None, help="PNG (default: <folder>/retrieval.png)")
    args = p.parse_args(argv)
    _setup_logging()
    try:
        out = _draw(mode, args)
    except (ValueError, FileNotFoundError, TypeError, ImportError, OSError) as e:
        p.exit(2, f"{p.prog}: error: {_first_line(e)}\n")
    _emit(f"wrote {out}")
    return 0


def _draw(mode: str, args: argparse.Namespace) -> Path:
    import torch

    from contrastive.eval import pictures
    from contrastive.eval.runner import eval_transform

    if mode == "attention":
        from contrastive.eval.embed import image_encoder

        encoder, size, mean, std, provenance = image_encoder(args)
        pictures.check_attention_vit(encoder, provenance["encoder"])
        x = pictures.load_images(images=args.images, data=args.data, split=args.split,
                                 count=args.num_images, transform=eval_transform(size, mean, std))
        maps = pictures.cls_attention(encoder, x)
        return pictures.plot_attention(pictures.unnormalise(x, mean, std), maps, args.out,
                                       threshold=args.threshold or None,
                                       with_mean=not args.no_head_mean,
                                       title=f"{provenance['encoder']}: last-layer [CLS] attention")
    if mode == "mae":
        method, run = pictures.load_mae_run(args.run)
        data = args.data if args.images or args.data else run["data"]
        x = pictures.load_images(images=args.images, data=data, split=args.split,
                                 count=args.num_images,
                                 transform=eval_transform(run["image_size"], run["mean"], run["std"]))
        rec = pictures.mae_reconstruct(method, x, mean=run["mean"], std=run["std"],
                                       mask_ratio=args.mask_ratio, seed=args.seed)
        return pictures.plot_mae(rec, args.out or Path(args.run) / "mae.png",
                                 title=f"MAE {Path(args.run).name}, step {run['step']}")
    rows = args.rows
    if rows is None and not args.query:
        from contrastive.eval.embed import load_manifest

        count = int(load_manifest(Path(args.folder)).get("count", 0)) if Path(args.folder).is_dir() else 0
        rows = torch.linspace(0, max(count - 1, 0), min(args.num_queries, count)).long().unique().tolist()
    out, _ = pictures.plot_retrieval(args.folder, args.out or Path(args.folder) / "retrieval.png",
                                     rows=rows or (), queries=args.query, top_k=args.top_k)
    return out
