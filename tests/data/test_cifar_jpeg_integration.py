"""Integration with the real CIFAR-10 JPEG copy in ../shared/data (skipped when absent)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import torch

from contrastive.augment import get_pipeline
from contrastive.data import build_loader, get_dataset, has_split, num_classes

PER_FOLDER = 12
WANTED = ("train/airplane/", "train/automobile/", "test/airplane/", "test/automobile/")


@pytest.fixture(scope="module")
def cifar_jpeg(shared_data: Path, tmp_path_factory) -> Path:
    """Extract the first 12 images of two classes of each split (one pass over the headers)."""
    dest = tmp_path_factory.mktemp("cifar10-jpeg")
    counts = dict.fromkeys(WANTED, 0)
    with tarfile.open(shared_data / "cifar10-jpeg.tar") as tar:
        for member in tar:
            prefix = next((w for w in WANTED if member.name.startswith(w)), None)
            if prefix and member.isfile() and counts[prefix] < PER_FOLDER:
                tar.extract(member, dest, filter="data")
                counts[prefix] += 1
                if all(c == PER_FOLDER for c in counts.values()):
                    break
    assert all(c == PER_FOLDER for c in counts.values()), counts
    return dest


def test_folder_layout_resolves(cifar_jpeg):
    for spec in (f"cifar10:{cifar_jpeg}", str(cifar_jpeg), f"imagefolder:{cifar_jpeg}"):
        assert has_split(spec, "test")
        train, test = get_dataset(spec), get_dataset(spec, split="test")
        assert len(train) == len(test) == 2 * PER_FOLDER
        assert train.classes == ["airplane", "automobile"] and num_classes(test) == 2
        img, label = train[PER_FOLDER]
        assert img.mode == "RGB" and img.size == (32, 32) and label == 1


def test_both_paths_on_real_jpegs(cifar_jpeg):
    pipe = get_pipeline("mocov2", 32)
    ds = get_dataset(f"cifar10:{cifar_jpeg}", transform=pipe)
    views, label = ds[0]
    assert [v.shape for v in views] == [(3, 32, 32)] * 2 and label == 0

    worker_fn, device_fn = pipe.split()
    ds = get_dataset(f"cifar10:{cifar_jpeg}", transform=worker_fn)
    loader = build_loader(ds, 8, shuffle=True, num_workers=2, seed=0, persistent_workers=False)
    batches = list(loader)
    assert len(batches) == 3
    views, labels = batches[0]
    assert [v.dtype for v in views] == [torch.uint8] * 2 and views[0].shape == (8, 3, 32, 32)
    out = device_fn(views, torch.Generator().manual_seed(0))
    assert [o.shape for o in out] == [(8, 3, 32, 32)] * 2
    # normalised with ImageNet statistics: natural images land near zero mean, unit scale
    allv = torch.cat(out)
    assert abs(float(allv.mean())) < 0.6 and 0.4 < float(allv.std()) < 1.6
    eval_pipe = get_pipeline("eval", 32)
    x = get_dataset(f"cifar10:{cifar_jpeg}", split="test", transform=eval_pipe)[3][0][0]
    assert x.shape == (3, 32, 32)
