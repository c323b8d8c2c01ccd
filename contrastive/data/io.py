"""Image files -> RGB PIL images, whatever their mode or orientation; a fast check for unreadable
files; an image as a uint8 (3, H, W) tensor."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm", ".jfif"}
)


_ORIENTATION = 0x0112  # EXIF tag


class CorruptImageError(OSError):
    """An image file that cannot be decoded; the message names the file."""


def is_image_file(path: str | os.PathLike) -> bool:
    """True for a name with a known image extension (case-insensitive); other files are ignored."""
    return os.path.splitext(str(path))[1].lower() in IMAGE_EXTENSIONS


def to_rgb(img: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Convert any PIL image to 8-bit RGB.

    - "RGB": returned as is.
    - grayscale "1", "L": replicated to three channels; 16/32-bit integer "I;16*", "I": scaled to
      8 bits (values >> 8 when the maximum exceeds 255); float "F": clipped to [0, 255].
    - transparency ("RGBA", "LA", "PA", "La", "RGBa", or "P"/"L"/"RGB" with a transparency key):
      alpha-composited over ``background`` (white by default), so transparent pixels do not
      turn into whatever colour the encoder left under them.
    - "P" (palette), "CMYK", "YCbCr", "HSV", "LAB": PIL's conversion to RGB.
    """
    mode = img.mode
    if mode == "RGB" and "transparency" not in img.info:
        return img
    if mode.startswith("I;16") or mode in ("I", "F"):
        arr = np.asarray(img)
        if mode == "F":
            arr = np.clip(arr, 0, 255)
        elif arr.size and arr.max() > 255:
            arr = arr.astype(np.int64) >> 8
        arr = np.clip(arr, 0, 255).astype(np.uint8)
        return Image.fromarray(arr).convert("RGB")
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        canvas.alpha_composite(rgba)
        return canvas.convert("RGB")
    if mode == "1":
        img = img.convert("L")
    return img.convert("RGB")


def load_rgb(path: str | os.PathLike, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Open an image file, apply its EXIF orientation, convert to RGB (:func:`to_rgb`).

    Raises :class:`CorruptImageError` naming the file when it cannot be read or decoded.
    """
    return _open_rgb(path, str(Path(path)), background)


def decode_rgb(data: bytes, name: str, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """:func:`load_rgb` for an encoded image held in memory (a tar member); ``name`` for messages."""
    return _open_rgb(io.BytesIO(data), name, background)


def _open_rgb(source: str | os.PathLike | io.BytesIO, name: str,
              background: tuple[int, int, int]) -> Image.Image:
    try:
        with Image.open(source) as im:
            im.load()
            if im.getexif().get(_ORIENTATION, 1) != 1:
                im = ImageOps.exif_transpose(im)
            return to_rgb(im, background)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise CorruptImageError(f"cannot read image {name}: {type(e).__name__}: {e}") from e


def _ends_with_jpeg_eoi(path: str | os.PathLike) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() < 2:
            return False
        f.seek(-2, os.SEEK_END)
        return f.read(2) == b"\xff\xd9"


def check_image(path: str | os.PathLike) -> str | None:
    """None when ``path`` is readable by :func:`load_rgb`, else the reason (naming the file).

    Fast for good files: PIL parses the header and ``verify()`` checks what it can without
    decoding (PNG: every chunk's CRC, so a truncated PNG is caught), and a JPEG must end with its
    end-of-image marker (a truncated JPEG does not). Only a file failing that is decoded in full,
    and only a failed decode reports it: a file that loads is never reported. A JPEG with a
    complete header and end marker but corrupt data in between passes, and is met when loaded.
    """
    if not _suspect(path, lambda: _ends_with_jpeg_eoi(path)):
        return None
    try:
        load_rgb(path)
    except CorruptImageError as e:
        return str(e)
    return None


def check_image_bytes(data: bytes, name: str) -> str | None:
    """:func:`check_image` for an encoded image in memory (trailing zero bytes after a JPEG's end
    marker allowed): None when :func:`decode_rgb` reads it, else the reason naming ``name``."""
    if not _suspect(io.BytesIO(data), lambda: data.rstrip(b"\x00").endswith(b"\xff\xd9")):
        return None
    try:
        decode_rgb(data, name)
    except CorruptImageError as e:
        return str(e)
    return None


def _suspect(source: str | os.PathLike | io.BytesIO, ends_with_eoi: Callable[[], bool]) -> bool:
    """Whether a full decode must decide: the header or ``verify()`` fails, or a JPEG lacks its
    end-of-image marker."""
    try:
        with Image.open(source) as im:
            fmt = im.format
            im.verify()
        return fmt == "JPEG" and not ends_with_eoi()
    except Exception:  # any parse failure only makes it a suspect; the full decode decides
        return True


def as_uint8_chw(img: object) -> Tensor:
    """A uint8 (3, H, W) tensor of ``img``: a PIL image is converted to RGB and copied once
    (height-width-channel memory, viewed as CHW: no second copy); a tensor is checked."""
    if isinstance(img, Image.Image):
        if img.mode != "RGB":
            img = img.convert("RGB")
        return torch.from_numpy(np.array(img)).permute(2, 0, 1)
    if not isinstance(img, Tensor):
        raise TypeError(f"expected a PIL image or a uint8 CHW tensor; got {type(img).__name__}")
    if img.dtype != torch.uint8 or img.ndim != 3 or img.shape[0] != 3:
        raise ValueError(
            f"expected a uint8 tensor of shape (3, H, W); got dtype {img.dtype}, shape {tuple(img.shape)} "
            "(convert with contrastive.data.to_rgb or torchvision.transforms.v2.functional.pil_to_tensor)"
        )
    return img
