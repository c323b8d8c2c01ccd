"""Encoded images decoded lazily: libjpeg-turbo through torchvision, reduced-scale (DCT) decoding
where the crop allows it, and a faster uint8 crop + resize.

A data set that keeps the encoded bytes (the shards of :mod:`contrastive.data.shards`) hands an
:class:`EncodedImage` to the pipelines of :mod:`contrastive.augment`, which sample the random
crop box on the image's ORIGINAL size first (from the header, nothing decoded), exactly as they
do for a decoded image, and only then decode:

- at full size with libjpeg-turbo for JPEGs: ``simplejpeg`` where installed (the ``shards``
  extra; the fastest binding measured, ``benchmarks/results/decode.md``), else
  ``torchvision.io.decode_jpeg``; both give the same pixels as PIL's decoder, itself
  libjpeg-turbo (tests/data/test_decode.py checks it bit for bit). PIL decodes every other
  format, a JPEG without its end marker (PIL decides whether it is truncated), a CMYK JPEG, and
  whatever the others cannot read;
- or, when ``reduced=True`` and the sampled box allows it, at the largest scale 1/2, 1/4 or 1/8
  whose copy of the box is still at least the output size in both axes (libjpeg-turbo's scaled
  inverse DCT, exact DCT and upsampling; through simplejpeg, else PIL's ``draft``). The box is mapped to the
  smaller image (its corners rounded to the nearest pixel: at most half a reduced pixel, d / 2
  original pixels at scale 1/d, off), so the crop keeps its place and the resize still shrinks.
  The pixels then differ from the full decode by a resampling error (PSNR in
  ``benchmarks/results/decode.md``); the crop boxes and their distribution do not change.

Decoding never runs anything but an image decoder on the bytes: no pickle, no ``torch.load``.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

from contrastive.data.io import CorruptImageError, to_rgb

__all__ = ["EncodedImage", "fast_resized_crop", "reduced_scale", "map_box", "jpeg_header", "jpeg_info"]

_ORIENTATION = 0x0112
_SCALES = (8, 4, 2)
_PIL_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def fast_resized_crop(img: Tensor, top: int, left: int, h: int, w: int, size: int) -> Tensor:
    """Crop (top, left, h, w) of a uint8 (3, H, W) tensor and resize it to (size, size), bilinear,
    antialiased -> contiguous uint8 (3, size, size).

    The same pixels as ``torchvision.transforms.v2.functional.resized_crop`` (the same torch
    kernel), about 1.5x faster: the crop is copied once into channels-last memory, the layout
    torch's vectorised uint8 resampling kernel reads directly.
    """
    return resize_uint8(img[:, top:top + h, left:left + w], size, size)


def resize_uint8(img: Tensor, height: int, width: int) -> Tensor:
    """A uint8 (3, H, W) tensor resized to (height, width), bilinear, antialiased -> contiguous
    uint8: torch's uint8 resampling kernel on channels-last memory (what torchvision's ``resize``
    runs on AVX2, AVX-512 and ARM CPUs); the image itself when the size is already right."""
    if tuple(img.shape[-2:]) == (height, width):
        return img.contiguous()
    crop = img.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    out = F.interpolate(crop, size=(height, width), mode="bilinear", align_corners=False,
                        antialias=True)
    return out[0].contiguous()


def map_box(top: int, left: int, h: int, w: int, src: tuple[int, int],
            dst: tuple[int, int]) -> tuple[int, int, int, int]:
    """The box (top, left, h, w) on an image of size ``src`` (H, W) mapped to one of size ``dst``:
    corners scaled and rounded to the nearest pixel, at least one pixel wide."""
    sy, sx = dst[0] / src[0], dst[1] / src[1]
    t, b = round(top * sy), round((top + h) * sy)
    lft, r = round(left * sx), round((left + w) * sx)
    t, lft = min(t, dst[0] - 1), min(lft, dst[1] - 1)
    return t, lft, max(1, min(b, dst[0]) - t), max(1, min(r, dst[1]) - lft)


def reduced_scale(h: int, w: int, box_h: int, box_w: int, size: int) -> int:
    """The largest d in (8, 4, 2) at which an (h, w) image's box (box_h, box_w) still covers at
    least ``size`` pixels in both axes after :func:`map_box` (``box / d >= size + 1``: rounding the
    corners loses less than one pixel); 1 when no reduced scale does."""
    for d in _SCALES:
        if box_h >= d * (size + 1) and box_w >= d * (size + 1) and h >= d and w >= d:
            return d
    return 1


def _simplejpeg():
    """The ``simplejpeg`` module (libjpeg-turbo, the ``shards`` extra) or None when absent."""
    global _SJ
    if _SJ is None:
        try:
            import simplejpeg
        except ImportError:  # the torchvision / PIL decoders serve instead
            simplejpeg = False
        _SJ = simplejpeg
    return _SJ or None


_SJ = None


def jpeg_header(data: bytes) -> tuple[int, int, bool] | None:
    """(height, width, has an Exif segment) from a JPEG's markers (no decoding), or None when
    ``data`` is not a JPEG this simple scan understands (PIL then reads the header)."""
    info = jpeg_info(data)
    return None if info is None else info[:3]


def jpeg_info(data: bytes) -> tuple[int, int, bool, int] | None:
    """:func:`jpeg_header` and the number of colour components of the frame (1 gray, 3 YCbCr
    or RGB, 4 CMYK / YCCK), or None when the scan does not understand ``data``."""
    if data[:2] != b"\xff\xd8":
        return None
    i, n, exif = 2, len(data), False
    sof: tuple[int, int, int] | None = None  # height, width, components
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # no length
            i += 2
            continue
        if marker == 0xDA:  # start of scan: the header is over
            return (sof[0], sof[1], exif, sof[2]) if sof else None
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if length < 2:
            return None
        if marker == 0xE1 and data[i + 4:i + 10] == b"Exif\x00\x00":
            exif = True
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and i + 10 <= n:
            sof = (int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big"),
                   data[i + 9])
            if not all(sof[:2]):
                return None
        i += 2 + length
    return None


class EncodedImage:
    """The encoded bytes of one image, decoded when a crop asks (module docstring).

    ``size``: (H, W) after the EXIF orientation, read from the header (raises
    :class:`~contrastive.data.io.CorruptImageError` naming ``name`` when it cannot be parsed).
    ``reduced``: allow reduced-scale (DCT) decoding of JPEGs (:meth:`resized_crop`).
    ``fast``: opt-in, libjpeg-turbo's fast integer inverse DCT and plain (not "fancy") chroma
    upsampling through simplejpeg: less exact (about 34 dB PSNR against the exact decode on
    photo-like JPEGs, ``benchmarks/results/decode.md``), a few per cent faster.
    Decodes are cached per scale: the views of one image share them.
    """

    __slots__ = ("data", "name", "reduced", "fast", "_size", "_format", "_oriented", "_cache")

    def __init__(self, data: bytes, name: str, *, reduced: bool = True, fast: bool = False) -> None:
        self.data = bytes(data)
        self.name = name
        self.reduced = bool(reduced)
        self.fast = bool(fast)
        self._cache: dict[int, Tensor] = {}
        header = jpeg_header(self.data)
        if header is not None and not header[2]:  # a JPEG without EXIF: no orientation
            self._format, self._oriented, self._size = "JPEG", False, header[:2]
            return
        try:
            with Image.open(io.BytesIO(self.data)) as im:
                self._format = im.format
                w, h = im.size
                orientation = im.getexif().get(_ORIENTATION, 1)
        except _PIL_ERRORS as e:
            raise self._error(e) from e
        self._oriented = orientation != 1
        self._size = (w, h) if orientation in (5, 6, 7, 8) else (h, w)

    def _error(self, e: BaseException) -> CorruptImageError:
        return CorruptImageError(f"cannot read image {self.name}: {type(e).__name__}: {e}")

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of the decoded image (EXIF orientation applied)."""
        return self._size

    @property
    def is_jpeg(self) -> bool:
        return self._format == "JPEG"

    # ---- decoding ----------------------------------------------------------------------------

    def _pil(self, denom: int = 1) -> Tensor:
        try:
            with Image.open(io.BytesIO(self.data)) as im:
                if denom > 1:
                    w, h = im.size
                    im.draft("RGB", (max(1, w // denom), max(1, h // denom)))
                im.load()
                if self._oriented:
                    im = ImageOps.exif_transpose(im)
                arr = np.array(to_rgb(im))
        except _PIL_ERRORS as e:
            raise self._error(e) from e
        return torch.from_numpy(arr).permute(2, 0, 1)

    def _complete_jpeg(self) -> bool:
        # without its end marker PIL decides whether a JPEG is truncated (libjpeg would pad it)
        return self.is_jpeg and self.data.rstrip(b"\x00").endswith(b"\xff\xd9")

    def _simple(self, denom: int) -> Tensor | None:
        """Decode with simplejpeg at 1/``denom``; None when it is absent or not the right tool."""
        sj = _simplejpeg()
        if sj is None or self._oriented or not self._complete_jpeg():
            return None
        h, w = self._size
        want = (-(-h // denom), -(-w // denom))
        try:
            arr = sj.decode_jpeg(self.data, colorspace="RGB", min_height=want[0], min_width=want[1],
                                 min_factor=float(denom), strict=True, fastdct=self.fast,
                                 fastupsample=self.fast)
        except (ValueError, RuntimeError):
            return None  # e.g. CMYK: torchvision / PIL convert it
        if arr.ndim != 3 or arr.shape[:2] != want:
            return None
        return torch.from_numpy(arr).permute(2, 0, 1)

    def _turbo(self) -> Tensor | None:
        """Full-size decode with torchvision's libjpeg-turbo; None when it is not the right tool."""
        if not self._complete_jpeg():
            return None
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = decode_jpeg(torch.frombuffer(bytearray(self.data), dtype=torch.uint8),
                                  mode=ImageReadMode.RGB, apply_exif_orientation=True)
        except (RuntimeError, ValueError):
            return None
        if out.ndim != 3 or out.shape[0] != 3 or tuple(out.shape[1:]) != self._size:
            return None
        return out

    def decode(self, denom: int = 1) -> Tensor:
        """uint8 (3, H', W') at scale 1/``denom`` (1, 2, 4, 8; >1 for JPEGs only), cached."""
        if denom not in self._cache:
            out = self._simple(denom)
            if out is None and denom == 1:
                out = self._turbo()
            self._cache[denom] = out if out is not None else self._pil(denom)
        return self._cache[denom]

    def full(self) -> Tensor:
        """The full-size decode, uint8 (3, H, W) (channels-last memory for JPEGs)."""
        return self.decode(1)

    def scale_for(self, h: int, w: int, size: int) -> int:
        """Decode scale 1/d for a (h, w) box resized to ``size`` (1 unless reduced decoding applies)."""
        if not (self.reduced and self.is_jpeg and not self._oriented):
            return 1
        return reduced_scale(self._size[0], self._size[1], h, w, size)

    def prepare(self, denom: int) -> None:
        """Decode at 1/``denom`` now (the batched path: one decode fine enough for every view)."""
        self.decode(denom)

    def resized_crop(self, top: int, left: int, h: int, w: int, size: int) -> Tensor:
        """The box (top, left, h, w) of the full-size image resized to (size, size) -> uint8 CHW.

        Uses the coarsest decode already made that is fine enough for this box, else decodes at
        :meth:`scale_for` (full size when reduced decoding is off or does not apply).
        """
        need = self.scale_for(h, w, size)
        usable = [d for d in self._cache if d <= need]
        denom = max(usable) if usable else need
        img = self.decode(denom)
        if denom != 1 or tuple(img.shape[1:]) != self._size:
            top, left, h, w = map_box(top, left, h, w, self._size, (img.shape[1], img.shape[2]))
        return fast_resized_crop(img, top, left, h, w, size)

    def __repr__(self) -> str:
        return f"EncodedImage({self.name!r}, {self._format}, size={self._size}, {len(self.data)} bytes)"
