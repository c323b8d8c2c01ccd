"""Image folders: layouts, the train/val/test rule, bad files, empty folders."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from PIL import Image

from contrastive.data import (
    CorruptImageError,
    ImageFolderDataset,
    build_loader,
    get_dataset,
    has_split,
    load_rgb,
    num_classes,
    resolve_folder_split,
)


def _img(path: Path, colour=(10, 200, 30), size=(12, 10), mode="RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, colour if mode == "RGB" else 100).save(path)
    return path


@pytest.fixture
def labelled(tmp_path: Path) -> Path:
    root = tmp_path / "pets"
    _img(root / "cat" / "a.jpg")
    _img(root / "cat" / "sub" / "b.png")  # nested files belong to their class
    _img(root / "dog" / "c.JPEG", (200, 10, 10))
    _img(root / "dog" / "gray.png", mode="L")
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "dog" / ".hidden.jpg").write_bytes(b"ignored")
    (root / "empty_class").mkdir()
    return root


def test_labelled_layout(labelled):
    ds = ImageFolderDataset(labelled)
    assert ds.classes == ["cat", "dog"] and num_classes(ds) == 2
    assert [p.name for p in ds.paths] == ["a.jpg", "b.png", "c.JPEG", "gray.png"]
    assert ds.targets == [0, 0, 1, 1]
    img, label = ds[3]
    assert img.mode == "RGB" and label == 1
    seen = ImageFolderDataset(labelled, transform=lambda im: im.size)
    assert seen[0] == ((12, 10), 0)


def test_unlabelled_layouts(tmp_path, labelled):
    flat = tmp_path / "flat"
    for i in range(3):
        _img(flat / f"{i}.png")
    ds = ImageFolderDataset(flat)
    assert len(ds) == 3 and ds.targets == [-1, -1, -1] and num_classes(ds) is None
    everything = ImageFolderDataset(labelled, labels=False)
    assert len(everything) == 4 and set(everything.targets) == {-1}


def test_loose_images_beside_class_folders_are_reported(tmp_path, labelled, caplog):
    _img(labelled / "loose.jpg")
    with caplog.at_level(logging.WARNING):
        ds = ImageFolderDataset(labelled)
    assert len(ds) == 4 and "loose.jpg" not in [p.name for p in ds.paths]
    assert "in no class folder" in caplog.text


def test_empty_or_missing_folder_fails_early_with_the_path(tmp_path):
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    (empty / "readme.txt").write_text("x")
    with pytest.raises(ValueError, match="nothing_here") as e:
        ImageFolderDataset(empty)
    assert "no images found" in str(e.value)
    with pytest.raises(FileNotFoundError, match="does_not_exist"):
        ImageFolderDataset(tmp_path / "does_not_exist")
    with pytest.raises(ValueError, match="nothing_here"):
        get_dataset(str(empty))


@pytest.fixture
def with_corrupt(tmp_path: Path) -> Path:
    root = tmp_path / "mixed"
    _img(root / "a" / "0.png", (255, 0, 0))
    (root / "a" / "1.jpg").write_bytes(b"\xff\xd8garbage")
    _img(root / "b" / "2.png", (0, 0, 255))
    (root / "b" / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    return root


def test_corrupt_files_are_named_skipped_once_and_counted(with_corrupt, caplog):
    ds = ImageFolderDataset(with_corrupt, transform=lambda im: im.getpixel((0, 0)))
    with caplog.at_level(logging.WARNING, logger="contrastive.data.folder"):
        items = [ds[i] for i in range(len(ds))] + [ds[i] for i in range(len(ds))]
    # a bad file is replaced by the next readable one, with that one's label
    assert items[:4] == [((255, 0, 0), 0), ((0, 0, 255), 1), ((0, 0, 255), 1), ((255, 0, 0), 0)]
    assert ds.num_skipped == 2
    assert sorted(p.name for p in ds.skipped_files) == ["1.jpg", "3.png"]
    warnings = [r for r in caplog.records if "skipping unreadable image" in r.getMessage()]
    assert len(warnings) == 2  # one per file, even though each was met twice
    assert "1.jpg" in warnings[0].getMessage() and "3.png" in warnings[1].getMessage()


def test_strict_fails_up_front_on_the_first_bad_file(with_corrupt):
    # not on first use mid-epoch: building the data set (before any training) checks every file
    with pytest.raises(CorruptImageError, match=r"1\.jpg.*file 2 of 4.*--strict-data"):
        get_dataset(str(with_corrupt), strict=True)


def _truncated_jpeg(path: Path) -> Path:
    _img(path, size=(64, 64))
    noise = torch.randint(0, 255, (64, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    Image.fromarray(noise.numpy()).save(path, quality=95)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # header intact, second half of the scan missing
    return path


def test_strict_check_finds_truncated_files_and_never_rejects_a_readable_one(tmp_path):
    from contrastive.data.io import check_image

    root = tmp_path / "data"
    _img(root / "a" / "0.jpg")
    padded = _img(root / "a" / "1.jpg")
    padded.write_bytes(padded.read_bytes() + b"\x00" * 16)  # bytes after the end marker: still readable
    _img(root / "b" / "2.png")
    assert len(ImageFolderDataset(root, strict=True)) == 3
    truncated = _truncated_jpeg(root / "b" / "3.jpg")
    with pytest.raises(CorruptImageError, match="3.jpg"):
        load_rgb(truncated)  # really unreadable: the check agrees with the loader
    with pytest.raises(CorruptImageError, match="3.jpg"):
        ImageFolderDataset(root, strict=True)
    png = root / "b" / "4.png"
    noise = torch.randint(0, 255, (64, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    Image.fromarray(noise.numpy()).save(png)
    png.write_bytes(png.read_bytes()[:6000])  # a PNG cut inside its image data
    with pytest.raises(CorruptImageError):
        load_rgb(png)
    assert "4.png" in check_image(png) and check_image(padded) is None


def test_skips_are_counted_across_loader_workers(with_corrupt):
    ds = ImageFolderDataset(with_corrupt, transform=lambda im: torch.tensor(im.getpixel((0, 0))))
    loader = build_loader(ds, batch_size=2, shuffle=False, num_workers=2, seed=0, persistent_workers=False)
    labels = torch.cat([y for _, y in loader])
    assert labels.tolist() == [0, 1, 1, 0]
    assert ds.num_skipped == 2  # the workers' findings reach the main process


@pytest.mark.parametrize("strict", [False, True])
def test_an_all_corrupt_folder_fails_at_once_naming_it(tmp_path, strict):
    root = tmp_path / "broken_set"
    for i in range(3):
        (root / "c" / f"{i}.jpg").parent.mkdir(parents=True, exist_ok=True)
        (root / "c" / f"{i}.jpg").write_bytes(b"nope")
    _truncated_jpeg(root / "d" / "3.jpg")
    with pytest.raises(CorruptImageError, match="broken_set") as e:
        get_dataset(str(root), strict=strict)
    assert ("all 4 image files are unreadable" in str(e.value)) != strict


def test_a_few_bad_files_are_still_skipped_without_strict(with_corrupt):
    ds = get_dataset(str(with_corrupt))  # the first file is readable: no up-front failure
    assert len(ds) == 4 and ds.num_skipped == 0


def test_split_rule(tmp_path):
    plain = tmp_path / "plain"
    _img(plain / "c0" / "x.png")
    assert resolve_folder_split(plain, "train") == plain and resolve_folder_split(plain, "test") is None
    assert has_split(str(plain), "train") and not has_split(str(plain), "test")
    with pytest.raises(ValueError, match="no 'test' split"):
        get_dataset(str(plain), split="test")

    imagenet = tmp_path / "imagenet"
    _img(imagenet / "train" / "n01" / "a.jpg")
    _img(imagenet / "train" / "n02" / "b.jpg")
    _img(imagenet / "val" / "n01" / "c.jpg")
    _img(imagenet / "test" / "n01" / "d.jpg")
    assert resolve_folder_split(imagenet, "test") == imagenet / "val"  # val/ wins over test/
    ds = get_dataset(f"imagefolder:{imagenet}", split="test")
    assert [p.name for p in ds.paths] == ["c.jpg"]
    assert get_dataset(str(imagenet)).classes == ["n01", "n02"]

    cifar_like = tmp_path / "cifar_like"
    _img(cifar_like / "train" / "cat" / "a.jpg")
    _img(cifar_like / "test" / "cat" / "b.jpg")
    assert [p.name for p in get_dataset(str(cifar_like), "test").paths] == ["b.jpg"]
    assert has_split(f"folder:{cifar_like}", "test")


def test_training_with_strict_data_fails_before_the_model_is_built(with_corrupt, tmp_path, fresh_accelerate):
    from contrastive.augment import get_pipeline
    from contrastive.engine import ImageConfig, train

    cfg = ImageConfig(data=str(with_corrupt), encoder="small_cnn", image_size=16, batch_size=2, epochs=1,
                      num_workers=0, progress=False, mixed_precision="no", strict_data=True, knn_every=0,
                      output_dir=str(tmp_path / "run"))
    with pytest.raises(CorruptImageError, match="1.jpg"):
        train(cfg, lambda c, data: pytest.fail("training started"), lambda c: get_pipeline("mocov2", image_size=16),
              recipe="strict-check")


class _DrawsThenDecodes:
    """A ``wants_encoded`` transform that draws from torch's generator before decoding (as the
    device-decode path does), so a bad file fails after the draw."""

    wants_encoded = True

    def __call__(self, img):
        draw = torch.rand(3)
        return draw, img.full()


def test_corrupt_file_leaves_the_replacement_draws_unchanged(tmp_path):
    """An encoded image fails inside the transform; the generator is restored so that the
    replacement draws what it draws when the bad file is already known."""
    root = tmp_path / "data"
    _img(root / "a" / "0.jpg")
    _truncated_jpeg(root / "a" / "1.jpg")  # header intact: fails in the transform's decode
    _img(root / "a" / "2.jpg", (0, 0, 255))
    ds = ImageFolderDataset(root, transform=_DrawsThenDecodes())
    torch.manual_seed(3)
    first, label = ds[1]
    assert ds.num_skipped == 1 and [p.name for p in ds.skipped_files] == ["1.jpg"]
    after_first = torch.get_rng_state()
    torch.manual_seed(3)
    again, _ = ds[1]  # now the bad file is skipped without being read
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]) and label == 0
    assert torch.equal(torch.get_rng_state(), after_first)  # one draw in all, not two
