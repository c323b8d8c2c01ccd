"""The image kit: runs on augmented views of images (every image recipe).

- configuration: :class:`ImageConfig` (what every run has, :class:`~contrastive.engine.config.RunConfig`,
  plus the encoder, crop size, augmentation path, kNN monitor and online probe), the recipe
  families :class:`CifarConfig` (solo-learn's CIFAR setup) and :class:`DIMConfig` (Deep InfoMax);
- data: :class:`ImageAdapter`, views from an augmentation pipeline, per image in the loader
  workers or batched on the device (``--batched-augment``, ``--decode device``), or a small
  data set held on the device, decoded once (``--resident``);
- the method's memory format: ``--channels-last`` resolved on the device
  (:func:`default_channels_last`) and applied to the built method;
- evaluators: :class:`KNNEvaluator` (``--knn-every``; ``contrastive-knn-eval``'s computation);
- beside the steps: the online probe and the images counter
  (:mod:`contrastive.engine.kits.image_probe`);
- artefacts: :class:`EncoderArtefacts`, ``encoder.pt`` (:func:`write_encoder`, also the
  image-text kit's image tower).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.data import Subset

from contrastive.augment.share import WHOLE, Share
from contrastive.engine.config import RunConfig, parse_json_object
from contrastive.engine.extras import add_extras, split_item
from contrastive.engine.fields import as_flag, help_field, override
from contrastive.engine.kits.base import Artefacts, HandOff, KitOptionError, StepHook
from contrastive.engine.kits.finetune import (
    FinetuneFields,
    backbone_groups,
    freeze_backbone_bn,
    resolve_finetune,
)
from contrastive.engine.kits.image_probe import ImageStepHook, build_probe
from contrastive.engine.kits.init import BackboneInit, InitFields
from contrastive.engine.loader import step_generator
from contrastive.engine.sharding import unsharded_type
from contrastive.eval.teacher import labelled_classes
from contrastive.methods.base import encoder_of, evaluated_encoder
from contrastive.records import ENCODER_FILE, EncoderRecord, RecordError

if TYPE_CHECKING:
    from contrastive.augment.device_crop import ResidentViews
    from contrastive.augment.pipeline import Pipeline
    from contrastive.engine.kits.image_text import ImageTextConfig
    from contrastive.methods.base import ParamGroup

__all__ = ["ImageConfig", "CifarConfig", "DIMConfig", "ImageAdapter", "KNNEvaluator",
           "ResidentKNNEvaluator", "subset_rows",
           "EncoderArtefacts", "build_knn_evaluator", "default_channels_last", "feature_fn",
           "make_batch", "prepare_views", "write_encoder"]

logger = logging.getLogger(__name__)


@dataclass
class ImageConfig(InitFields, FinetuneFields, RunConfig):
    """A run on images: the fields every run has (:class:`RunConfig`) and the image ones.
    Image recipes subclass it and change defaults / add fields."""

    data: str = help_field(
        "", "data spec: shapes | shapes:n=2000,size=32,seed=0 | synthetic | cifar10 | "
        "cifar10:/path | imagefolder:/path | /path (a folder; train/ and val/ or test/ inside "
        "are used when present); required")
    encoder: str = help_field("cifar_resnet18", "backbone name for create_encoder (timm:<m>, "
                              "torchvision:<m>, cifar_resnet18, cifar_resnet50, small_cnn)")
    encoder_kwargs: str = help_field(
        "", "create_encoder keyword arguments as a JSON object, e.g. a ViT at 32 px: "
        "'{\"img_size\": 32, \"patch_size\": 8}' (recorded in encoder.pt for evaluation)")
    image_size: int = help_field(224, "training crop size in pixels")
    batched_augment: str = help_field(
        "auto", "where the colour/blur/flip/normalise part of the augmentation runs: 'on' = "
        "batched on the training device (workers only decode + crop to uint8), 'off' = per "
        "image in the loader workers, 'auto' = on (faster on the CPU and the GPU alike)",
        choices=("auto", "on", "off"),
    )
    channels_last: bool | None = help_field(
        None, "channels_last memory format for convnets (faster on GPUs, and on AVX-512 CPUs with "
        "torch 2.14: +10 %% measured; split BN keeps the layout but runs slower in it than in "
        "NCHW: benchmarks/bench_split_bn.py). Unset: on for CUDA devices unless the recipe uses "
        "split BN, off on the CPU; config.json records the resolved value")
    pass_indices: bool = help_field(
        False, "MoCo recipes: store each queued key's data-set index beside it (queue_labels; "
        "the method then needs batch['indices']): diagnostics, tests")
    decode: str = help_field(
        "worker", "where JPEGs are decoded: 'worker' = in the loader workers (libjpeg-turbo), "
        "'device' = on the training device in one batched call per step (nvJPEG on CUDA through "
        "torchvision; the workers only read the file bytes and draw the crop boxes); needs "
        "--batched-augment on/auto", choices=("worker", "device"))
    resident: bool = help_field(
        False, "decode the whole training split once into one uint8 tensor on the training "
        "device (small images of one size: CIFAR's 50,000 x 32 px are 154 MB); the loader then "
        "carries indices, the crops are cut there (roi_align, as --decode device) and the kNN "
        "monitor encodes the same tensors. Needs random-resized-crop views and the batched "
        "augmentation")

    # --- online kNN monitor ---------------------------------------------------------------
    knn_every: int = help_field(0, "weighted-kNN top-1 on the held-out labelled split every N "
                                "epochs (0 = off; also off when the data has no labels)")
    knn_at_start: bool = help_field(True, "also measure kNN before training (random init)")
    knn_k: int = help_field(200, "kNN neighbours")
    knn_t: float = help_field(0.1, "kNN temperature: weights exp(sim / t)")
    knn_max_train: int = help_field(0, "memory-bank images for kNN (0 = whole train split)")
    knn_max_test: int = help_field(0, "held-out images for kNN (0 = whole split)")
    knn_feature: str = help_field("backbone", "kNN on 'backbone' features or the method's "
                                  "'head' output when it has one", choices=("backbone", "head"))
    online_probe: bool = help_field(
        False, "train a linear classifier on detached backbone features of the first view beside "
        "the method (its own SGD; the encoder is untouched) and log its top-1 on each batch "
        "before it learns from it (probe_top1); costs one extra forward pass per step")
    probe_lr: float = help_field(0.1, "online probe: SGD learning rate (momentum 0.9, no decay)")

    def encoder_options(self) -> dict[str, Any]:
        """Keyword arguments the recipe passes to ``create_encoder`` beyond the name: the
        ``--encoder-kwargs`` JSON (recipes may add their own fields); recorded in ``encoder.pt``
        so that evaluation rebuilds the same architecture."""
        return parse_json_object("encoder_kwargs", self.encoder_kwargs)

    def validate(self) -> None:
        """The checks of every run, and the image fields'."""
        super().validate()
        if not self.data:
            raise ValueError("--data is required (e.g. --data shapes, --data cifar10, "
                             "--data /path/to/imagenet)")
        for name in ("image_size", "knn_k"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{as_flag(name)} must be positive, got {getattr(self, name)}")
        for name in ("knn_every", "knn_max_train", "knn_max_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{as_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.resident and (self.batched_augment == "off" or self.decode == "device"):
            raise ValueError("--resident crops and augments on the device: use it with "
                             "--batched-augment on (or auto) and --decode worker")
        if self.decode == "device" and self.batched_augment == "off":
            raise ValueError("--decode device needs the batched augmentation: use --batched-augment "
                             "on (or auto) with it, or --decode worker with --batched-augment off")
        self.encoder_options()  # a bad --encoder-kwargs JSON fails here


@dataclass
class CifarConfig(ImageConfig):
    """The CIFAR-10 training setup that solo-learn's configurations share (vturrisi/solo-learn,
    ``scripts/pretrain/cifar/*.yaml``), the source of our CIFAR recipes where a paper gives none:
    CIFAR-stem ResNet-18 at 32 px, batch 256, 1000 epochs, 10 warmup epochs then cosine, LARS
    with trust coefficient 0.02 where a recipe picks LARS, SyncBN across GPU processes, a kNN
    monitor every 10 epochs. Recipes subclass it with their optimiser, lr, decay and heads."""

    data: str = "cifar10"
    encoder: str = "cifar_resnet18"
    image_size: int = 32
    epochs: int = 1000
    batch_size: int = 256
    warmup_epochs: float = 10
    lars_trust_coeff: float = override(0.02, "solo-learn: eta 0.02")
    sync_bn: bool = override(True, "global BN across GPU processes")
    knn_every: int = 10
    crop_min: float = help_field(
        0.08, "RandomResizedCrop minimum scale of the two views (solo-learn's CIFAR "
        "configurations: 0.08, SimSiam and VICReg 0.2); 1.0 keeps the whole image (learning "
        "checks on shapes). The multi-crop pipelines (--local-crops) keep their own scales")

    #: the scales a recipe's multi-crop pipeline keeps (``--local-crops`` > 0), where it does
    #: not read ``--crop-min``: a --crop-min given then is refused, not silently ignored
    multicrop_scales: ClassVar[str | None] = None

    def validate(self) -> None:
        """The base checks, ``--crop-min`` in (0, 1], and no --crop-min a multi-crop pipeline
        would ignore."""
        super().validate()
        if not 0.0 < self.crop_min <= 1.0:
            raise ValueError(f"--crop-min must be in (0, 1] (a fraction of the image area), "
                             f"got {self.crop_min}")
        default = next(f.default for f in dataclasses.fields(self) if f.name == "crop_min")
        if (self.multicrop_scales and getattr(self, "local_crops", 0) > 0
                and self.crop_min != default):
            raise ValueError(f"--crop-min {self.crop_min} is not used with --local-crops: the "
                             f"multi-crop views keep their scales ({self.multicrop_scales}); "
                             "drop --crop-min, or --local-crops 0 for two views")


@dataclass
class DIMConfig(ImageConfig):
    """What Deep InfoMax's recipes share (Hjelm et al., ICLR 2019; the authors' rdevon/DIM):
    Adam at a constant lr 1e-4 with cortex's betas (0.5, 0.999) and no weight decay (AdamW with
    weight decay 0 is Adam exactly), batch 64, and the method's fields (MI units, estimator,
    local stage). ``recipes/dim_cifar.py`` and ``recipes/dim_stl.py`` add their data and views."""

    batch_size: int = override(64, "the code's batch_size=64")
    optimizer: str = override("adamw", "Adam: AdamW with --weight-decay 0 is Adam exactly")
    lr: float = override(1e-4, "absolute (--lr-scaling none): the code's learning_rate")
    lr_scaling: str = override("none", "lr is absolute")
    lr_schedule: str = override("constant", "the code keeps the lr constant")
    weight_decay: float = override(0.0, "none in the code")
    betas: tuple[float, float] = override((0.5, 0.999), "cortex's Adam betas")

    mi_units: int = help_field(2048, "units of the MI networks (models/dim.py LocalDIM)")
    estimator: str = help_field("infonce", "MI estimator: infonce (the paper's best DIM(L)) or "
                                "jsd (the code's default)", choices=("infonce", "jsd"))
    local_stage: str = help_field(
        "auto", "stage of the local feature map: 'auto' = the encoder's own (dcgan32: 1, "
        "dcgan64 and alexnet64: 2; other encoders: -2) or an index into its stages")

    def local_stage_index(self) -> int | None:
        """``--local-stage``: 'auto' -> None (the encoder's own), else the int stage index."""
        if self.local_stage == "auto":
            return None
        try:
            return int(self.local_stage)
        except ValueError:
            raise ValueError(f"--local-stage must be 'auto' or an int stage index, got "
                             f"{self.local_stage!r}") from None

    def validate(self) -> None:
        """The base checks, a valid ``--local-stage``, ``--mi-units`` >= 1, batch >= 2."""
        super().validate()
        self.local_stage_index()
        if self.mi_units < 1:
            raise ValueError(f"--mi-units must be positive, got {self.mi_units}")
        if self.batch_size < 2:
            raise ValueError("--batch-size must be >= 2: DIM's negatives are the other images")


def prepare_views(views: list[Tensor] | Tensor, device: torch.device,
                  device_fn: Callable[..., list[Tensor]] | None, *, seed: int, step: int,
                  micro: int, share: Share = WHOLE, channels_last: bool = False,
                  float64: bool = False,
                  resident: Callable[..., list[Tensor]] | None = None) -> list[Tensor]:
    """The loader's views on the device: augmented there in a batch (``device_fn``, seeded by
    the position in the run; ``views`` are process ``share``'s rows of the global micro-batch),
    in channels_last / float64 when asked. With ``resident``
    (:class:`~contrastive.augment.device_crop.ResidentViews`) ``views`` is the batch's indices
    and the crops are cut from the device's copy of the data set, from the same generator."""
    gen = (step_generator(device, seed, step, micro)
           if device_fn is not None or resident is not None else None)
    if resident is not None:
        assert isinstance(views, Tensor)
        views = resident(views.to(device, non_blocking=True), gen, share)  # uint8 (B, 3, S, S)
    else:
        views = [v.to(device, non_blocking=True) for v in views]
    if device_fn is not None:
        views = device_fn(views, generator=gen, share=share)
    if channels_last:
        views = [v.contiguous(memory_format=torch.channels_last) for v in views]
    if float64:
        views = [v.double() for v in views]
    return views


def make_batch(views: list[Tensor], sample: tuple[Any, ...], needs: tuple[str, ...],
               sched: dict[str, float], device: torch.device) -> dict[str, Any]:
    """The method's batch: the prepared ``views``, the per-sample fields of the loader's
    ``sample`` = ``(views, labels, indices)`` (or ``(views, labels, fields, indices)`` from a
    data set with extra fields, e.g. CLIP's ``input_ids``) the method ``needs``, and the
    schedule values."""
    _, labels, indices, fields = split_item(sample)
    batch: dict[str, Any] = {"views": views, **sched}
    if "labels" in needs:
        batch["labels"] = labels.to(device, non_blocking=True)
    if "indices" in needs:
        batch["indices"] = indices.to(device, non_blocking=True)
    add_extras(batch, fields, needs, device)
    return batch


class ImageAdapter:
    """Views of images from an augmentation ``pipeline`` (:class:`contrastive.augment.Pipeline`):
    per image in the loader workers, or its worker half there and the rest batched on the device
    (``--batched-augment``). Throughput in images/s; the kNN monitor; ``encoder.pt``."""

    unit = "images"

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = self._recipe_pipeline = pipeline
        self.device_fn: Callable[..., list[Tensor]] | None = None
        self.artefacts: Artefacts[ImageConfig] = EncoderArtefacts(pipeline)
        self._cfg: ImageConfig | None = None
        self._prepared: ImageConfig | None = None
        self.init = BackboneInit()  # --init, resolved by prepare
        self._told = False  # warned that the workers decoded a whole micro-batch
        self._size = 0
        self._num_classes: int | None = None
        self.resident: ResidentViews | None = None  # --resident: the crops on the device
        self._resident_labels = torch.zeros(0, dtype=torch.long)

    @property
    def cfg(self) -> ImageConfig:
        """The run's configuration (known from :meth:`train_set` on)."""
        assert self._cfg is not None, "ImageAdapter: train_set() first"
        return self._cfg

    def prepare(self, cfg: ImageConfig) -> None:
        """``--init``: the weights read and checked (one-line :class:`InitError` otherwise)
        before the run folder exists, and the fine-tuning flags resolved by it; nothing to do
        again for an equal ``cfg``."""
        if self._prepared is not None and self._prepared == cfg:
            return
        self.pipeline, self.artefacts = self._recipe_pipeline, EncoderArtefacts(
            self._recipe_pipeline)
        weights = self.init.resolve(cfg)
        resolve_finetune(cfg, pretrained=weights is not None)  # a bad value: one line, here
        self._normalise_as_init()
        self._prepared = cfg

    def _normalise_as_init(self) -> None:
        """The views normalised as the ``--init`` weights were trained (training, the kNN
        monitor, the online probe and ``encoder.pt``, which the eval CLIs read), when the
        source records it or ``--init-mean/--init-std`` give it; else the recipe's
        (:meth:`BackboneInit.normalisation`)."""
        ours = (self.pipeline.mean, self.pipeline.std)
        mean, std = self.init.normalisation(ours)
        if (mean, std) != ours:
            self.pipeline = self.pipeline.with_normalisation(mean, std)
            self.artefacts = EncoderArtefacts(self.pipeline)

    def method_building(self, cfg: ImageConfig) -> contextlib.AbstractContextManager[None]:
        """With ``--init``: every ``--encoder`` backbone the recipe's method creates starts from
        the weights, so its copies do too (:meth:`BackboneInit.building`)."""
        return self.init.building(cfg.encoder)

    def train_set(self, cfg: ImageConfig, accelerator: Any) -> Any:
        from contrastive.data import get_dataset

        self._cfg = cfg  # validated: --decode device comes with the batched augmentation
        transform: Any = self.pipeline
        if getattr(self.pipeline, "crop_boxes", False) and cfg.batched_augment == "off":
            raise ValueError("this recipe's views come with their crop boxes, which only the "
                             "batched augmentation returns: drop --batched-augment off")
        if cfg.batched_augment != "off":
            transform, self.device_fn = self.pipeline.split(decode=cfg.decode)
        if cfg.resident:
            return self._resident_set(cfg, accelerator)
        ds: Any = get_dataset(cfg.data, "train", transform=transform, strict=cfg.strict_data)
        self._size = len(ds)
        self._num_classes = labelled_classes(ds)
        logger.info("JPEG decoding: %s", "on the training device (the workers read the bytes "
                    "and draw the crop boxes; other images are cropped in the workers)"
                    if cfg.decode == "device" else "in the loader workers")
        if cfg.decode == "device" and accelerator.device.type == "cuda":
            logger.info("--decode device spends GPU time on decoding: on one H200 (2026-11-27) "
                        "moco_r50 trained at 2,819 images/s with it and 3,599 with the workers "
                        "decoding (benchmarks/RESULTS.md, 'GPU'); use it when the workers are "
                        "the limit (data_wait_frac in metrics.jsonl)")
        return ds

    def _resident_set(self, cfg: ImageConfig, accelerator: Any) -> Any:
        """``--resident``: the training split decoded once (:func:`~contrastive.data.resident.
        decode_split`), its images on the training device, the loader's items their indices."""
        from contrastive.augment.device_crop import ResidentViews
        from contrastive.data import get_dataset
        from contrastive.data.resident import ResidentImages, decode_split

        if getattr(self.pipeline, "crop_boxes", False):
            raise KitOptionError("--resident does not return crop boxes (VICRegL needs them): "
                                 "drop --resident")
        base = get_dataset(cfg.data, "train", strict=cfg.strict_data)
        try:
            images, labels = decode_split(base, num_workers=cfg.num_workers,
                                          progress=cfg.progress and accelerator.is_main_process)
            self.resident = ResidentViews(images.to(accelerator.device), self.pipeline.views)
        except ValueError as e:  # images of several sizes, too many, a view it cannot crop
            raise KitOptionError(str(e)) from None
        self._resident_labels = labels
        ds = ResidentImages(base, images, labels)
        self._size = len(ds)
        self._num_classes = labelled_classes(ds)
        logger.info("--resident: %d training images (%s) on %s; crops and augmentation there",
                    len(ds), "x".join(map(str, images.shape[1:])), accelerator.device)
        return ds

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int,
              world: int = 1) -> dict[str, Any]:
        from contrastive.augment.device_decode import DeviceDecodeBatch, decode_and_crop

        cfg = self.cfg
        views, crops = sample[0], {}
        if self.resident is not None:  # the batch's indices; the images are on the device
            batch = make_batch(prepare_views(
                views, device, self.device_fn, seed=cfg.seed, step=step, micro=micro,
                share=Share(rank, world), channels_last=bool(cfg.channels_last), float64=cfg.float64,
                resident=self.resident), sample, needs, sched, device)
            return batch
        if isinstance(views, Mapping):  # a pipeline with crop_boxes: {"views", "crop_boxes"}
            views, crops = views["views"], {"crop_boxes": views["crop_boxes"]}
        if isinstance(views, DeviceDecodeBatch):
            if not len(views.encoded) and not self._told:
                self._told = True
                logger.warning("--decode device: this micro-batch came decoded from the workers "
                               "(the data set hands decoded images, or none of them is a plain "
                               "JPEG): --decode device pays only on JPEG files or shards")
            views = decode_and_crop(views, self.pipeline.view_sizes, device)
        views = prepare_views(views, device, self.device_fn, seed=cfg.seed, step=step,
                              micro=micro, share=Share(rank, world),
                              channels_last=bool(cfg.channels_last),
                              float64=cfg.float64)
        batch = make_batch(views, sample, needs, sched, device)
        add_extras(batch, crops, needs, device)
        return batch

    def count(self, batch: dict[str, Any]) -> Tensor | None:
        return None

    def prepare_method(self, cfg: ImageConfig, method: nn.Module,
                       device: torch.device) -> nn.Module:
        """``--freeze-bn-stats`` (:mod:`~contrastive.engine.kits.finetune`) applied to the
        backbones and their copies; ``--channels-last``: resolved on ``cfg`` (the run's copy,
        which config.json records) when unset (:func:`default_channels_last`), then applied to
        the method."""
        freeze_backbone_bn(method, self.init.backbones,
                           resolve_finetune(cfg, pretrained=self.init.weights is not None))
        if cfg.channels_last is None:
            cfg.channels_last = default_channels_last(method, device)
        if not cfg.channels_last:
            return method
        if _has_split_bn(method):
            logger.warning("--channels-last with split BN: split BN regroups the batch with two "
                           "copies per layer in channels_last (none in NCHW), slower than NCHW "
                           "on the CPU and on GPUs (benchmarks/bench_split_bn.py measures it)")
        return method.to(memory_format=torch.channels_last)

    def param_groups(self, cfg: ImageConfig, method: nn.Module) -> list[ParamGroup]:
        """``--backbone-lr-scale`` and ``--backbone-frozen-steps``: the backbones' group
        (:func:`~contrastive.engine.kits.finetune.backbone_groups`; none when they are off)."""
        return backbone_groups(self.init.backbones,
                               resolve_finetune(cfg, pretrained=self.init.weights is not None))

    def evaluators(self, cfg: ImageConfig, world: int) -> list[Any]:
        resident = (None if self.resident is None
                    else (self.resident.images, torch.as_tensor(self._resident_labels)))
        knn = build_knn_evaluator(cfg, self.pipeline, world, resident)
        return [] if knn is None else [knn]

    def resolved(self) -> dict[str, Any]:
        mean, std = self.pipeline.mean, self.pipeline.std  # what the eval CLIs read back
        normalisation = ({"normalisation": {"mean": list(mean), "std": list(std)}}
                         if mean is not None and std is not None else {})
        return {"batched_augment": self.device_fn is not None, "decode": self.cfg.decode,
                "train_images": self._size, "encoder_kwargs": self.cfg.encoder_options(),
                **normalisation, **self.init.resolved()}

    def describe(self) -> str:
        text = "augmentation " + ("batched on device" if self.device_fn is not None
                                  else "per image")
        return text + (", decode on device" if self.cfg.decode == "device" else "")

    def step_hook(self, cfg: ImageConfig, module: torch.nn.Module, train_set: Any,
                  device: torch.device) -> StepHook:
        return ImageStepHook(build_probe(cfg, module, train_set, device), cfg.batch_size)

    def embedding_map_data(self) -> str | None:
        return self.cfg.data

    def handoff(self) -> HandOff:
        return {"num_classes": self._num_classes, "pipeline": self.pipeline}


def default_channels_last(method: nn.Module, device: torch.device) -> bool:
    """``--channels-last`` when unset: on CUDA devices (cuDNN's fast convolution layout, the
    tensor cores' too), except for a method with split BN (MoCo's ``--split-bn`` > 1): it keeps
    channels_last (:class:`~contrastive.nn.norm.SplitBatchNorm2d`) but regroups the batch with
    two copies per layer, where NCHW regroups with a free view, and the encoder's step measured
    slower than in NCHW (``benchmarks/bench_split_bn.py``); off on the CPU."""
    return device.type == "cuda" and not _has_split_bn(method)


def _has_split_bn(method: nn.Module) -> bool:
    from contrastive.nn.norm import SplitBatchNorm2d

    return any(isinstance(m, SplitBatchNorm2d) for m in method.modules())


class KNNEvaluator:
    """Weighted-kNN top-1 (``knn_top1``, %) of the ``feature`` features (``--knn-feature``:
    ``backbone`` or ``head``) every ``every`` epochs: the InstDisc / MoCo-CIFAR-demo protocol,
    bank = the training split under the evaluation transform, queries = the held-out split.

    Computed by :func:`contrastive.eval.runner.knn_on_splits`, the very function behind
    ``contrastive-knn-eval``: the figure equals the command's on the same encoder, data, crop
    size and batch size by construction. Features in eval mode (the loop sets it) without
    gradients, every process gets all rows (``gather_for_metrics``).

    Args:
        bank_set, query_set: labelled data sets yielding (eval view, label).
        k, t: neighbours and temperature. max_bank, max_query: random subsets (seed 0; 0 = all).
        batch_size, num_workers: extraction loader settings (per process).
    """

    name, per = "knn", "epoch"

    def __init__(self, bank_set: Any, query_set: Any, *, k: int = 200, t: float = 0.1,
                 max_bank: int = 0, max_query: int = 0, batch_size: int = 256,
                 num_workers: int = 0, num_classes: int | None = None, every: int = 1,
                 at_start: bool = False, feature: str = "backbone",
                 channels_last: bool = False) -> None:
        self.bank_set = _subset(bank_set, max_bank)
        self.query_set = _subset(query_set, max_query)
        self.k, self.t, self.num_classes = k, t, num_classes
        self.batch_size, self.num_workers = batch_size, num_workers
        self.every, self.at_start = every, at_start
        self.feature, self.channels_last = feature, channels_last

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        return {"knn_top1": self.top1(feature_fn(module, self.feature), accelerator)}

    @torch.no_grad()
    def top1(self, encode: Callable[[Tensor], Tensor], accelerator: Any) -> float:
        """Top-1 (%) of any feature function ``encode`` (the caller sets the eval mode)."""
        from contrastive.eval.runner import knn_on_splits

        res = knn_on_splits(
            encode, self.bank_set, self.query_set, k=self.k, temperature=self.t,
            num_classes=self.num_classes, batch_size=self.batch_size,
            num_workers=self.num_workers, accelerator=accelerator, progress=False,
            device_transform=_channels_last if self.channels_last else None,
            what="the kNN monitor")
        return float(res["accuracy"]["top1"])


class ResidentKNNEvaluator(KNNEvaluator):
    """:class:`KNNEvaluator` on images held on the device (``--resident``): the bank is the
    training split's tensor (no second decoding), the queries the held-out split decoded once;
    both are normalised as the evaluation transform does (whose centre crop is the identity
    here: images of the crop size, ``crop_pct`` 1), encoded in batches under the run's autocast
    and searched with the torch back-end on the device (no faiss needed; it returns faiss's
    neighbours, tests/eval/test_knn.py). Every process computes the whole figure.

    Args:
        bank, query: uint8 (N, 3, S, S) images on the device and their labels (N,).
        normalise: uint8 batch -> float batch (the evaluation pipeline's device half).
        other arguments: as :class:`KNNEvaluator`.
    """

    def __init__(self, bank: tuple[Tensor, Tensor], query: tuple[Tensor, Tensor], *,
                 normalise: Callable[[Tensor], Tensor], k: int = 200, t: float = 0.1,
                 max_bank: int = 0, max_query: int = 0, batch_size: int = 256,
                 num_classes: int | None = None, every: int = 1, at_start: bool = False,
                 feature: str = "backbone", channels_last: bool = False) -> None:
        super().__init__([], [], k=k, t=t, batch_size=batch_size, num_classes=num_classes,
                         every=every, at_start=at_start, feature=feature,
                         channels_last=channels_last)
        rows = [subset_rows(len(bank[1]), max_bank), subset_rows(len(query[1]), max_query)]
        self.bank, self.query = [(x[r], y[r]) if r is not None else (x, y)
                                 for (x, y), r in zip((bank, query), rows)]
        self.normalise = normalise

    def _features(self, encode: Callable[[Tensor], Tensor], images: Tensor,
                  accelerator: Any) -> Tensor:
        from contrastive.eval.features import extract_features
        from contrastive.eval.runner import autocast_dtype

        def transform(x: Tensor) -> Tensor:
            x = self.normalise(x)
            return _channels_last(x) if self.channels_last else x

        chunks = [(images[i:i + self.batch_size], torch.zeros(0))
                  for i in range(0, len(images), self.batch_size)]
        feats, _ = extract_features(encode, chunks, device=accelerator.device,
                                    device_transform=transform,
                                    autocast_dtype=autocast_dtype(accelerator))
        return feats.to(accelerator.device)

    @torch.no_grad()
    def top1(self, encode: Callable[[Tensor], Tensor], accelerator: Any) -> float:
        from contrastive.eval.knn import knn_accuracy

        (xb, yb), (xq, yq) = self.bank, self.query
        bank, query = self._features(encode, xb, accelerator), self._features(encode, xq, accelerator)
        acc = knn_accuracy(bank, yb.to(bank.device), query, yq.to(bank.device),
                           k=min(self.k, len(yb)), temperature=self.t,
                           num_classes=self.num_classes, backend="torch")
        return float(acc["top1"])


def feature_fn(module: nn.Module, which: str) -> Callable[[Tensor], Tensor]:
    """The features the kNN evaluator sees: the backbone the method is evaluated by
    (``which="backbone"``, :func:`~contrastive.methods.base.evaluated_encoder`: DINO's teacher)
    or the trained backbone's head/projector output (``"head"``); inputs cast to float64 for a
    ``--float64`` model."""
    encode: Callable[[Tensor], Tensor]
    if which == "head":
        head = getattr(module, "head", None) or getattr(module, "projector", None)
        if head is None:
            raise ValueError(f"--knn-feature head: {type(module).__name__} has no head/projector")
        backbone = encoder_of(module)

        def encode(x: Tensor) -> Tensor:
            return head(backbone(x))
    else:
        encode = evaluated_encoder(module)
    if any(p.dtype == torch.float64 for p in encoder_of(module).parameters()):  # --float64
        inner = encode
        return lambda x: inner(x.double())
    return encode


def _channels_last(x: Tensor) -> Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def subset_rows(n: int, limit: int) -> list[int] | None:
    """``limit`` of ``n`` rows drawn at random (seed 0), in increasing order; None (all) when
    ``limit`` is 0 or >= n. Random, not evenly spaced: a stride would alias with data sets
    whose labels cycle with the index (``shapes``: label = index % 10)."""
    if limit <= 0 or limit >= n:
        return None
    g = torch.Generator().manual_seed(0)
    return sorted(torch.randperm(n, generator=g)[:limit].tolist())


def _subset(ds: Any, limit: int) -> Any:
    """``limit`` items of ``ds`` (:func:`subset_rows`); ``ds`` itself for all."""
    rows = subset_rows(len(ds), limit)
    return ds if rows is None else Subset(ds, rows)


def build_knn_evaluator(cfg: ImageConfig, pipeline: Any, world: int,
                        resident: tuple[Tensor, Tensor] | None = None) -> KNNEvaluator | None:
    """The kNN evaluator (``--knn-every``), or None when off or the data has no labelled
    held-out split. Bank and queries use the evaluation transform with the pipeline's
    normalisation, as ``contrastive-knn-eval`` on the finished run does. ``resident``: the
    training split's images on the device and their labels (``--resident``): a
    :class:`ResidentKNNEvaluator` when the evaluation transform leaves them as they are."""
    if not cfg.knn_every:
        return None
    from contrastive.augment import get_pipeline
    from contrastive.data import get_dataset, has_split, num_classes

    if not has_split(cfg.data, "test"):
        logger.info("kNN monitor off: --data %s has no held-out labelled split", cfg.data)
        return None
    norm = {k: getattr(pipeline, k) for k in ("mean", "std") if hasattr(pipeline, k)}
    eval_tf = get_pipeline("eval", image_size=cfg.image_size, **norm)
    bank = get_dataset(cfg.data, "train", transform=eval_tf, strict=cfg.strict_data)
    query = get_dataset(cfg.data, "test", transform=eval_tf, strict=cfg.strict_data)
    n_cls = num_classes(bank)
    if n_cls is None:
        logger.info("kNN monitor off: --data %s has no labels", cfg.data)
        return None
    side = cfg.image_size
    if resident is not None and (resident[0].shape[-2:] != (side, side)
                                 or eval_tf.views[0].resize_size() != side):
        logger.info("kNN monitor: the training images are %s, the evaluation transform resizes "
                    "them: it decodes both splits from the files", tuple(resident[0].shape[-2:]))
        resident = None
    if resident is not None:
        from contrastive.data.resident import decode_split

        query_set = get_dataset(cfg.data, "test", strict=cfg.strict_data)
        xq, yq = decode_split(query_set, num_workers=cfg.num_workers, progress=cfg.progress,
                              what="the held-out split")
        normalise = eval_tf.split()[1]
        return ResidentKNNEvaluator(
            resident, (xq.to(resident[0].device), yq), normalise=lambda x: normalise([x], generator=torch.Generator().manual_seed(0))[0],
            k=cfg.knn_k, t=cfg.knn_t, max_bank=cfg.knn_max_train, max_query=cfg.knn_max_test,
            batch_size=max(cfg.batch_size // world, 64) * 4, num_classes=n_cls,
            every=cfg.knn_every, at_start=cfg.knn_at_start, feature=cfg.knn_feature,
            channels_last=bool(cfg.channels_last))
    return KNNEvaluator(bank, query, k=cfg.knn_k, t=cfg.knn_t, max_bank=cfg.knn_max_train,
                        max_query=cfg.knn_max_test, batch_size=max(cfg.batch_size // world, 64),
                        num_workers=min(cfg.num_workers, 4), num_classes=n_cls,
                        every=cfg.knn_every, at_start=cfg.knn_at_start, feature=cfg.knn_feature,
                        channels_last=bool(cfg.channels_last))


def write_encoder(out: Path, cfg: ImageConfig | ImageTextConfig, module: nn.Module,
                  pipeline: Any, recipe: str,
                  step: int) -> Path:
    """``<out>/encoder.pt``: the backbone the method is evaluated by
    (:func:`~contrastive.methods.base.evaluated_encoder`: the trained ``encoder``, DINO's
    teacher's) as a :class:`~contrastive.records.EncoderRecord`
    with the ``create_encoder`` kwargs, the crop size and the pipeline's normalisation (which
    evaluation uses by default)."""
    record = EncoderRecord.from_module(
        evaluated_encoder(module), cfg.encoder, encoder_kwargs=cfg.encoder_options(),
        mean=getattr(pipeline, "mean", None), std=getattr(pipeline, "std", None),
        image_size=cfg.image_size, step=step, recipe=recipe,
        method=unsharded_type(module).__name__)  # MoCoV3, not FSDP's FSDPMoCoV3 (--fsdp)
    return record.save(out / ENCODER_FILE)


def encoder_step(out: Path) -> int | None:
    """The ``step`` recorded in ``<out>/encoder.pt`` (None if absent or unreadable)."""
    try:
        return EncoderRecord.load(out / ENCODER_FILE, mmap=True).step
    except (RecordError, OSError):
        return None


class EncoderArtefacts:
    """``encoder.pt`` with ``pipeline``'s normalisation."""

    what = "encoder weights"

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def write(self, out: Path, cfg: ImageConfig, module: nn.Module, recipe: str,
              step: int) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        return write_encoder(out, cfg, module, self.pipeline, recipe, step)

    def step_of(self, out: Path) -> int | None:
        return encoder_step(out)

    def main_file(self, out: Path) -> Path:
        return out / ENCODER_FILE
