"""Image-text data for CLIP: a caption folder, image-text shards and ``shapes`` with captions.

Every image-text data set here is an :class:`ImageTextDataset`: items are
``(transform(image), label, {"input_ids": (T,), "attention_mask": (T,)})``, one caption of the
image's several drawn at random (torch's global generator, which the engine seeds per sample from
(seed, epoch, index)) and tokenised to a fixed length T (``tokenizer.max_length``), so that the
default collate stacks a batch. ``extra_keys`` names the per-sample fields beyond image and label.

Sources:

- :func:`caption_folder`: image files under ROOT plus a captions file, as common caption sets
  ship them: a TSV with a header naming the image column (``image``, ``filepath``, ``file``,
  ``filename``) and the caption column (``caption``, ``title``, ``text``) (open_clip's CSV
  layout with ``--csv-separator "\\t"``), or JSONL lines ``{"image": ..., "caption": ...}`` /
  ``{"image": ..., "captions": [...]}``. Several rows (or a list) per image give several
  captions; paths are relative to ROOT.
- :func:`shard_captions`: WebDataset shards with ``.jpg`` + ``.txt`` members
  (:class:`~contrastive.data.shards.ShardDataset` with ``with_text=True``); each non-empty line
  of the ``.txt`` member is one caption.
- :func:`shapes_captions`: the generated ``shapes`` with :func:`~contrastive.data.generated.
  shape_captions` (shape, colour, size and position as drawn; five phrasings per image).

:func:`caption_tokenizer` trains a deterministic WordPiece tokenizer on captions (offline).

``--data`` specs (the engine trains CLIP on them): ``shapes-captions[:n=..,size=..,seed=..,
vocab_size=200,max_length=16]`` and ``captions:ROOT[,captions=FILE,vocab_size=..,max_length=..]``
(training split only), ``wds-captions:DIR[,tokenizer=FOLDER,...]`` (image-text shards), each
with a tokenizer trained on its training captions.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from contrastive.data.base import UNLABELLED
from contrastive.data.io import load_rgb

__all__ = ["EXTRA_KEYS", "ImageTextDataset", "caption_folder", "caption_tokenizer",
           "encode_fixed", "read_captions", "shapes_captions", "shard_captions"]

EXTRA_KEYS = ("input_ids", "attention_mask")
_IMAGE_COLS = ("image", "filepath", "file", "filename", "image_path")
_CAPTION_COLS = ("caption", "title", "text", "sentence")


def encode_fixed(tokenizer: Any, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
    """Token ids and attention mask (B, T) int64, padded with ``[PAD]`` / truncated to
    T = ``tokenizer.max_length`` (a :class:`~contrastive.text.TextTokenizer`)."""
    out = tokenizer(list(texts))
    ids, mask = out["input_ids"], out["attention_mask"]
    t = int(tokenizer.max_length)
    pad = t - ids.shape[1]
    if pad > 0:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), tokenizer.pad_id)], dim=1)
        mask = torch.cat([mask, mask.new_zeros((mask.shape[0], pad))], dim=1)
    return ids[:, :t], mask[:, :t]


def caption_tokenizer(captions: Iterable[str | Sequence[str]], vocab_size: int = 200,
                      max_length: int = 16) -> Any:
    """A WordPiece tokenizer trained on ``captions`` (strings or lists of them), deterministic:
    the same captions always give the same vocabulary and ids (needs the ``text`` extra)."""
    from contrastive.data.tokenizer import train_wordpiece

    def flat() -> Iterable[str]:
        for c in captions:
            yield from ([c] if isinstance(c, str) else c)

    return train_wordpiece(flat(), vocab_size=vocab_size, max_length=max_length)


class ImageTextDataset(Dataset):
    """Images with one or more captions each; items ``(image, label, tokens)``.

    Args:
        images: a map-style data set of ``(transformed image, label)`` items, or of
            ``(image, label, captions)`` items (shards read with their text).
        captions: per image a list of captions (or one string), or a function index -> list;
            None when ``images`` items carry them.
        tokenizer: a :class:`~contrastive.text.TextTokenizer` (fixed length ``max_length``).
    """

    extra_keys = EXTRA_KEYS

    def __init__(self, images: Any, captions: Sequence[Sequence[str] | str] |
                 Callable[[int], Sequence[str]] | None, tokenizer: Any) -> None:
        if captions is not None and not callable(captions) and len(captions) != len(images):
            raise ValueError(f"ImageTextDataset: {len(captions)} caption lists for {len(images)} "
                             "images; give one list per image")
        self.images, self.captions, self.tokenizer = images, captions, tokenizer
        self.targets = list(getattr(images, "targets", [UNLABELLED] * len(images)))
        self.classes = list(getattr(images, "classes", []))
        self.num_classes = getattr(images, "num_classes", None)

    def __len__(self) -> int:
        return len(self.images)

    def captions_of(self, index: int) -> list[str]:
        """All captions of image ``index`` (without reading the image when they are known)."""
        if self.captions is None:
            read = getattr(self.images, "captions", None)
            return _as_list(read(index) if callable(read) else self.images[index][2], index)
        caps = self.captions(index) if callable(self.captions) else self.captions[index]
        return _as_list(caps, index)

    def __getitem__(self, index: int) -> tuple[Any, int, dict[str, Tensor]]:
        item = self.images[index]
        caps = _as_list(item[2], index) if self.captions is None else self.captions_of(index)
        pick = int(torch.randint(len(caps), ())) if len(caps) > 1 else 0
        ids, mask = encode_fixed(self.tokenizer, [caps[pick]])
        return item[0], item[1], {"input_ids": ids[0], "attention_mask": mask[0]}

    def __repr__(self) -> str:
        return f"ImageTextDataset({self.images!r}, {len(self)} images)"


def _as_list(caps: Sequence[str] | str, index: int) -> list[str]:
    out = [caps] if isinstance(caps, str) else [c for c in caps if c.strip()]
    if not out:
        raise ValueError(f"image {index} has no caption; every image needs at least one")
    return list(out)


# ---- a folder with a captions file --------------------------------------------------------------

def read_captions(path: str | os.PathLike) -> dict[str, list[str]]:
    """Image path (as written in the file) -> its captions, in file order (module docstring)."""
    path = Path(path)
    out: dict[str, list[str]] = {}

    def add(image: Any, caps: Any, where: str) -> None:
        if not isinstance(image, str) or not image.strip():
            raise ValueError(f"{where}: no image path")
        caps = [caps] if isinstance(caps, str) else caps
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise ValueError(f"{where}: the caption must be a string or a list of strings")
        out.setdefault(image.strip(), []).extend(c.strip() for c in caps if c.strip())

    if path.suffix.lower() in (".jsonl", ".json"):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON object per line ({e})") from None
            key = next((k for k in _IMAGE_COLS if k in row), None)
            caps = row.get("captions", next((row[k] for k in _CAPTION_COLS if k in row), None))
            if key is None or caps is None:
                raise ValueError(f"{path}:{n}: a line needs an image key ({'/'.join(_IMAGE_COLS)})"
                                 f" and 'caption' or 'captions'; got keys {sorted(row)}")
            add(row[key], caps, f"{path}:{n}")
    else:
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        header = [h.strip().lower() for h in rows[0]] if rows else []
        img_col = next((header.index(k) for k in _IMAGE_COLS if k in header), None)
        cap_col = next((header.index(k) for k in _CAPTION_COLS if k in header), None)
        if img_col is None or cap_col is None:
            raise ValueError(f"{path}: the first line must be a tab-separated header naming the "
                             f"image column ({'/'.join(_IMAGE_COLS)}) and the caption column "
                             f"({'/'.join(_CAPTION_COLS)}); got {rows[0] if rows else 'nothing'}")
        for n, row in enumerate(rows[1:], 2):
            if not any(c.strip() for c in row):
                continue
            if len(row) <= max(img_col, cap_col):
                raise ValueError(f"{path}:{n}: {len(row)} tab-separated fields, the header has "
                                 f"{len(header)}")
            add(row[img_col], row[cap_col], f"{path}:{n}")
    if not out:
        raise ValueError(f"{path}: no captions")
    return out


class _CaptionImages(Dataset):
    def __init__(self, root: Path, names: list[str], transform: Callable | None) -> None:
        self.root, self.names, self.transform = root, names, transform
        self.targets = [UNLABELLED] * len(names)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = load_rgb(self.root / self.names[index])
        return (self.transform(img) if self.transform else img), UNLABELLED


def caption_folder(root: str | os.PathLike, tokenizer: Any, captions: str | os.PathLike |
                   None = None, transform: Callable | None = None) -> ImageTextDataset:
    """Images under ``root`` with the captions of ``captions`` (default: the one
    ``captions.tsv`` / ``captions.jsonl`` in ``root``); images in the file's order."""
    root = Path(root)
    if captions is None:
        captions = _find_captions(root)
    table = read_captions(captions)
    missing = [n for n in table if not (root / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} image(s) of {captions} are not under {root}; "
                                f"first: {missing[0]}")
    names = list(table)
    return ImageTextDataset(_CaptionImages(root, names, transform),
                            [table[n] for n in names], tokenizer)


def shard_captions(shards: Sequence[str | os.PathLike], tokenizer: Any,
                   transform: Callable | None = None, **kwargs: Any) -> ImageTextDataset:
    """Image-text WebDataset shards (``.jpg`` + ``.txt``); ``kwargs`` go to ``ShardDataset``."""
    from contrastive.data.shards import ShardDataset

    ds = ShardDataset(shards, transform, with_text=True, **kwargs)
    return ImageTextDataset(ds, None, tokenizer)  # items carry the text of the image they hold


def shapes_captions(tokenizer: Any, n: int = 5000, size: int = 32, seed: int = 0,
                    split: str = "train", clutter: int = 0,
                    transform: Callable | None = None) -> ImageTextDataset:
    """``shapes`` (:class:`~contrastive.data.generated.ShapesDataset`, the same images) with
    five generated captions per image."""
    from contrastive.data.generated import ShapesDataset, shape_captions

    images = ShapesDataset(n, size, seed, split, clutter, transform=transform)
    return ImageTextDataset(images, shape_captions(n, seed, split), tokenizer)


# ---- --data specs (training with the engine) -----------------------------------------------------

def _register_specs() -> None:
    from contrastive.data.generated import shape_captions
    from contrastive.data.spec import _generated_n, _no_root, register_dataset

    @register_dataset("shapes-captions", keys=("n", "n_test", "size", "seed", "clutter",
                                               "vocab_size", "max_length"))
    def _shapes_captions(root: Any, split: str, transform: Any, strict: bool, n: int = 5000,
                         n_test: int | None = None, size: int = 32, seed: int = 0,
                         clutter: int = 0, vocab_size: int = 200,
                         max_length: int = 16) -> ImageTextDataset:
        """``shapes`` with five generated captions per image; the WordPiece tokenizer is trained
        on the training split's captions (the same for both splits, deterministic)."""
        _no_root("shapes-captions", root)
        tok = caption_tokenizer(shape_captions(int(n), int(seed), "train"), int(vocab_size),
                                int(max_length))
        return shapes_captions(tok, _generated_n(split, n, n_test), int(size), int(seed), split,
                               int(clutter), transform)

    @register_dataset("captions", keys=("captions", "vocab_size", "max_length"),
                      splits=("train",))
    def _caption_folder(root: Any, split: str, transform: Any, strict: bool,
                        captions: str | None = None, vocab_size: int = 1000,
                        max_length: int = 32) -> ImageTextDataset:
        """Images under ROOT with a captions.tsv / captions.jsonl (a tokenizer trained on it)."""
        if root is None:
            raise ValueError("data spec captions needs a folder: captions:/path/to/images")
        table = read_captions(captions or _find_captions(Path(root)))
        tok = caption_tokenizer(table.values(), int(vocab_size), int(max_length))
        return caption_folder(root, tok, captions, transform)


    from contrastive.data.spec import _wds_splits

    @register_dataset("wds-captions", keys=("decode", "vocab_size", "max_length", "tokenizer"),
                      splits=_wds_splits)
    def _wds_captions(root: Any, split: str, transform: Any, strict: bool, decode: str = "auto",
                      vocab_size: int = 1000, max_length: int = 32,
                      tokenizer: str | None = None) -> ImageTextDataset:
        """Image-text shards (.jpg + .txt); the tokenizer is trained on the training shards'
        captions (every .txt is read once) or read from ``tokenizer=FOLDER`` (tokenizer.json)."""
        from contrastive.data.shard_index import resolve_shards
        from contrastive.data.shards import ShardDataset

        found = resolve_shards(str(root), split) if root is not None else None
        if found is None:
            raise ValueError(f"no {split!r} shards for wds-captions:{root}")
        ds = ShardDataset(found[0], transform, classes=found[1], strict=strict,
                          decode=str(decode), with_text=True)
        if tokenizer is not None:
            from contrastive.data.tokenizer import load_tokenizer

            tok = load_tokenizer(str(tokenizer), max_length=int(max_length))
        else:
            train = ds if split == "train" else ShardDataset(
                resolve_shards(str(root), "train")[0], with_text=True)  # type: ignore[index]
            tok = caption_tokenizer((train.captions(i) for i in range(len(train))),
                                    int(vocab_size), int(max_length))
        return ImageTextDataset(ds, None, tok)


def _find_captions(root: Path) -> Path:
    found = [root / n for n in ("captions.tsv", "captions.jsonl") if (root / n).is_file()]
    if len(found) != 1:
        raise FileNotFoundError(f"{root}: expected one captions.tsv or captions.jsonl "
                                f"(found {len(found)}); pass the captions file")
    return found[0]


_register_specs()
