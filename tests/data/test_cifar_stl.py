"""CIFAR pickles and STL-10 binaries: download with md5, atomic files, offline errors.

The archives are tiny fakes in the official formats, served from ``file://`` URLs.
"""

from __future__ import annotations

import hashlib
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from contrastive.data import (
    CIFARDataset,
    DownloadError,
    STL10Dataset,
    download,
    get_dataset,
    num_classes,
)


def _cifar_tree(folder: Path, variant: str = "cifar10") -> tuple[np.ndarray, list[int]]:
    """Write a 'cifar-10-batches-py' look-alike: 5 train batches of 2 images, 1 test batch."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    all_data, all_labels = [], []
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"] if variant == "cifar10" else ["train", "test"]
    key = b"labels" if variant == "cifar10" else b"fine_labels"
    for name in files:
        data = rng.integers(0, 256, (2, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, 2).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, key: labels, b"batch_label": name.encode()}, f)
        all_data.append(data)
        all_labels.append(labels)
    meta = ("batches.meta", b"label_names") if variant == "cifar10" else ("meta", b"fine_label_names")
    with open(folder / meta[0], "wb") as f:
        pickle.dump({meta[1]: [f"c{i}".encode() for i in range(10)]}, f)
    return np.concatenate(all_data), sum(all_labels, [])


def _tar_gz(src: Path, member: str, out: Path) -> str:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=member)
    return hashlib.md5(out.read_bytes()).hexdigest()


@pytest.fixture
def cifar_archive(tmp_path: Path):
    data, labels = _cifar_tree(tmp_path / "src" / "cifar-10-batches-py")
    archive = tmp_path / "cifar-10-python.tar.gz"
    md5 = _tar_gz(tmp_path / "src" / "cifar-10-batches-py", "cifar-10-batches-py", archive)
    return archive, md5, data, labels


def test_cifar_download_check_and_load(tmp_path, cifar_archive):
    archive, md5, data, labels = cifar_archive
    root = tmp_path / "cache"
    ds = CIFARDataset(root, "train", url=archive.as_uri(), md5=md5)
    assert len(ds) == 10 and ds.targets == labels[:10] and ds.classes[3] == "c3" and num_classes(ds) == 10
    img, label = ds[4]
    expected = data[4].reshape(3, 32, 32).transpose(1, 2, 0)  # rows of R, then G, then B planes
    assert img.mode == "RGB" and img.size == (32, 32) and np.array_equal(np.asarray(img), expected)
    assert label == labels[4]
    test = CIFARDataset(root, "test", url="file:///nonexistent", md5=md5)  # already there: no download
    assert len(test) == 2 and test.targets == labels[10:]
    assert not list(root.glob("*.part")) and not list(root.glob(".extract-*"))
    # the spec string pointing at the folder itself, or at its parent
    assert len(get_dataset(f"cifar10:{root / 'cifar-10-batches-py'}", split="test")) == 2
    assert len(get_dataset(f"cifar10:{root},download=false")) == 10


def test_cifar100_fine_labels(tmp_path):
    data, labels = _cifar_tree(tmp_path / "cifar-100-python", "cifar100")
    ds = get_dataset(f"cifar100:{tmp_path}", split="test")
    assert ds.targets == labels[2:] and ds.classes[0] == "c0"


def test_checksum_mismatch_leaves_nothing_behind(tmp_path, cifar_archive):
    archive, md5, *_ = cifar_archive
    root = tmp_path / "cache"
    with pytest.raises(DownloadError, match="checksum mismatch"):
        CIFARDataset(root, url=archive.as_uri(), md5="0" * 32)
    assert list(root.iterdir()) == []  # no partial archive a later run could trust


def test_offline_error_says_how_to_use_a_local_copy(tmp_path):
    with pytest.raises(DownloadError) as e:
        CIFARDataset(tmp_path, url="http://127.0.0.1:9/cifar-10-python.tar.gz")
    msg = str(e.value)
    assert "could not reach http://127.0.0.1:9" in msg and "cifar10:/path" in msg
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="download=False"):
        CIFARDataset(tmp_path / "x", download=False)


def test_download_is_atomic(tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(b"x" * 5000)
    dest = tmp_path / "out" / "payload.bin"
    download(src.as_uri(), dest, hashlib.md5(src.read_bytes()).hexdigest())
    assert dest.read_bytes() == src.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["payload.bin"]


def _stl_tree(folder: Path) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    arrays = {}
    for split, n in (("train", 3), ("test", 2), ("unlabeled", 4)):
        hwc = rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)
        arrays[split] = hwc
        # the official files store each image channel-first and column-major
        hwc.transpose(0, 3, 2, 1).tofile(folder / f"{split}_X.bin")
        if split != "unlabeled":
            np.array([1, 10, 5][:n], dtype=np.uint8).tofile(folder / f"{split}_y.bin")
    (folder / "class_names.txt").write_text("\n".join(f"k{i}" for i in range(10)))
    return arrays


def test_stl10_splits_and_orientation(tmp_path):
    arrays = _stl_tree(tmp_path / "src" / "stl10_binary")
    archive = tmp_path / "stl10_binary.tar.gz"
    md5 = _tar_gz(tmp_path / "src" / "stl10_binary", "stl10_binary", archive)
    root = tmp_path / "cache"
    train = STL10Dataset(root, "train", url=archive.as_uri(), md5=md5)
    assert train.targets == [0, 9, 4] and train.classes[9] == "k9"
    img, _ = train[1]
    assert np.array_equal(np.asarray(img), arrays["train"][1])
    unl = STL10Dataset(root, "unlabeled")
    assert len(unl) == 4 and set(unl.targets) == {-1}
    both = get_dataset(f"stl10:{root / 'stl10_binary'},unlabeled=true")
    assert len(both) == 7 and both.targets[:3] == [0, 9, 4]
    assert np.array_equal(np.asarray(both[5][0]), arrays["unlabeled"][2])
    assert len(get_dataset(f"stl10:{root}", split="test")) == 2


class _Plant:
    """Unpickling this creates ``path`` (a stand-in for any code a crafted file would run)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').close()",))


@pytest.mark.parametrize("name", ["data_batch_3", "batches.meta"])
def test_cifar_batch_with_code_is_refused_without_running_it(tmp_path, name):
    folder = tmp_path / "cifar-10-batches-py"
    _cifar_tree(folder)
    marker = tmp_path / "marker"
    payload = pickle.dumps({b"data": _Plant(marker), b"labels": [0],
                            b"label_names": [_Plant(marker)]}, protocol=2)
    pickle.loads(payload)  # positive control: a plain unpickler runs it
    assert marker.exists()
    marker.unlink()
    (folder / name).write_bytes(payload)
    with pytest.raises(ValueError, match=rf"{name} is not an official CIFAR python batch "
                                         r"\(refusing (__builtin__|builtins).exec\)"):
        get_dataset(f"cifar10:{tmp_path}", split="train")
    assert not marker.exists()


def test_cifar_batch_that_is_not_a_dict_is_refused(tmp_path):
    folder = tmp_path / "cifar-100-python"
    _cifar_tree(folder, "cifar100")
    (folder / "test").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match=r"test is not an official CIFAR python batch \(it holds "
                                         "a list"):
        get_dataset(f"cifar100:{tmp_path}", split="test")


@pytest.mark.parametrize("protocol, numpy1", [(2, True), (2, False), (4, False), (5, False)])
def test_cifar_batches_in_every_pickle_form_load(tmp_path, protocol, numpy1):
    """The official files are protocol-2 pickles naming numpy 1.x modules; batches re-saved by
    numpy 2 (numpy._core, protocol 5's _frombuffer) load too."""
    folder = tmp_path / "cifar-10-batches-py"
    data, labels = _cifar_tree(folder)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        d = pickle.loads((folder / name).read_bytes())
        d[b"filenames"] = [b"a.png", b"b.png"]
        blob = pickle.dumps(d, protocol=protocol)
        if numpy1:
            assert b"numpy._core.multiarray" in blob or name == "batches.meta"
            blob = blob.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        (folder / name).write_bytes(blob)
    ds = get_dataset(f"cifar10:{tmp_path}", split="train")
    assert ds.targets == labels[:10] and ds.classes[2] == "c2"
    assert np.array_equal(np.asarray(ds[7][0]), data[7].reshape(3, 32, 32).transpose(1, 2, 0))
