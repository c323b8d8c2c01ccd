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


def test_strict_makes_a_corrupt_file_an_error(with_corrupt):
    ds = get_dataset(str(with_corrupt), strict=True)
    assert ds[0][1] == 0
    with pytest.raises(CorruptImageError, match="1.jpg"):
        ds[1]


def test_skips_are_counted_across_loader_workers(with_corrupt):
    ds = ImageFolderDataset(with_corrupt, transform=lambda im: torch.tensor(im.getpixel((0, 0))))
    loader = build_loader(ds, batch_size=2, shuffle=False, num_workers=2, seed=0, persistent_workers=False)
    labels = torch.cat([y for _, y in loader])
    assert labels.tolist() == [0, 1, 1, 0]
    assert ds.num_skipped == 2  # the workers' findings reach the main process


def test_all_unreadable_raises(tmp_path):
    (tmp_path / "x.jpg").write_bytes(b"nope")
    ds = ImageFolderDataset(tmp_path)
    with pytest.raises(CorruptImageError, match="all unreadable"):
        ds[0]


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
