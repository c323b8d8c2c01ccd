"""Data sets and loaders: image folders, CIFAR, STL-10, generated shapes; reproducible loading.

Quick use::

    from contrastive.data import get_dataset, build_loader
    ds = get_dataset("shapes:n=2000,size=32", split="train", transform=pipeline)
    loader = build_loader(ds, batch_size=256, shuffle=True, num_workers=2, seed=0)

Spec strings (``--data``): see :mod:`contrastive.data.spec` (``shapes``, ``synthetic``,
``cifar10[:ROOT]``, ``cifar100``, ``stl10``, ``imagefolder:PATH``, ``PATH``, ``wds:DIR`` (tar shards); options
``key=value`` such as ``fraction=0.01``).
"""

from contrastive.data.base import UNLABELLED, LabelledDataset, dataset_len
from contrastive.data.captions import ImageTextDataset
from contrastive.data.cifar import CIFARDataset, STL10Dataset, default_root
from contrastive.data.decode import EncodedImage
from contrastive.data.download import DownloadError, download, extract_tar, unpack_image_folder
from contrastive.data.folder import ImageFolderDataset, resolve_folder_split
from contrastive.data.generated import (
    MASK_BACKGROUND,
    SHAPE_CLASSES,
    ShapesDataset,
    SyntheticDataset,
    generate_shape_masks,
    generate_shapes,
)
from contrastive.data.io import IMAGE_EXTENSIONS, CorruptImageError, is_image_file, load_rgb, to_rgb
from contrastive.data.loader import (
    SeededDataset,
    SeededSampler,
    build_loader,
    default_num_workers,
)
from contrastive.data.make_shards import write_shards
from contrastive.data.shards import ShardDataset
from contrastive.data.spec import (
    SPEC_HELP,
    UnknownDatasetError,
    get_dataset,
    has_split,
    list_datasets,
    num_classes,
    parse_spec,
    register_dataset,
)
from contrastive.data.subset import SubsetDataset, subset_fraction

__all__ = [
    "CIFARDataset",
    "CorruptImageError",
    "DownloadError",
    "EncodedImage",
    "IMAGE_EXTENSIONS",
    "ImageFolderDataset",
    "ImageTextDataset",
    "LabelledDataset",
    "MASK_BACKGROUND",
    "SHAPE_CLASSES",
    "SPEC_HELP",
    "STL10Dataset",
    "ShardDataset",
    "SeededDataset",
    "SeededSampler",
    "ShapesDataset",
    "SubsetDataset",
    "SyntheticDataset",
    "UNLABELLED",
    "UnknownDatasetError",
    "build_loader",
    "dataset_len",
    "default_num_workers",
    "default_root",
    "download",
    "extract_tar",
    "unpack_image_folder",
    "generate_shape_masks",
    "generate_shapes",
    "get_dataset",
    "has_split",
    "is_image_file",
    "list_datasets",
    "load_rgb",
    "num_classes",
    "parse_spec",
    "register_dataset",
    "resolve_folder_split",
    "subset_fraction",
    "to_rgb",
    "write_shards",
]
