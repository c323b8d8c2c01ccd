"""Spec strings: grammar, options, errors, splits, subsets."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import Dataset

from contrastive.data import (
    ShapesDataset,
    SubsetDataset,
    UnknownDatasetError,
    get_dataset,
    has_split,
    list_datasets,
    num_classes,
    parse_spec,
    register_dataset,
    subset_fraction,
)


@pytest.mark.parametrize(
    "spec, name, root, options",
    [
        ("shapes", "shapes", None, {}),
        ("shapes:n=2000,size=32,seed=0", "shapes", None, {"n": 2000, "size": 32, "seed": 0}),
        ("SHAPES:n=10, clutter=2", "shapes", None, {"n": 10, "clutter": 2}),
        ("synthetic:n=5,num_classes=3", "synthetic", None, {"n": 5, "num_classes": 3}),
        ("cifar10", "cifar10", None, {}),
        ("cifar10:/data/cifar", "cifar10", "/data/cifar", {}),
        ("cifar100:/d,download=false", "cifar100", "/d", {"download": False}),
        ("stl10:~/stl,unlabeled=yes", "stl10", "~/stl", {"unlabeled": True}),
        ("imagefolder:/x/y,labels=0", "imagefolder", "/x/y", {"labels": 0}),
        ("folder:./rel,fraction=0.1", "imagefolder", "./rel", {"fraction": 0.1}),
        ("/abs/path", "imagefolder", "/abs/path", {}),
        ("./a,b=c:d", "imagefolder", "./a,b=c:d", {}),  # a bare path is taken verbatim
        ("~/photos", "imagefolder", "~/photos", {}),
    ],
)
def test_parse_spec(spec, name, root, options):
    p = parse_spec(spec)
    assert (p.name, p.root, p.options) == (name, root, options)


def test_spec_errors():
    with pytest.raises(UnknownDatasetError, match="shapes") as e:
        parse_spec("shapez")
    assert isinstance(e.value, KeyError)
    with pytest.raises(ValueError, match="unknown option.*'nn'.*accepts"):
        parse_spec("shapes:nn=3")
    with pytest.raises(ValueError, match="second bare value"):
        parse_spec("cifar10:/a,/b")
    with pytest.raises(ValueError, match="non-empty"):
        parse_spec("  ")
    with pytest.raises(ValueError, match="takes no folder"):
        get_dataset("shapes:/tmp")
    with pytest.raises(ValueError, match="needs a path"):
        get_dataset("imagefolder")
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        get_dataset("imagefolder:/no_such_dir")


def test_registry_and_splits():
    assert {"shapes", "synthetic", "cifar10", "cifar100", "stl10", "imagefolder"} <= set(list_datasets())
    assert has_split("shapes", "train") and has_split("shapes", "test") and not has_split("shapes", "val")
    assert has_split("stl10", "unlabeled") and has_split("cifar10:/x", "test")
    with pytest.raises(ValueError, match="no 'val' split"):
        get_dataset("shapes:n=10", split="val")


def test_generated_sets_from_specs():
    train = get_dataset("shapes:n=30,size=16,seed=1")
    test = get_dataset("shapes:n=30,size=16,seed=1", split="test")
    assert isinstance(train, ShapesDataset) and len(train) == 30 and len(test) == 100  # max(100, n // 5)
    assert len(get_dataset("shapes:n=30,n_test=7", split="test")) == 7
    img, label = train[0]
    assert img.dtype == torch.uint8 and img.shape == (3, 16, 16) and isinstance(label, int)
    assert num_classes(train) == 10
    noise = get_dataset("synthetic:n=12,size=8,num_classes=4")
    assert len(noise) == 12 and num_classes(noise) == 4 and noise[5][0].shape == (3, 8, 8)
    assert torch.equal(noise[5][0], get_dataset("synthetic:n=12,size=8,num_classes=4")[5][0])
    seen = get_dataset("shapes:n=4", transform=lambda x: x.float().mean())
    assert isinstance(seen[0][0], torch.Tensor) and seen[0][0].dtype == torch.float32


def test_fraction_is_stratified_and_seeded():
    full = get_dataset("shapes:n=200")
    sub = get_dataset("shapes:n=200,fraction=0.1")
    assert isinstance(sub, SubsetDataset) and len(sub) == 20 and num_classes(sub) == 10
    assert Counter(sub.targets) == {c: 2 for c in range(10)}
    assert sub.targets == [full.targets[i] for i in sub.indices]
    assert sub.indices == get_dataset("shapes:n=200,fraction=0.1").indices
    other = get_dataset("shapes:n=200,fraction=0.1,fraction_seed=1")
    assert other.indices != sub.indices
    assert torch.equal(sub[3][0], full[sub.indices[3]][0])
    tiny = subset_fraction(full, 0.001)
    assert len(tiny) == 10  # at least one per class
    with pytest.raises(ValueError, match="fraction"):
        subset_fraction(full, 1.5)


def test_unlabelled_fraction_is_uniform(tmp_path):
    from PIL import Image

    for i in range(20):
        Image.new("RGB", (4, 4)).save(tmp_path / f"{i}.png")
    sub = get_dataset(f"imagefolder:{tmp_path},fraction=0.25")
    assert len(sub) == 5 and set(sub.targets) == {-1} and num_classes(sub) is None


def test_register_a_custom_dataset():
    class Tiny(Dataset):
        num_classes = 2

        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i, i % 2

    @register_dataset("test_only_tiny", keys=("k",), splits=("train",))
    def _tiny(root, split, transform, strict, k=1):
        return Tiny()

    assert len(get_dataset("test_only_tiny:k=2")) == 3
    assert not has_split("test_only_tiny", "test")


def test_dataset_len_needs_a_map_style_data_set():
    from torch.utils.data import IterableDataset

    from contrastive.data import dataset_len

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert dataset_len(get_dataset("shapes:n=20,size=8", split="train")) == 20
    with pytest.raises(TypeError, match="Stream has no len\\(\\): a map-style data set"):
        dataset_len(Stream())
