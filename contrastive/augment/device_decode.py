"""JPEG decoding on the training device (``--decode device``): the workers only read the bytes.

The batched path (:meth:`Pipeline.split`) normally decodes and crops in the loader workers
(:class:`~contrastive.augment.batched.WorkerCrops`). With ``split(decode="device")``:

- the worker half :class:`EncodedCrops` reads the JPEG header, draws every view's crop box on
  the original size (the same draws, in the same order, as ``WorkerCrops``) and returns a
  :class:`DeviceDecodeItem` holding the bytes and the boxes;
- :func:`collate` (the engine loader's ``collate_fn``) packs a batch of them into one
  :class:`DeviceDecodeBatch` (one flat byte buffer: one pin, one copy);
- :func:`decode_and_crop` (training process) decodes the whole batch in ONE
  ``torchvision.io.decode_jpeg(list, device=...)`` call (nvJPEG on CUDA; libjpeg-turbo on the
  CPU) and crops + resizes every box with one ``roi_align`` per view, giving the uint8 views
  (B, 3, S_v, S_v) that the device half of the pipeline augments as usual.

Images the device decoder must not see take the worker path (decoded and cropped there exactly
as ``WorkerCrops`` does) and travel as ready crops: anything but a complete baseline-readable
JPEG, a JPEG with an Exif segment (nvJPEG ignores the orientation tag), a CMYK / YCCK JPEG, and
images a data set hands decoded (PIL images, tensors).

Resampling: ``roi_align`` (aligned, adaptive sampling) averages ceil(box / S)^2 bilinear samples
per output pixel: a box filter when shrinking where the workers use an antialiased triangle
filter, so the views differ slightly (tests/augment/test_device_decode.py measures it); an
output that needs no resize reproduces the decoded pixels exactly.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import default_collate

from contrastive.augment.batched import WorkerCrops
from contrastive.augment.config import ViewConfig
from contrastive.augment.per_image import ImageLike, RandomResizedCropUint8
from contrastive.data.decode import EncodedImage, jpeg_info
from contrastive.data.io import CorruptImageError

__all__ = ["EncodedCrops", "DeviceDecodeItem", "DeviceDecodeBatch", "collate", "decode_and_crop"]

logger = logging.getLogger(__name__)

#: float32 bytes of the padded images one ``roi_align`` call reads, per device type: bounds the
#: memory of a batch of large images (256 ImageNet images of ~500 x 400 px are ~0.8 GB).
CHUNK_BYTES = {"cpu": 256 << 20}
_DEFAULT_CHUNK_BYTES = 1 << 30


@dataclass
class DeviceDecodeItem:
    """One sample of the device-decode path: the JPEG's bytes and its views' boxes, or the
    views already cropped in the worker (``crops``) when it cannot be decoded on the device.

    ``data``: 1-D uint8 tensor (the file's bytes); ``boxes``: int64 (V, 4) of (top, left, h, w)
    on the full-size image; ``size``: (H, W); ``crops``: V uint8 (3, S_v, S_v) tensors.
    """

    data: Tensor | None = None
    boxes: Tensor | None = None
    size: tuple[int, int] = (0, 0)
    name: str = ""
    crops: list[Tensor] | None = None


class EncodedCrops:
    """The worker half of ``Pipeline.split(decode="device")``: image -> :class:`DeviceDecodeItem`.

    Every view must be a random resized crop (centre crops need the decoded size to resize the
    shorter side; they have no reason to run on the device). Raises ``ValueError`` otherwise.
    """

    accepts_encoded = True  # takes contrastive.data.decode.EncodedImage
    wants_encoded = True  # data sets hand the bytes (no decode, full-size mode) when they can

    def __init__(self, views: Sequence[ViewConfig]) -> None:
        self.worker = WorkerCrops(views)  # the fallback, and the crops whose boxes we draw
        self.views = self.worker.views
        for i, crop in enumerate(self.worker.crops):
            if not isinstance(crop, RandomResizedCropUint8):
                raise ValueError(f"--decode device needs random-resized-crop views; view {i} is "
                                 f"{crop!r}: use --decode worker")
        self.crops = [c for c in self.worker.crops if isinstance(c, RandomResizedCropUint8)]

    def __call__(self, img: ImageLike) -> DeviceDecodeItem:
        if not (isinstance(img, EncodedImage) and device_decodable(img.data)):
            return DeviceDecodeItem(crops=self.worker(img))
        h, w = img.size
        boxes = torch.tensor([c.sample_box(h, w) for c in self.crops], dtype=torch.int64)
        data = torch.frombuffer(bytearray(img.data), dtype=torch.uint8)
        return DeviceDecodeItem(data=data, boxes=boxes, size=(h, w), name=img.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.crops!r})"


def device_decodable(data: bytes) -> bool:
    """Whether the device decoder may take these bytes: a complete (end-marked) JPEG, gray or
    3-component, without an Exif segment (nvJPEG would ignore its orientation)."""
    info = jpeg_info(data)
    return (info is not None and not info[2] and info[3] in (1, 3)
            and data.rstrip(b"\x00").endswith(b"\xff\xd9"))


class DeviceDecodeBatch:
    """A collated batch of :class:`DeviceDecodeItem`: the encoded samples' bytes in one flat
    buffer, their boxes (N, V, 4) and sizes; the worker-cropped samples' views stacked per view.

    ``encoded`` / ``cropped``: int64 positions in the batch of either kind.
    """

    def __init__(self, items: Sequence[DeviceDecodeItem]) -> None:
        enc: list[int] = []
        fb: list[int] = []
        data: list[Tensor] = []
        boxes: list[Tensor] = []
        crops: list[list[Tensor]] = []
        self.sizes: list[tuple[int, int]] = []
        self.names: list[str] = []
        for i, it in enumerate(items):
            if it.data is not None and it.boxes is not None:
                enc.append(i)
                data.append(it.data)
                boxes.append(it.boxes)
                self.sizes.append(it.size)
                self.names.append(it.name)
            elif it.crops is not None:
                fb.append(i)
                crops.append(it.crops)
            else:
                raise ValueError(f"sample {i} of the batch has neither bytes and boxes nor crops")
        self.batch_size = len(items)
        self.encoded = torch.tensor(enc, dtype=torch.int64)
        self.cropped = torch.tensor(fb, dtype=torch.int64)
        self.offsets = [0]
        for d in data:
            self.offsets.append(self.offsets[-1] + d.numel())
        self.data = torch.cat(data) if data else torch.empty(0, dtype=torch.uint8)
        self.boxes = torch.stack(boxes) if boxes else torch.empty(0, 0, 4, dtype=torch.int64)
        self.crops = [torch.stack(v) for v in zip(*crops)]  # per view (N_cropped, 3, S, S)

    def __len__(self) -> int:
        return self.batch_size

    def pin_memory(self) -> DeviceDecodeBatch:
        """Pin the byte buffer and the crops (DataLoader's ``pin_memory`` calls this)."""
        self.data = self.data.pin_memory()
        self.crops = [c.pin_memory() for c in self.crops]
        return self

    def chunk(self, k: int) -> Tensor:
        """The bytes of encoded sample ``k`` (a view of the flat buffer)."""
        return self.data[self.offsets[k]:self.offsets[k + 1]]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.batch_size} samples, {len(self.encoded)} encoded "
                f"({self.data.numel()} bytes), {len(self.cropped)} cropped in the workers)")


def collate(batch: list[Any]) -> Any:
    """The engine loader's ``collate_fn``: items whose views are a :class:`DeviceDecodeItem`
    give ``[DeviceDecodeBatch, *default_collate(the other fields)]``; any other batch is
    ``default_collate(batch)`` (no change)."""
    if not batch or not isinstance(batch[0], (tuple, list)) or not batch[0] or \
            not isinstance(batch[0][0], DeviceDecodeItem):
        return default_collate(batch)
    rest = default_collate([tuple(item[1:]) for item in batch])
    return [DeviceDecodeBatch([item[0] for item in batch]), *rest]


def _decode_all(batch: DeviceDecodeBatch, device: torch.device) -> list[Tensor]:
    """Every encoded sample decoded to uint8 (3, H, W) on ``device``: one batched call; if it
    fails, one call per image, and the CPU for those the device decoder still refuses.

    On CUDA the decoder runs with a side stream current (:func:`_side_stream`): torchvision's
    CUDA ``decode_jpeg`` allocates its outputs on the current stream and writes them from its
    own stream without waiting for the current one, so with the previous step's kernels still
    queued it can overwrite memory they have yet to read (NaN losses seen on an H200;
    pytorch/vision PR #9606, meta-pytorch/torchcodec PR #1634). Outputs allocated on a side
    stream never reuse the training stream's freed blocks."""
    data = [batch.chunk(k) for k in range(len(batch.encoded))]
    if not data:
        return []
    if device.type != "cuda":
        return _decode_list(batch, data, device)
    main, side = torch.cuda.current_stream(device), _side_stream(device)
    side.wait_stream(main)  # ordering only: no host wait
    with torch.cuda.stream(side):
        out = _decode_list(batch, data, device)
    main.wait_stream(side)
    for t in out:
        t.record_stream(main)  # not recycled on the side stream while the step still reads it
    return out


_SIDE_STREAMS: dict[torch.device, Any] = {}


def _side_stream(device: torch.device) -> Any:
    """One CUDA stream per device for the decoder (:func:`_decode_all`)."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def _decode_list(batch: DeviceDecodeBatch, data: list[Tensor], device: torch.device) -> list[Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():  # torchvision 0.29 deprecates its decoders (for TorchCodec)
        warnings.simplefilter("ignore")
        try:
            out = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            if all(_fits(t, s) for t, s in zip(out, batch.sizes)):
                return out
        except (RuntimeError, ValueError) as e:
            logger.debug("batched decode_jpeg on %s failed (%s): decoding one by one", device, e)
        return [_decode_one(d, s, n, device) for d, s, n in zip(data, batch.sizes, batch.names)]


def _fits(t: Tensor, size: tuple[int, int]) -> bool:
    return t.ndim == 3 and t.shape[0] == 3 and tuple(t.shape[1:]) == tuple(size)


def _decode_one(data: Tensor, size: tuple[int, int], name: str, device: torch.device) -> Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg

    if device.type != "cpu":
        try:
            out = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            if _fits(out, size):
                return out
        except (RuntimeError, ValueError):
            pass
    logger.debug("decoding %s on the CPU: the %s decoder cannot read it", name, device.type)
    try:
        return EncodedImage(data.numpy().tobytes(), name, reduced=False).full().to(device)
    except CorruptImageError as e:
        raise CorruptImageError(
            f"{e} (decoded on the training device, --decode device, where an unreadable image "
            "cannot be skipped: --strict-data finds such files before training, --decode "
            "worker skips them)") from e


def _chunks(sizes: Sequence[tuple[int, int]], limit: int) -> list[list[int]]:
    """Encoded samples grouped (smallest first, so that little is padding) into chunks whose
    padded float32 copy stays under ``limit`` bytes (at least one image per chunk)."""
    order = sorted(range(len(sizes)), key=lambda k: sizes[k][0] * sizes[k][1])
    chunks: list[list[int]] = []
    cur: list[int] = []
    hmax = wmax = 0
    for k in order:
        h, w = max(hmax, sizes[k][0] + 1), max(wmax, sizes[k][1] + 1)
        if cur and (len(cur) + 1) * h * w * 3 * 4 > limit:
            chunks.append(cur)
            cur, h, w = [], sizes[k][0] + 1, sizes[k][1] + 1
        cur.append(k)
        hmax, wmax = h, w
    if cur:
        chunks.append(cur)
    return chunks


def _padded(images: Sequence[Tensor]) -> Tensor:
    """float32 (n, 3, Hmax + 1, Wmax + 1): each image top-left, its last row and column
    repeated once beyond it, so that roi_align's bilinear samples near an image's bottom or
    right edge (up to half a pixel beyond) read the edge, as they do at the padded tensor's."""
    hmax = max(t.shape[1] for t in images) + 1
    wmax = max(t.shape[2] for t in images) + 1
    out = images[0].new_zeros((len(images), 3, hmax, wmax), dtype=torch.float32)
    for i, t in enumerate(images):
        h, w = t.shape[1:]
        out[i, :, :h, :w] = t
        out[i, :, h, :w] = t[:, h - 1]
        out[i, :, :h + 1, w] = out[i, :, :h + 1, w - 1]
    return out


def decode_and_crop(batch: DeviceDecodeBatch, sizes: Sequence[int],
                    device: torch.device | str) -> list[Tensor]:
    """The views of a :class:`DeviceDecodeBatch` on ``device``: per view a uint8
    (B, 3, S_v, S_v) tensor in sample order (``sizes``: S_v per view).

    Encoded samples are decoded in one batched call, then every view's boxes are cropped and
    resized by one ``torchvision.ops.roi_align`` per chunk of images (:data:`CHUNK_BYTES`);
    worker-cropped samples are copied into their places.
    """
    from torchvision.ops import roi_align

    device = torch.device(device)
    n = len(batch)
    views = [torch.empty((n, 3, s, s), dtype=torch.uint8, device=device) for s in sizes]
    if len(batch.cropped):
        if len(batch.crops) != len(sizes):
            raise ValueError(f"the batch has {len(batch.crops)} worker-cropped views, the "
                             f"pipeline {len(sizes)}")
        slots = batch.cropped.to(device)
        for view, crops in zip(views, batch.crops):
            view.index_copy_(0, slots, crops.to(device, non_blocking=True))
    if not len(batch.encoded):
        return views
    if batch.boxes.shape[1] != len(sizes):
        raise ValueError(f"the batch has {batch.boxes.shape[1]} crop boxes per image, the "
                         f"pipeline {len(sizes)} views")
    images = _decode_all(batch, device)
    limit = CHUNK_BYTES.get(device.type, _DEFAULT_CHUNK_BYTES)
    boxes = batch.boxes.to(device=device, dtype=torch.float32)  # (N, V, 4): top, left, h, w
    for chunk in _chunks(batch.sizes, limit):
        padded = _padded([images[k] for k in chunk])
        idx = torch.tensor(chunk, device=device)
        b = boxes.index_select(0, idx)
        slot = batch.encoded.to(device).index_select(0, idx)
        image = torch.arange(len(chunk), device=device, dtype=torch.float32)  # in ``padded``
        for v, (out, size) in enumerate(zip(views, sizes)):
            top, left, h, w = b[:, v].unbind(1)
            rois = torch.stack([image, left, top, left + w, top + h], dim=1)  # (K, 5): x1 y1 x2 y2
            crop = roi_align(padded, rois, output_size=size, spatial_scale=1.0,
                             sampling_ratio=-1, aligned=True)
            out.index_copy_(0, slot, crop.round_().clamp_(0, 255).to(torch.uint8))
    return views
