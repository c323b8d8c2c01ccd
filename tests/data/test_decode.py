"""Lazy decoding (contrastive.data.decode): libjpeg-turbo through torchvision gives PIL's pixels,
the faster crop gives torchvision's pixels, the crop boxes stay those of today's path for the
same seed (both augmentation paths), reduced-scale decoding keeps the box and stays close."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from contrastive.augment import get_pipeline
from contrastive.augment import per_image as PI
from contrastive.augment.per_image import as_uint8_chw
from contrastive.data import CorruptImageError, load_rgb
from contrastive.data import decode as D
from contrastive.data.decode import EncodedImage, fast_resized_crop, map_box, reduced_scale


def _photo(w: int, h: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([128 + 100 * np.sin(xx / 17.0), 128 + 100 * np.cos(yy / 23.0), (xx + yy) % 256], -1)
    return np.clip(arr + rng.normal(0, 12, arr.shape), 0, 255).astype(np.uint8)


def _jpeg(w=120, h=90, seed=0, mode="RGB", subsampling=2, exif_orientation=None) -> bytes:
    img = Image.fromarray(_photo(w, h, seed))
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    kw = {}
    if exif_orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kw["exif"] = exif.tobytes()
    img.save(buf, format="JPEG", quality=90, subsampling=subsampling, **kw)
    return buf.getvalue()


CASES = {
    "rgb420": dict(), "rgb444": dict(subsampling=0), "rgb422": dict(subsampling=1),
    "gray": dict(mode="L"), "cmyk": dict(mode="CMYK"), "odd": dict(w=97, h=61),
    "rotated": dict(exif_orientation=6), "mirrored": dict(exif_orientation=2),
}


@pytest.fixture(params=["simplejpeg", "torchvision"])
def decoder(request, monkeypatch):
    """Each full-size JPEG decoder: simplejpeg (the shards extra) or torchvision's."""
    if request.param == "simplejpeg":
        pytest.importorskip("simplejpeg")
    else:
        monkeypatch.setattr(D, "_SJ", False)
    return request.param


@pytest.mark.parametrize("case", sorted(CASES))
def test_full_decode_equals_pil(case, decoder, tmp_path):
    data = _jpeg(**CASES[case])
    path = tmp_path / "x.jpg"
    path.write_bytes(data)
    enc = EncodedImage(data, "x.jpg")
    ref = as_uint8_chw(load_rgb(path))
    assert enc.size == tuple(ref.shape[1:])
    assert torch.equal(enc.full(), ref), (enc.full().int() - ref.int()).abs().max()
    header = D.jpeg_header(data)  # the marker scan agrees with PIL's header
    assert header is not None and header[2] == ("exif_orientation" in CASES[case])
    if not header[2]:
        assert header[:2] == enc.size


def test_reduced_decoders_agree(monkeypatch):
    pytest.importorskip("simplejpeg")
    data = _jpeg(803, 601, seed=4)
    for d in (2, 4, 8):
        fast = EncodedImage(data, "x").decode(d)
        assert tuple(fast.shape[1:]) == (-(-601 // d), -(-803 // d))
        monkeypatch.setattr(D, "_SJ", False)
        pil = EncodedImage(data, "x").decode(d)
        monkeypatch.undo()
        assert torch.equal(fast, pil), d


def test_png_and_broken_files(decoder, tmp_path):
    buf = io.BytesIO()
    Image.fromarray(_photo(30, 20)).convert("RGBA").save(buf, format="PNG")
    path = tmp_path / "x.png"
    path.write_bytes(buf.getvalue())
    enc = EncodedImage(buf.getvalue(), "x.png")
    assert torch.equal(enc.full(), as_uint8_chw(load_rgb(path))) and enc.scale_for(30, 20, 4) == 1
    data = _jpeg(400, 300)
    with pytest.raises(CorruptImageError, match="cannot read image s.tar:k.jpg"):
        EncodedImage(b"garbage" * 10, "s.tar:k.jpg")
    truncated = EncodedImage(data[: len(data) // 2], "t.jpg")  # libjpeg would fill it with gray
    with pytest.raises(CorruptImageError, match="t.jpg"):
        truncated.full()
    with pytest.raises(CorruptImageError, match="t.jpg"):
        truncated.decode(2)


def test_fast_resized_crop_equals_torchvision():
    g = torch.Generator().manual_seed(0)
    hwc = torch.from_numpy(_photo(150, 110)).permute(2, 0, 1)
    for img in (hwc, hwc.contiguous()):
        for _ in range(30):
            h, w = (int(v) for v in torch.randint(1, 110, (2,), generator=g))
            top = int(torch.randint(0, 111 - h, (1,), generator=g))
            left = int(torch.randint(0, 151 - w, (1,), generator=g))
            size = int(torch.randint(4, 80, (1,), generator=g))
            ref = TF.resized_crop(img, top, left, h, w, [size, size], InterpolationMode.BILINEAR,
                                  antialias=True)
            out = fast_resized_crop(img, top, left, h, w, size)
            assert out.is_contiguous() and torch.equal(out, ref), (h, w, size)


def test_reduced_scale_rule():
    for h, w, bh, bw, size in itertools.product((375, 500, 1000), (333, 500), (100, 250, 470),
                                                (90, 300), (16, 32, 96)):
        bh, bw = min(bh, h), min(bw, w)
        d = reduced_scale(h, w, bh, bw, size)
        assert d in (1, 2, 4, 8)
        dst = (-(-h // d), -(-w // d))
        for top, left in () if d == 1 else ((0, 0), (h - bh, w - bw), ((h - bh) // 3, (w - bw) // 7)):
            _, _, mh, mw = map_box(top, left, bh, bw, (h, w), dst)
            assert mh >= size and mw >= size  # a reduced decode never makes the crop upsample
        if d < 8:  # the next coarser scale would not leave size + 1 pixels
            assert min(bh, bw) < 2 * d * (size + 1)


def _spy_boxes(monkeypatch):
    seen = []
    real_tensor, real_enc = PI.resized_crop_uint8, EncodedImage.resized_crop

    def on_tensor(img, top, left, h, w, size):
        seen.append((top, left, h, w, size))
        return real_tensor(img, top, left, h, w, size)

    def on_encoded(self, top, left, h, w, size):
        seen.append((top, left, h, w, size))
        return real_enc(self, top, left, h, w, size)

    monkeypatch.setattr(PI, "resized_crop_uint8", on_tensor)
    monkeypatch.setattr(EncodedImage, "resized_crop", on_encoded)
    return seen


@pytest.mark.parametrize("preset,kw", [("mocov2", dict(image_size=64)),
                                       ("multicrop", dict(image_size=64, local_size=24))])
@pytest.mark.parametrize("path", ["per_image", "batched"])
def test_same_crop_boxes_for_the_same_seed(preset, kw, path, monkeypatch):
    """Today's path (a decoded tensor) and the encoded path draw the same boxes; with reduced
    decoding off they give the same pixels, with it on a close image of the same box."""
    data = _jpeg(400, 300, seed=1)
    pipe = get_pipeline(preset, **kw)
    fn = pipe if path == "per_image" else pipe.split()[0]
    seen = _spy_boxes(monkeypatch)
    decoded = as_uint8_chw(Image.open(io.BytesIO(data)).convert("RGB"))
    runs = {}
    for name, make in (("tensor", lambda: decoded), ("full", lambda: EncodedImage(data, "x", reduced=False)),
                       ("reduced", lambda: EncodedImage(data, "x", reduced=True))):
        views, boxes = [], []
        for seed in range(12):
            seen.clear()
            torch.manual_seed(seed)
            views.append(fn(make()))
            boxes.append(list(seen))
        runs[name] = (views, boxes)
    assert runs["tensor"][1] == runs["full"][1] == runs["reduced"][1]
    assert len(runs["tensor"][1][0]) == pipe.num_views
    for a, b in zip(runs["tensor"][0], runs["full"][0]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    # reduced decoding: same box, resampled through a smaller decode (PSNR in decode.md); the
    # views (colour-jittered the same way) stay close
    for a, b in zip(runs["tensor"][0], runs["reduced"][0]):
        for x, y in zip(a, b):
            assert x.shape == y.shape
            err = (x.float() - y.float()).abs().mean() / (x.float().abs().mean() + 1e-6)
            assert err < 0.2


def test_reduced_decoding_is_used_when_the_box_allows_and_is_close():
    data = _jpeg(800, 600, seed=2)
    enc = EncodedImage(data, "x")
    ref = fast_resized_crop(enc.full(), 100, 80, 480, 640, 64)
    enc = EncodedImage(data, "x")
    assert enc.scale_for(480, 640, 64) == 4
    out = enc.resized_crop(100, 80, 480, 640, 64)
    assert set(enc._cache) == {4}  # no full-size decode
    mse = (out.double() - ref.double()).square().mean()
    assert 10 * torch.log10(255.0**2 / mse) > 30  # PSNR (dB) against the exact decode
    # a finer decode already made is reused by later, coarser boxes
    enc.resized_crop(0, 0, 100, 100, 64)
    assert set(enc._cache) == {1, 4}
    enc.resized_crop(0, 0, 600, 800, 32)
    assert set(enc._cache) == {1, 4}
    assert not EncodedImage(_jpeg(800, 600, exif_orientation=6), "r").scale_for(800, 600, 32) > 1


def test_fast_dct_is_opt_in_and_close(tmp_path):
    pytest.importorskip("simplejpeg")
    from contrastive.data import ImageFolderDataset, get_dataset
    from contrastive.data.make_shards import write_shards

    data = _jpeg(400, 300, seed=5)
    exact, fast = EncodedImage(data, "x").full(), EncodedImage(data, "x", fast=True).full()
    assert not torch.equal(exact, fast)
    mse = (exact.double() - fast.double()).square().mean()
    assert 10 * torch.log10(255.0**2 / mse) > 30
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(data)
    write_shards(ImageFolderDataset(tmp_path, labels=False), tmp_path / "wds")
    seen = []
    spy = type("Spy", (), {"accepts_encoded": True, "__call__": lambda s, x: seen.append(x)})()
    for mode, flags in (("auto", (True, False)), ("reduced", (True, False)), ("full", (False, False)),
                        ("fast", (True, True))):
        get_dataset(f"wds:{tmp_path / 'wds'},decode={mode}", transform=spy)[0]
        assert (seen[-1].reduced, seen[-1].fast) == flags, mode
