"""Export an encoder to ONNX, checked by ONNX Runtime against torch before the file is kept.

The graph computes the features the toolkit uses (what :func:`~contrastive.eval.features.
extract_features` and the text evaluations compute), in float32:

- images (``cifar_resnet*``, ``small_cnn``, ``timm:*``, ``torchvision:*``; any checkpoint
  :func:`~contrastive.eval.checkpoint.load_encoder` reads): input ``image`` (batch, 3, H, W),
  output ``features`` (batch, D), the pooled backbone. The input is normalised by the caller,
  as timm's and torchvision's own exports expect, unless ``fold_normalisation``: then the graph
  takes RGB values in [0, 1] and subtracts the mean and divides by the std itself (one file
  that cannot be fed the wrong statistics). Resizing and cropping stay the caller's: H = W = the
  image size recorded with the weights.
- text (a Hugging Face folder: a SimCSE ``model/``, a sentence-transformers folder, a classifier
  folder with ``classifier.json``, or ``hf:FOLDER``): inputs ``input_ids`` and
  ``attention_mask`` (batch, sequence) int64, output ``features`` (batch, D): the encoder with
  its pooling (``cls``, ``mean`` or ``pooler``: ``pooling``, else the folder's own as
  ``contrastive-sts-eval`` chooses it, a sentence-transformers pipeline with its Dense and
  Normalize modules included). ``token_type_ids`` is not an input (zeros, one sentence).

The batch axis is dynamic (named ``batch``), and for text the sequence axis (``sequence``, up
to the model's position embeddings). The expected input is recorded in the file's metadata
(``metadata_props``, read by ``onnxruntime``'s ``get_modelmeta().custom_metadata_map``):
``contrastive.input`` in words, ``image_size``, ``mean``, ``std`` and ``normalisation`` (applied
by the caller or in the graph) for images, ``pooling`` and ``max_sequence`` for text, the
``encoder`` name and the weights' ``sha256`` (lists as JSON).

Exporter: ``torch.onnx.export(..., dynamo=True)`` with ``dynamic_shapes`` (``torch.export.Dim``).
It is torch's default since 2.9 and the maintained one (the TorchScript exporter,
``dynamo=False`` with ``dynamic_axes``, warns that it is deprecated), and it captures shapes
symbolically, where the tracer bakes Python branches on shapes into the graph (its
``TracerWarning`` on transformers' mask code). It needs ``onnxscript``; it costs a few seconds a
model (onnxscript builds its operator table on every export), which an export can afford.

Check: the saved file is run by ONNX Runtime (CPU) and compared with the torch module at two
batch sizes (and for text two sequence lengths) on real inputs: ``check_data`` (an image data
spec, or a text file with one sentence a line), else the run's own data (its ``config.json``),
else a fixed random batch (uniform pixels / fixed sentences tokenised by the folder's
tokenizer, else random token ids); the result says which. A largest absolute difference above
``atol`` (1e-4 by default) removes the file and raises :class:`OnnxMismatchError`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_ATOL", "ONNX_INSTALL", "OnnxExport", "OnnxMismatchError", "check_onnx",
           "export_onnx", "require_onnx", "text_source"]

ONNX_INSTALL = 'pip install -e ".[onnx]"'
DEFAULT_ATOL = 1e-4
_EXAMPLE_ROWS = 2  # the example batch of the export: 2 rows (a batch of 1 would fix the axis)
_SENTENCES = (  # the fixed text batch: lengths that make the tokenizer pad
    "A photo of a dog playing in the snow.",
    "Contrastive learning pulls two views of one example together.",
    "The cat sat.",
    "Stocks fell sharply on Monday after the central bank raised interest rates again.",
    "ONNX Runtime runs the exported graph.",
    "Where is the station?",
    "Self-supervised models learn from unlabelled images and text.",
    "Yes.",
)


class OnnxMismatchError(RuntimeError):
    """ONNX Runtime's output differs from torch's by more than the tolerance (file removed)."""


@dataclass
class OnnxExport:
    """What :func:`export_onnx` wrote and how it was checked."""

    path: Path
    modality: str  # "image" or "text"
    max_abs_diff: float
    checked_on: str  # the inputs of the check, in words
    batch_sizes: tuple[int, ...]
    metadata: dict[str, str] = field(default_factory=dict)


def require_onnx() -> Any:
    """``onnxruntime`` (after checking ``onnx`` and ``onnxscript``, which torch's exporter
    needs), or an ``ImportError`` of one line that names the install command."""
    try:
        import onnx  # noqa: F401
        import onnxruntime
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ImportError(f"--format onnx needs onnx, onnxscript and onnxruntime ({e.name} is "
                          f"missing): {ONNX_INSTALL}") from e
    return onnxruntime


# -- the model and its inputs ------------------------------------------------------------------


class _FoldedNormalisation(nn.Module):
    """``backbone((x - mean) / std)``: the graph takes RGB values in [0, 1]."""

    def __init__(self, backbone: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.backbone = backbone
        self.mean: Tensor
        self.std: Tensor
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:
        from contrastive.augment.functional import normalize

        return self.backbone(normalize(x, self.mean, self.std))


class _SentencePipeline(nn.Module):
    """A sentence-transformers folder's embedding: the encoder's last layer, pooled, its Dense
    layers, Normalize (:class:`~contrastive.nn.hf_folders.SentencePooling`)."""

    def __init__(self, encoder: Any, pipeline: Any) -> None:
        super().__init__()
        self.encoder = encoder  # a TextEncoder
        self.pipeline = pipeline

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.encoder.encode(input_ids, attention_mask).hidden_states[-1]
        return self.pipeline.pool(hidden, attention_mask)


@dataclass
class _Prepared:
    """A module to export, its check inputs (a tuple of tensors per batch size) and metadata."""

    module: nn.Module
    batches: list[tuple[Tensor, ...]]
    input_names: tuple[str, ...]
    dynamic_shapes: tuple[dict[int, Any], ...]
    checked_on: str
    metadata: dict[str, Any]


def text_source(checkpoint: str | Path) -> Path | None:
    """The Hugging Face folder ``checkpoint`` names when it is a text model (``hf:FOLDER``, a
    folder with ``classifier.json`` or a Hugging Face ``config.json``, or a run folder whose
    ``model/`` is one); None for anything else (an image checkpoint)."""
    from contrastive.records import CLASSIFIER_FILE

    spec = str(checkpoint)
    if spec.startswith("hf:"):
        return Path(spec[3:]).expanduser()
    path = Path(spec).expanduser()
    for folder in (path, path / "model"):
        if (folder / CLASSIFIER_FILE).is_file():
            return folder
        config = folder / "config.json"
        if config.is_file():
            try:
                if "model_type" in json.loads(config.read_text(encoding="utf-8")):
                    return folder
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
    return None


def _spread(n_items: int, count: int) -> list[int]:
    """``count`` indices spread evenly over ``n_items`` (every class of a sorted folder)."""
    count = min(count, n_items)
    return sorted({round(i * (n_items - 1) / max(count - 1, 1)) for i in range(count)})


def _without_download(spec: str) -> str:
    """``spec`` with ``download=false`` when its data set takes that option (the check never
    downloads a data set)."""
    from contrastive.data.spec import parse_spec

    candidate = f"{spec}{',' if ':' in spec else ':'}download=false"
    try:
        # a folder path parses as an image folder whose root is the whole candidate string:
        # keep the candidate only where the option landed among the same data set's options
        parsed, plain = parse_spec(candidate), parse_spec(spec)
    except (ValueError, LookupError):  # LookupError: UnknownDatasetError
        return spec
    return candidate if parsed.name == plain.name and "download" in parsed.options else spec


def _image_pixels(data: str, size: int, count: int) -> Tensor:
    """(count, 3, size, size) RGB values in [0, 1]: the evaluation centre crops of ``data``'s
    test split (else its train split), spread over it."""
    from contrastive.data import has_split
    from contrastive.eval.features import unwrap_views
    from contrastive.eval.runner import eval_transform, load_split

    split = "test" if has_split(data, "test") else "train"
    ds: Any = load_split(data, split, eval_transform(size, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    return torch.stack([unwrap_views(ds[i][0]) for i in _spread(len(ds), count)]).float()


def _prepare_image(checkpoint: str | Path, *, encoder: str | None, prefix: str | None,
                   image_size: int | None, mean: Sequence[float] | None,
                   std: Sequence[float] | None, fold_normalisation: bool,
                   check_data: str | None, count: int) -> _Prepared:
    from contrastive.augment.functional import normalize
    from contrastive.eval.checkpoint import load_encoder
    from contrastive.nn.text_encoders import TextEncoder

    loaded = load_encoder(checkpoint, encoder=encoder, prefix=prefix)
    if isinstance(loaded.encoder, TextEncoder):
        raise ValueError(f"{checkpoint} holds a text encoder ({loaded.name}): give its Hugging "
                         "Face folder (a run's model/ or the hf: folder) as --checkpoint")
    size = int(image_size or loaded.image_size or 224)
    mean_t, std_t, norm_from = loaded.normalisation(mean, std)
    mean, std = list(mean_t), list(std_t)
    recorded = (loaded.config or {}).get("data")
    if check_data is not None:
        pixels = _image_pixels(check_data, size, count)
        checked_on = f"{len(pixels)} images of {check_data}"
    elif isinstance(recorded, str) and recorded:
        try:
            pixels = _image_pixels(_without_download(recorded), size, count)
            checked_on = f"{len(pixels)} images of the run's data {recorded}"
        except Exception as e:  # moved, not downloaded, unreadable: the fixed batch instead
            log.info("the run's data %s does not read here (%s): checking on a fixed random batch",
                     recorded, str(e).splitlines()[0] if str(e) else type(e).__name__)
            pixels, checked_on = None, ""
    else:
        pixels, checked_on = None, ""
    if pixels is None:
        g = torch.Generator().manual_seed(0)
        pixels = torch.rand(count, 3, size, size, generator=g)
        checked_on = (f"{count} random images (uniform pixels, seed 0: give --check-data for "
                      "real ones)")
    module: nn.Module = loaded.encoder.float().eval()
    if fold_normalisation:
        module, x = _FoldedNormalisation(module, mean, std).eval(), pixels
    else:
        x = normalize(pixels, torch.tensor(mean), torch.tensor(std))
    batch = torch.export.Dim("batch", min=1)
    metadata = {
        "encoder": loaded.name, "sha256": loaded.sha256, "image_size": size, "mean": mean,
        "std": std, "normalisation_from": norm_from,
        "normalisation": "in the graph" if fold_normalisation else "by the caller",
        "input": (f"image: float32 (batch, 3, {size}, {size}), RGB "
                  + ("in [0, 1] (the graph normalises)" if fold_normalisation
                     else "normalised: (x - mean) / std, x in [0, 1]")),
    }
    return _Prepared(module, [(x,), (x[:1],)], ("image",), ({0: batch},), checked_on, metadata)


def _text_model(folder: Path, pooling: str | None) -> tuple[nn.Module, str]:
    """The text model to export and its pooling in words: a classifier's encoder (``pooling``,
    else its own), else the sentence embedding ``contrastive-sts-eval`` would use
    (:func:`~contrastive.eval.sts.choose_sentence_pooling`)."""
    from contrastive.eval.classifier_folder import load_classifier
    from contrastive.eval.sts import choose_sentence_pooling
    from contrastive.nn.text_encoders import POOLINGS, TextEncoder, load_text_encoder
    from contrastive.records import CLASSIFIER_FILE

    if (folder / CLASSIFIER_FILE).is_file():
        encoder: TextEncoder = load_classifier(folder)[0].encoder
        if pooling is not None and pooling != encoder.pooling:
            encoder = TextEncoder(encoder.model, pooling=pooling)
        return encoder, encoder.pooling
    chosen, pipeline, _ = choose_sentence_pooling(folder, pooling)
    model_dir = pipeline.transformer_dir if pipeline and pipeline.transformer_dir else folder
    encoder = load_text_encoder(model_dir, pooling=chosen if chosen in POOLINGS else "auto")
    if pipeline is not None:
        return _SentencePipeline(encoder, pipeline), pipeline.describe()
    return encoder, encoder.pooling


def _prepare_text(folder: Path, *, pooling: str | None, check_data: str | None,
                  count: int) -> _Prepared:
    from contrastive.data.tokenizer import TOKENIZER_FILE, load_tokenizer

    if not folder.is_dir():
        raise FileNotFoundError(f"text model folder {folder} not found; give a Hugging Face "
                                "folder (config.json + model.safetensors)")
    has_tokenizer = (folder / TOKENIZER_FILE).is_file() or (folder / "vocab.txt").is_file()
    lines: list[str] = []
    if check_data is not None:  # read before the model loads: a bad file fails at once
        path = Path(check_data).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"--check-data {check_data}: not a file; a text model is "
                                    "checked on a text file with one sentence a line")
        lines = [t.strip() for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
        if not lines:
            raise ValueError(f"--check-data {check_data}: no sentence in it (one a line)")
        if not has_tokenizer:
            raise ValueError(f"{folder} has no {TOKENIZER_FILE} or vocab.txt to tokenise "
                             f"--check-data; copy the tokenizer into the folder")
    module, pooled = _text_model(folder, pooling)
    module = module.float().eval()
    config: Any = (module.encoder if isinstance(module, _SentencePipeline) else module).config
    max_sequence = int(config.max_position_embeddings)
    if lines:
        texts = lines[:count]
        checked_on = f"{len(texts)} sentences of {check_data}"
    elif has_tokenizer:
        texts = list(_SENTENCES[:count])
        checked_on = f"{len(texts)} fixed English sentences"
    else:
        texts, checked_on = [], f"{count} rows of random token ids (seed 0: no tokenizer here)"
    if texts:
        tokens = load_tokenizer(folder, max_length=min(128, max_sequence))(texts)
        ids, mask = tokens["input_ids"], tokens["attention_mask"]
    else:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, int(config.vocab_size), (count, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[1:, 8:] = 0
    if len(ids) < _EXAMPLE_ROWS:
        raise ValueError(f"the check needs {_EXAMPLE_ROWS} sentences or more; got {len(ids)}")
    first = int(mask[0].sum())  # the first sentence alone: another batch size and length
    batch = torch.export.Dim("batch", min=1)
    sequence = torch.export.Dim("sequence", min=1, max=max_sequence)
    metadata = {
        "encoder": f"hf:{folder}", "pooling": pooled, "max_sequence": max_sequence,
        "input": ("input_ids, attention_mask: int64 (batch, sequence), BERT's tokens of one "
                  "sentence ([CLS] ... [SEP]), padding masked by 0"),
    }
    return _Prepared(module, [(ids, mask), (ids[:1, :first], mask[:1, :first])],
                     ("input_ids", "attention_mask"), ({0: batch, 1: sequence},) * 2,
                     checked_on, metadata)


# -- export and check --------------------------------------------------------------------------


_EXPORTER_LOGS = ("onnxscript", "onnx_ir", "torch.onnx", "torch.export", "torch._export")


@contextlib.contextmanager
def _quiet(names: Sequence[str]) -> Iterator[None]:
    """The exporter's per-pass INFO lines (dozens a model) held back; warnings pass."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _write(prepared: _Prepared, out: Path, opset: int | None) -> None:
    """Export with torch's dynamo exporter and save one file (weights inside, under 2 GB)."""
    example = tuple(t[:_EXAMPLE_ROWS] for t in prepared.batches[0])
    with warnings.catch_warnings(), _quiet(_EXPORTER_LOGS):
        # one Dim shared by two inputs is named once, as meant
        warnings.filterwarnings("ignore", message=".*The axis name.*will not be used")
        program = torch.onnx.export(prepared.module, example, dynamo=True, verbose=False,
                                    input_names=list(prepared.input_names),
                                    output_names=["features"], opset_version=opset,
                                    dynamic_shapes=prepared.dynamic_shapes)
    assert program is not None  # dynamo=True returns the program
    program.model.metadata_props.update(
        {f"contrastive.{k}": v if isinstance(v, str) else json.dumps(v)
         for k, v in prepared.metadata.items()})
    size = sum(p.numel() * p.element_size() for p in prepared.module.parameters())
    out.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(out), external_data=size >= 2**31 - 2**26)


@torch.no_grad()
def check_onnx(path: str | Path, module: Callable[..., Tensor],
               batches: Sequence[tuple[Tensor, ...]], input_names: Sequence[str], *,
               atol: float = DEFAULT_ATOL) -> float:
    """Run ``path`` with ONNX Runtime (CPU) on each batch and compare with ``module``; returns
    the largest absolute difference. Above ``atol`` the file is removed and
    :class:`OnnxMismatchError` raised (one line)."""
    ort = require_onnx()
    path = Path(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in batches:
        ours = module(*batch).float()
        theirs = session.run(["features"], dict(zip(input_names, (t.numpy() for t in batch))))[0]
        if tuple(theirs.shape) != tuple(ours.shape):
            worst = float("inf")
            break
        worst = max(worst, float((torch.from_numpy(theirs) - ours).abs().max()))
    if not worst <= atol:  # NaN too
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".data").unlink(missing_ok=True)
        raise OnnxMismatchError(
            f"{path}: ONNX Runtime's features differ from torch's by {worst:.3g} (tolerance "
            f"{atol:g}, float32); the file was removed. The exporter mistranslated an operator "
            "of this model: report it with the model name, or pass a larger --atol to keep it")
    return worst


def export_onnx(checkpoint: str | Path, out: str | Path, *, encoder: str | None = None,
                prefix: str | None = None, image_size: int | None = None,
                mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                fold_normalisation: bool = False, pooling: str | None = None,
                check_data: str | None = None, check_count: int = 8,
                atol: float = DEFAULT_ATOL, opset: int | None = None) -> OnnxExport:
    """Write ``checkpoint``'s encoder as an ONNX file and check it (see the module docstring).

    Args:
        checkpoint: an image checkpoint (:func:`~contrastive.eval.checkpoint.read_checkpoint`)
            or a text model folder (:func:`text_source`).
        out: the ``.onnx`` file.
        encoder, prefix: as for :func:`~contrastive.eval.checkpoint.load_encoder` (images).
        image_size, mean, std: override what the weights record (images).
        fold_normalisation: the graph normalises: its input is RGB in [0, 1] (images).
        pooling: ``cls``, ``mean`` or ``pooler`` (text; default: the folder's own).
        check_data: the check's inputs: an image data spec, or a text file (one sentence a line).
        check_count: rows of the check batch.
        atol: the largest absolute difference accepted.
        opset: the ONNX opset (default: torch's recommended one).

    Raises:
        ValueError, FileNotFoundError: bad input (one line, nothing written).
        OnnxMismatchError: the check failed (the file removed).
        ImportError: the ``onnx`` extra is missing.
    """
    require_onnx()
    if check_count < _EXAMPLE_ROWS:
        raise ValueError(f"--check-count must be {_EXAMPLE_ROWS} or more, got {check_count}")
    out = Path(out)
    if out.suffix != ".onnx":
        raise ValueError(f"--out {out}: give a file name ending in .onnx")
    folder = text_source(checkpoint)
    if folder is not None:
        image_flags = {"--encoder": encoder, "--prefix": prefix, "--image-size": image_size,
                       "--mean": mean, "--fold-normalisation": fold_normalisation or None}
        given = [k for k, v in image_flags.items() if v is not None]
        if given:
            raise ValueError(f"{checkpoint} is a text model (a Hugging Face folder); "
                             f"{', '.join(given)} apply to image encoders: leave them out")
        prepared = _prepare_text(folder, pooling=pooling, check_data=check_data, count=check_count)
        modality = "text"
    else:
        if pooling is not None:
            raise ValueError(f"--pooling applies to text models; {checkpoint} is not a Hugging "
                             "Face folder (give one, e.g. a SimCSE run's model/)")
        prepared = _prepare_image(checkpoint, encoder=encoder, prefix=prefix,
                                  image_size=image_size, mean=mean, std=std,
                                  fold_normalisation=fold_normalisation, check_data=check_data,
                                  count=check_count)
        modality = "image"
    _write(prepared, out, opset)
    worst = check_onnx(out, prepared.module, prepared.batches, prepared.input_names, atol=atol)
    sizes = tuple(len(b[0]) for b in prepared.batches)
    log.info("wrote %s; ONNX Runtime vs torch on %s, batch sizes %s: largest absolute "
             "difference %.3g", out, prepared.checked_on, sizes, worst)
    return OnnxExport(out, modality, worst, prepared.checked_on, sizes,
                      {k: str(v) for k, v in prepared.metadata.items()})
