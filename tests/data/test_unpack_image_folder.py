"""``unpack_image_folder``: an ImageFolder tar unpacked once, atomically, whether ``train/`` is
at the tar's top or inside one top folder; a tar without ``train/`` is refused."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from contrastive.data import DownloadError, unpack_image_folder


def _tar(tmp_path: Path, prefix: str, name: str) -> Path:
    src = tmp_path / f"src_{name}"
    for split in ("train", "test"):
        (src / prefix / split / "cat").mkdir(parents=True)
        (src / prefix / split / "cat" / "0.jpg").write_bytes(b"x")
    archive = tmp_path / f"{name}.tar"
    with tarfile.open(archive, "w") as tar:
        for p in sorted((src / prefix).iterdir()) if prefix else sorted(src.iterdir()):
            tar.add(p, arcname=str(p.relative_to(src)))
    return archive


@pytest.mark.parametrize("prefix", ["", "cifar"])
def test_unpacks_once_from_either_layout(tmp_path, prefix):
    archive = _tar(tmp_path, prefix, "a")
    dest = tmp_path / "cache" / "cifar10-jpeg"
    assert unpack_image_folder(archive, dest) == dest
    assert (dest / "train" / "cat" / "0.jpg").read_bytes() == b"x"
    assert (dest / "test" / "cat").is_dir()
    assert [p.name for p in dest.parent.iterdir()] == ["cifar10-jpeg"]  # no temporary left
    archive.unlink()  # a second call does not read the tar again
    assert unpack_image_folder(archive, dest) == dest


def test_a_tar_without_train_is_refused(tmp_path):
    (tmp_path / "src" / "images").mkdir(parents=True)
    archive = tmp_path / "b.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "src" / "images", arcname="images")
    with pytest.raises(DownloadError, match="train/"):
        unpack_image_folder(archive, tmp_path / "cache" / "x")
    assert not (tmp_path / "cache" / "x").exists()
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_default_destination_is_the_cache(tmp_path, monkeypatch):
    """Without ``dest``: ``$CONTRASTIVE_CACHE/<the archive's name without .tar>``."""
    monkeypatch.setenv("CONTRASTIVE_CACHE", str(tmp_path / "cache"))
    archive = _tar(tmp_path, "", "cifar10-jpeg")
    assert unpack_image_folder(archive) == tmp_path / "cache" / "cifar10-jpeg"
    assert (tmp_path / "cache" / "cifar10-jpeg" / "train" / "cat" / "0.jpg").is_file()
