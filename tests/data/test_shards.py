"""Tar shards (contrastive.data.shards): writing from any spec, the index, random access in the
source order, nothing in a shard runs code, corrupt samples named / skipped / counted, specs."""

from __future__ import annotations

import io
import json
import logging
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from contrastive.augment import get_pipeline
from contrastive.augment.per_image import as_uint8_chw
from contrastive.data import CorruptImageError, ImageFolderDataset, get_dataset, has_split
from contrastive.data.decode import EncodedImage
from contrastive.data.make_shards import main as make_shards
from contrastive.data.make_shards import parse_size, write_shards
from contrastive.data.shards import ShardDataset, expand_shard_spec, split_name
from contrastive.engine.loader import GlobalBatchSampler, SeededDataset


def _jpeg(seed: int, size=(40, 30), mode="RGB", subsampling=2) -> bytes:
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([xx * 5 % 256, yy * 7 % 256, (xx + yy) * 3 % 256], -1).astype(np.float64)
    arr = np.clip(arr + rng.normal(0, 20, arr.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(arr)
    if mode == "L":
        img = img.convert("L")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path) -> Path:
    """3 classes x 4 JPEGs (RGB 4:2:0, 4:4:4, grayscale) and one PNG, sizes varying."""
    root = tmp_path / "imgs"
    for c, name in enumerate(["cat", "dog", "emu"]):
        (root / name).mkdir(parents=True)
        for k in range(4):
            i = 4 * c + k
            data = _jpeg(i, (40 + i, 30 + 2 * i), "L" if k == 3 else "RGB", 0 if k == 2 else 2)
            (root / name / f"{k:02d}.jpg").write_bytes(data)
    buf = io.BytesIO()
    Image.fromarray(np.full((20, 24, 3), 77, np.uint8)).save(buf, format="PNG")
    (root / "emu" / "99.png").write_bytes(buf.getvalue())
    return root


def test_shards_keep_bytes_labels_and_order_of_a_folder(folder, tmp_path):
    src = ImageFolderDataset(folder)
    meta = write_shards(src, tmp_path / "wds", max_count=5)
    assert [s["nsamples"] for s in meta["shardlist"]] == [5, 5, 3]  # uneven shards
    listing = json.loads((tmp_path / "wds" / "train.json").read_text())
    assert listing["__kind__"] == "wids-shard-index-v1" and listing["classes"] == ["cat", "dog", "emu"]
    ds = get_dataset(f"wds:{tmp_path / 'wds'}")
    assert isinstance(ds, ShardDataset) and len(ds) == len(src) == 13
    assert ds.targets == src.targets and ds.classes == src.classes and ds.num_classes == 3
    for i, path in enumerate(src.paths):
        assert ds.read_bytes(i) == path.read_bytes()  # the original encoded bytes, in order
        assert ds.exts[i] == path.suffix.lstrip(".")
    # a plain tar reader sees the WebDataset layout
    with tarfile.open(tmp_path / "wds" / "train-000000.tar") as tf:
        assert tf.getnames()[:4] == ["000000000.jpg", "000000000.cls", "000000001.jpg", "000000001.cls"]
        assert tf.extractfile("000000004.cls").read() == b"1"


def test_max_size_splits_shards(folder, tmp_path):
    src = ImageFolderDataset(folder)
    limit = 24 * 1024
    meta = write_shards(src, tmp_path / "wds", max_bytes=limit)
    sizes = [(tmp_path / "wds" / s["url"]).stat().st_size for s in meta["shardlist"]]
    assert len(sizes) >= 3 and max(sizes) <= limit, sizes
    assert sum(s["nsamples"] for s in meta["shardlist"]) == 13
    assert len(get_dataset(f"wds:{tmp_path / 'wds'}")) == 13


def test_decoded_sources_are_stored_as_lossless_png_with_both_splits(tmp_path):
    out = tmp_path / "wds"
    assert make_shards(["--data", "shapes:n=20,n_test=8,size=16", "--out", str(out),
                        "--max-count", "6"]) == 0
    src, ds = get_dataset("shapes:n=20,n_test=8,size=16"), get_dataset(f"wds:{out}")
    assert ds.exts == ["png"] * 20 and ds.classes == src.classes
    for i in range(20):
        img, label = ds[i]
        assert torch.equal(as_uint8_chw(img), src[i][0]) and label == src[i][1]
    assert has_split(f"wds:{out}", "test") and len(get_dataset(f"wds:{out}", "test")) == 8
    assert sorted(p.name for p in out.glob("t*[tn].json")) == ["test.json", "train.json"]


def test_shard_specs(folder, tmp_path):
    out = tmp_path / "wds"
    write_shards(ImageFolderDataset(folder), out, max_count=5)
    for spec in (f"wds:{out}", f"wds:{out}/train.json", f"wds:{out}/train-{{000000..000002}}.tar",
                 f"wds:{out}/train-*.tar", f"shards:{out},decode=pil"):
        assert len(get_dataset(spec)) == 13, spec
    assert not has_split(f"wds:{out}", "test") and not has_split(f"wds:{out}/train-*.tar", "test")
    assert expand_shard_spec("/a/b-{08..10}-{1..2}.tar") == [
        Path(f"/a/b-{i:02d}-{j}.tar") for i in (8, 9, 10) for j in (1, 2)]
    assert split_name("dir/x.y.JPG") is None or split_name("dir/x.y.JPG") == ("dir/x", "y.jpg")
    assert split_name("a/b/000001.jpg") == ("a/b/000001", "jpg")
    with pytest.raises(FileNotFoundError, match="train.json"):
        get_dataset(f"wds:{tmp_path}")
    with pytest.raises(FileNotFoundError, match="no shard matches"):
        get_dataset(f"wds:{tmp_path}/nothing-*.tar")
    with pytest.raises(ValueError, match="decode must be"):
        get_dataset(f"wds:{out},decode=fastest")
    gz = tmp_path / "z.tar"
    with tarfile.open(gz, "w:gz") as tf:
        tf.add(folder / "cat" / "00.jpg", "000.jpg")
    with pytest.raises(ValueError, match="uncompressed tar"):
        get_dataset(f"wds:{gz}")
    assert parse_size("1G") == 1 << 30 and parse_size("500M") == 500 << 20 and parse_size("64") == 64


def test_index_is_cached_and_rebuilt_when_the_tar_changes(folder, tmp_path):
    out = tmp_path / "wds"
    write_shards(ImageFolderDataset(folder), out, max_count=100)
    idx = out / "train-000000.tar.idx.json"
    assert idx.is_file()
    # a shard written by another tool: no index yet, built from the tar headers and cached
    other = tmp_path / "other.tar"
    with tarfile.open(other, "w") as tf:
        for k in range(3):
            data = _jpeg(50 + k)
            info = tarfile.TarInfo(f"s{k}.jpg")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert len(get_dataset(f"wds:{other}")) == 3 and (tmp_path / "other.tar.idx.json").is_file()
    assert get_dataset(f"wds:{other}").targets == [-1, -1, -1]
    with tarfile.open(other, "a") as tf:
        data = _jpeg(60)
        info = tarfile.TarInfo("s9.jpg")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    ds = get_dataset(f"wds:{other}")  # the stale index is noticed
    assert len(ds) == 4 and ds.read_bytes(3) == data


# ---- nothing in a shard can run code --------------------------------------------------------------

class _Plant:
    """Unpickling this calls Path.touch(marker): what a hostile .pyd / .pickle / .pth would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickle_members_are_never_loaded(tmp_path):
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(_Plant(marker))
    pickle.loads(payload)  # the payload is live: loading it runs code
    assert marker.exists()
    marker.unlink()
    buf = io.BytesIO()
    torch.save({"x": _Plant(marker)}, buf)
    shard = tmp_path / "evil.tar"
    with tarfile.open(shard, "w") as tf:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for k in range(3):
            add(f"{k:03d}.jpg", _jpeg(k))
            add(f"{k:03d}.cls", b"1")
            add(f"{k:03d}.pyd", payload)
            add(f"{k:03d}.pickle", payload)
            add(f"{k:03d}.pth", buf.getvalue())
        add("003.pyd", payload)  # a sample with nothing but a pickle
    for decode in ("pil", "reduced"):
        ds = get_dataset(f"wds:{shard},decode={decode}", transform=get_pipeline("mocov2", image_size=16))
        assert len(ds) == 3 and ds.num_missing == 1 and ds.targets == [1, 1, 1]
        for i in range(len(ds)):
            views, label = ds[i]
            assert len(views) == 2 and label == 1
    write_shards(get_dataset(f"wds:{shard}"), tmp_path / "copy")  # re-sharding reads no pickle either
    assert not marker.exists()
    with tarfile.open(tmp_path / "copy" / "train-000000.tar") as tf:
        assert {n.rsplit(".", 1)[1] for n in tf.getnames()} == {"jpg", "cls"}
    with pytest.raises(CorruptImageError, match="no image member.*evil.tar:003"):
        get_dataset(f"wds:{shard}", strict=True)


# ---- corrupt samples ------------------------------------------------------------------------------

@pytest.fixture
def corrupt_shards(folder, tmp_path) -> Path:
    (folder / "cat" / "01.jpg").write_bytes(_jpeg(1)[:-100])  # truncated in the scan: header intact
    (folder / "dog" / "02.jpg").write_bytes(b"not an image at all" * 20)
    out = tmp_path / "wds"
    write_shards(ImageFolderDataset(folder), out, max_count=4)
    return out


@pytest.mark.parametrize("decode", ["pil", "full", "reduced"])
def test_corrupt_samples_are_named_skipped_and_counted(corrupt_shards, decode, caplog):
    ds = get_dataset(f"wds:{corrupt_shards},decode={decode}",
                     transform=get_pipeline("mocov2", image_size=16) if decode != "pil" else None)
    with caplog.at_level(logging.WARNING, logger="contrastive.data.shards"):
        items = [ds[i] for i in range(len(ds))]
    assert ds.num_skipped == 2
    assert sorted(Path(s).name for s in ds.skipped_samples) == [
        "train-000000.tar:000000001.jpg", "train-000001.tar:000000006.jpg"]
    assert "train-000000.tar:000000001.jpg" in caplog.text and "train-000001.tar:000000006.jpg" in caplog.text
    # replaced by the next readable sample, with its label
    assert items[1][1] == ds.targets[2] and items[6][1] == ds.targets[7]


def test_corrupt_sample_leaves_the_replacement_views_unchanged(corrupt_shards):
    """With encoded images the failure happens inside the transform; the generator is restored so
    the replacement's views are those it gets when the bad sample is already known."""
    ds = get_dataset(f"wds:{corrupt_shards},decode=full", transform=get_pipeline("mocov2", image_size=16))
    torch.manual_seed(3)
    first = ds[1][0]
    torch.manual_seed(3)
    again = ds[1][0]  # now the bad sample is skipped without being decoded
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_strict_mode_fails_before_training_naming_the_sample(corrupt_shards):
    with pytest.raises(CorruptImageError, match=r"train-000000.tar:000000001.jpg.*strict mode"):
        get_dataset(f"wds:{corrupt_shards}", strict=True)


# ---- the engine's order -----------------------------------------------------------------------------

def test_global_order_and_views_equal_the_folder_ones(folder, tmp_path):
    """Sample i of the shards is image i of the folder: the engine's sampler and per-sample seeds
    then give the same batches, and with an exact decode the same views, as the folder."""
    write_shards(ImageFolderDataset(folder), tmp_path / "wds", max_count=5)
    pipe = get_pipeline("mocov2", image_size=16)
    a = SeededDataset(ImageFolderDataset(folder, pipe), seed=7)
    b = SeededDataset(get_dataset(f"wds:{tmp_path / 'wds'},decode=full", transform=pipe), seed=7)
    for rank in (0, 1):
        sa = GlobalBatchSampler(len(a), 4, rank=rank, world_size=2, seed=7)
        sb = GlobalBatchSampler(len(b), 4, rank=rank, world_size=2, seed=7)
        sa.set_epoch(1)
        sb.set_epoch(1)
        batches = list(sb)
        assert batches == list(sa) and len(batches) == 3 and all(len(x) == 2 for x in batches)
        for key in batches[0] + batches[-1]:
            va, ya, ia = a[key]
            vb, yb, ib = b[key]
            assert ya == yb and ia == ib
            assert all(torch.equal(x, y) for x, y in zip(va, vb))


def test_dataset_pickles_for_workers_and_reads_after_fork(folder, tmp_path):
    write_shards(ImageFolderDataset(folder), tmp_path / "wds", max_count=5)
    ds = get_dataset(f"wds:{tmp_path / 'wds'}")
    ds.read_bytes(0)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.read_bytes(12) == ds.read_bytes(12)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2,
                                         collate_fn=lambda b: [y for _, y in b])
    assert sum(loader, []) == ds.targets


def test_encoded_image_goes_only_to_transforms_that_take_it(folder, tmp_path):
    write_shards(ImageFolderDataset(folder), tmp_path / "wds")
    spec = f"wds:{tmp_path / 'wds'}"
    assert isinstance(get_dataset(spec)[0][0], Image.Image)
    assert isinstance(get_dataset(spec, transform=lambda x: x)[0][0], Image.Image)
    worker_fn, _ = get_pipeline("mocov2", image_size=16).split()
    seen = []
    ds = get_dataset(spec, transform=worker_fn)
    ds.transform = type("Spy", (), {"accepts_encoded": True, "__call__": lambda s, x: seen.append(x)})()
    ds[0]
    assert isinstance(seen[0], EncodedImage) and seen[0].reduced
