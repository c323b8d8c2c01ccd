"""Every image becomes 8-bit RGB with its EXIF orientation applied."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from contrastive.data import CorruptImageError, is_image_file, load_rgb, to_rgb


def _pixel(img: Image.Image, xy) -> tuple:
    return tuple(int(v) for v in img.getpixel(xy))


def test_rgb_is_returned_as_is():
    img = Image.new("RGB", (4, 3), (10, 20, 30))
    assert to_rgb(img) is img


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: Image.new("L", (4, 4), 77), (77, 77, 77)),
        (lambda: Image.new("1", (4, 4), 1), (255, 255, 255)),
        (lambda: Image.fromarray(np.full((4, 4), 0xFFFF, dtype=np.uint16)), (255, 255, 255)),
        (lambda: Image.fromarray(np.full((4, 4), 0x4000, dtype=np.uint16)), (0x40, 0x40, 0x40)),
        (lambda: Image.fromarray(np.full((4, 4), 12.7, dtype=np.float32)), (12, 12, 12)),
        (lambda: Image.new("CMYK", (4, 4), (0, 255, 255, 0)), (255, 0, 0)),
        (lambda: Image.new("YCbCr", (4, 4), (76, 85, 255)), None),
    ],
    ids=["L", "1", "I16-high", "I16", "F", "CMYK", "YCbCr"],
)
def test_odd_modes_become_rgb(make, expected):
    img = make()
    out = to_rgb(img)
    assert out.mode == "RGB" and out.size == img.size
    if expected is not None:
        assert _pixel(out, (1, 1)) == expected
    else:  # YCbCr (76, 85, 255) is about pure red
        r, g, b = _pixel(out, (1, 1))
        assert r > 200 and g < 40 and b < 40


def test_palette_image_with_and_without_transparency():
    pal = Image.new("P", (4, 4), 1)
    pal.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
    assert _pixel(to_rgb(pal), (0, 0)) == (200, 100, 50)
    pal.info["transparency"] = 1  # index 1 transparent -> composited over white
    assert _pixel(to_rgb(pal), (0, 0)) == (255, 255, 255)


def test_alpha_is_composited_over_the_background():
    rgba = Image.new("RGBA", (2, 2), (200, 0, 0, 0))
    rgba.putpixel((1, 1), (200, 0, 0, 255))
    rgba.putpixel((0, 1), (0, 0, 200, 128))
    out = to_rgb(rgba)
    assert _pixel(out, (0, 0)) == (255, 255, 255)  # transparent -> white, not the hidden red
    assert _pixel(out, (1, 1)) == (200, 0, 0)
    r, g, b = _pixel(out, (0, 1))
    assert abs(r - 127) <= 1 and abs(b - 227) <= 1  # half blue over white
    assert _pixel(to_rgb(rgba, background=(0, 0, 0)), (0, 0)) == (0, 0, 0)
    la = Image.new("LA", (2, 2), (50, 255))
    assert _pixel(to_rgb(la), (0, 0)) == (50, 50, 50)


@pytest.mark.parametrize(
    "suffix, mode", [(".png", "P"), (".png", "RGBA"), (".png", "LA"), (".png", "I;16"), (".jpg", "CMYK"),
                     (".jpg", "L"), (".gif", "P"), (".tif", "RGBA"), (".bmp", "1"), (".webp", "RGBA")],
)
def test_load_rgb_from_files_of_every_kind(tmp_path, suffix, mode):
    img = Image.new(mode, (6, 5))
    path = tmp_path / f"img{suffix}"
    img.save(path)
    out = load_rgb(path)
    assert out.mode == "RGB" and out.size == (6, 5)


def test_exif_orientation_is_applied(tmp_path):
    # a 4 x 2 landscape with a red left column, stored with orientation 6 (rotate 90 CW to view)
    img = Image.new("RGB", (40, 20), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 10, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    img.save(path, exif=exif, quality=95)
    out = load_rgb(path)
    assert out.size == (20, 40)  # portrait once rotated
    r, g, b = _pixel(out, (10, 3))  # the red column is now at the top
    assert r > 200 and b < 60
    r, g, b = _pixel(out, (10, 36))
    assert b > 200 and r < 60


def test_corrupt_file_error_names_it(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(CorruptImageError, match="broken.jpg"):
        load_rgb(bad)
    truncated = tmp_path / "truncated.png"
    Image.new("RGB", (64, 64), (1, 2, 3)).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:60])
    with pytest.raises(CorruptImageError, match="truncated.png"):
        load_rgb(truncated)


def test_image_extensions():
    assert is_image_file("a/b/C.JPEG") and is_image_file("x.png") and is_image_file("y.webp")
    assert not is_image_file("notes.txt") and not is_image_file("labels.csv") and not is_image_file("Thumbs.db")
