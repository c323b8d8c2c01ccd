"""The labelled-image kit: fine-tuning an image encoder with a classification head
(``contrastive-finetune``, :mod:`contrastive.launch.finetune`), the image twin of
:mod:`~contrastive.engine.kits.labelled_text`.

- configuration: :class:`LabelledImageConfig` (the data, the starting weights through
  ``--init``, the held-out validation part, the low-label subset and the regularisers of the
  fine-tuning protocols; :mod:`contrastive.launch.finetune` sets each protocol's defaults);
- data: :class:`LabelledImageAdapter`, one view per image from timm's transforms
  (``timm.data.create_transform``: random-resized crop and flip, RandAugment and random erasing
  when asked), mixup / cutmix on the device (``timm.data.Mixup``, seeded by the position in the
  run, so a resume is exact), the training split cut into training and validation images
  (:func:`split_indices`);
- the optimiser's groups: layer-wise lr decay (:func:`layer_decay_groups`, layer ids by MAE's
  rule for ViTs, from timm's ``group_matcher`` otherwise) and the backbone controls of
  :mod:`~contrastive.engine.kits.finetune`, through the kit seam ``param_groups``;
- evaluators: :class:`TopKEvaluator` (``val_top1`` / ``val_top5`` on the held-out part);
- artefacts: :class:`FinetunedArtefacts`, ``classifier/`` (the fine-tuned classifier in its
  encoder's family) and ``results.json`` (validation, and the test split scored once when the
  run ends).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from contrastive.engine.config import RunConfig, parse_json_object
from contrastive.engine.fields import help_field, override
from contrastive.engine.kits.base import HandOff, KitDefaults
from contrastive.engine.kits.finetune import (
    FinetuneFields,
    FinetuneSettings,
    backbone_groups,
    freeze_backbone_bn,
    resolve_finetune,
)
from contrastive.engine.kits.init import BackboneInit, InitFields
from contrastive.records import BEST_DIR, RESULTS_FILE

if TYPE_CHECKING:
    from contrastive.methods.base import ParamGroup

__all__ = ["save_classifier", "load_finetuned", "LabelledImageConfig", "LabelledImageAdapter", "TopKEvaluator", "FinetunedArtefacts",
           "CLASSIFIER_DIR", "split_indices", "read_subset_file", "layer_ids",
           "layer_decay_groups"]

logger = logging.getLogger(__name__)

#: the fine-tuned classifier's folder in the run folder
CLASSIFIER_DIR = "classifier"
#: timm model-name prefixes of the ViT family, whose fine-tuning protocol has layer-wise lr decay
VIT_FAMILIES = ("vit_", "deit", "beit", "eva", "vitamin")
#: our own encoders' classifier description in ``classifier/`` (timm's: ``config.json``)
OURS_FILE = "classifier.json"


@dataclass
class LabelledImageConfig(InitFields, FinetuneFields, RunConfig):
    """Fine-tuning on labelled images: the data, the starting weights (``--init``), the
    held-out validation images, the low-label subset, and the fine-tuning regularisers. The
    protocol classes of :mod:`contrastive.launch.finetune` set the optimiser's and these
    defaults."""

    data: str = help_field(
        "", "labelled images: a folder with class subfolders (train/ and val/ or test/ inside "
        "are used when present) | imagefolder:/path | cifar10[:/path] | wds:/shards | "
        "shapes (generated); required")
    protocol: str = help_field("vit", "the fine-tuning protocol whose defaults apply",
                               choices=("vit", "sgd"))
    encoder: str = help_field(
        "", "the backbone's create_encoder name (timm:<m>, torchvision:<m>, cifar_resnet18, "
        "small_cnn); empty = the one --init records")
    encoder_kwargs: str = help_field(
        "", "create_encoder keyword arguments as JSON; empty = those --init records")
    image_size: int = help_field(0, "crop size in pixels; 0 = the size --init records, else "
                                 "224")
    data_seed: int = help_field(0, "seed of the validation split and the label subset")
    val_fraction: float = help_field(
        0.1, "hold this class-balanced fraction of the training images out (never trained "
        "on): val_top1 / val_top5 there choose hyper-parameters; 0 = none")
    label_fraction: float = help_field(
        1.0, "train on this class-balanced fraction of the training labels (0.01, 0.1: "
        "SimCLR's 1 %% / 10 %%; --data-seed draws it)")
    subset_file: str = help_field(
        "", "train on the images this file lists, one a line: a path relative to the split's "
        "folder (as SimCLR's ImageNet 1 %% / 10 %% lists) or an index into the split")
    eval_every: int = help_field(0, "validation every N optimiser steps (0 = at the end)")
    # the published fine-tuning protocols train the whole network at one lr (MAE: with layer
    # decay) and BatchNorm as in training (SimCLR appendix B.5); --init's defaults for
    # continued pretraining (a 0.1 backbone lr, frozen BN statistics) are not theirs
    backbone_lr_scale: float | None = override(1.0, "the protocols' (one lr; MAE: layer decay)")
    freeze_bn_stats: bool | None = override(False, "the protocols' (BatchNorm trains)")
    eval_batch_size: int = help_field(256, "images per batch of the evaluation")
    drop_path: float | None = help_field(
        None, "stochastic depth rate of a timm encoder (timm's drop_path_rate); unset = the "
        "protocol's for timm encoders, 0 for ours")
    layer_decay: float | None = help_field(
        None, "layer-wise lr decay: a layer's lr is decay ** (depth - layer) x the run's (BEiT, "
        "MAE: a ViT's block i is layer i + 1, the final norm and head the top; other timm "
        "models: timm's group_matcher); unset = the protocol's for timm ViTs, 1 (off) for "
        "other encoders")
    auto_augment: str = help_field("", "timm's auto-augment policy, e.g. rand-m9-mstd0.5-inc1 "
                                   "(RandAugment); empty = none")
    reprob: float = help_field(0.0, "random erasing probability (timm's, mode pixel)")
    hflip: float = help_field(0.5, "horizontal flip probability")
    crop_min: float = help_field(0.08, "RandomResizedCrop minimum scale")
    mixup: float = help_field(0.0, "mixup alpha (0 = off)")
    cutmix: float = help_field(0.0, "cutmix alpha (0 = off)")
    smoothing: float = help_field(0.0, "label smoothing")

    def encoder_options(self) -> dict[str, Any]:
        """``--encoder-kwargs`` as a dict."""
        return parse_json_object("encoder_kwargs", self.encoder_kwargs)

    def validate(self) -> None:
        """The checks of every run and the fine-tuning fields'."""
        super().validate()
        if not self.data:
            raise ValueError("--data is required (a folder with class subfolders, cifar10, ...)")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if not 0.0 < self.label_fraction <= 1.0:
            raise ValueError(f"--label-fraction must be in (0, 1] (0.01 for 1 % of the labels), "
                             f"got {self.label_fraction}")
        if self.subset_file and self.label_fraction < 1.0:
            raise ValueError("give --subset-file or --label-fraction, not both")
        for name in ("image_size", "eval_every", "reprob", "mixup", "cutmix", "smoothing"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got "
                                 f"{getattr(self, name)}")
        if not 0.0 < self.crop_min <= 1.0 or not 0.0 <= self.hflip <= 1.0:
            raise ValueError(f"--crop-min must be in (0, 1] and --hflip in [0, 1], got "
                             f"{self.crop_min}, {self.hflip}")
        if self.layer_decay is not None and not 0.0 < self.layer_decay <= 1.0:
            raise ValueError(f"--layer-decay must be in (0, 1], got {self.layer_decay}")
        if self.drop_path is not None and not 0.0 <= self.drop_path < 1.0:
            raise ValueError(f"--drop-path must be in [0, 1), got {self.drop_path}")
        if (self.mixup or self.cutmix) and (self.batch_size // self.grad_accum_steps) % 2:
            raise ValueError("mixup / cutmix mix each image with the batch reversed: use an even "
                             "--batch-size per micro-batch")
        self.encoder_options()


def read_subset_file(path: str | Path, ds: Any) -> list[int]:
    """The indices into ``ds`` of the images ``path`` lists, one a line: a path relative to the
    data set's folder (``ds.root``) or an integer index; blank lines and ``#`` comments
    skipped. Sorted and unique; an unknown entry is a one-line ``ValueError``."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"--subset-file {path}: no such file")
    root = getattr(ds, "root", None)
    paths = getattr(ds, "paths", None)
    where = ({str(Path(p).relative_to(root)): i for i, p in enumerate(paths)}
             if root is not None and paths is not None else {})
    picked = set()
    for n, line in enumerate(file.read_text().splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if entry.isdigit() and int(entry) < len(ds):
            picked.add(int(entry))
        elif entry in where:
            picked.add(where[entry])
        else:
            raise ValueError(f"--subset-file {path}, line {n}: {entry!r} is neither an image path "
                             f"relative to {root or 'the split folder'} nor an index below "
                             f"{len(ds)}")
    if not picked:
        raise ValueError(f"--subset-file {path} lists no image")
    return sorted(picked)


def split_indices(targets: Sequence[int], *, val_fraction: float, label_fraction: float = 1.0,
                  subset: Sequence[int] | None = None, seed: int = 0,
                  classes: Sequence[str] = ()) -> tuple[list[int], list[int]]:
    """(training, validation) indices of a training split with labels ``targets``.

    The training images: ``subset`` (a list file), else a class-balanced ``label_fraction`` of
    each class (:func:`~contrastive.eval.linear.common.label_fraction_indices`, seeded), else
    all; the validation images: a class-balanced ``val_fraction`` of the others (the same
    function), never trained on. A class left with no training image is a one-line
    ``ValueError``."""
    from contrastive.eval.linear.common import label_fraction_indices

    labels = torch.tensor(list(targets), dtype=torch.long)
    if (labels < 0).any():
        raise ValueError("the training split has unlabelled images: fine-tuning needs a label "
                         "for every image (class subfolders)")
    everything = torch.arange(labels.numel())
    if subset is not None:
        train: Tensor | None = torch.tensor(sorted(subset), dtype=torch.long)
    elif label_fraction < 1.0:
        train = label_fraction_indices(labels, label_fraction, seed)
    else:
        train = None
    rest = everything if train is None else everything[~torch.isin(everything, train)]
    val = (rest[label_fraction_indices(labels[rest], val_fraction, seed)]
           if val_fraction > 0 and rest.numel() else rest[:0])
    if train is None:
        train = rest[~torch.isin(rest, val)]
    missing = sorted(set(labels.unique().tolist()) - set(labels[train].unique().tolist()))
    if missing:
        name = classes[missing[0]] if len(classes) > missing[0] else str(missing[0])
        raise ValueError(f"class {name!r} has no training image left ({len(missing)} class(es) "
                         "empty after the subset and --val-fraction): use a larger "
                         "--label-fraction, a smaller --val-fraction, or list images of every "
                         "class in --subset-file")
    return train.tolist(), val.tolist()


def layer_ids(encoder: nn.Module) -> dict[str, int]:
    """Parameter name -> layer id (0 = the stem ... the last = the final norm). A timm ViT:
    MAE's rule (:func:`~contrastive.methods._common.vit_layer_id`: block ``i`` is layer
    ``i + 1``, the final norm ``depth + 1``, so the last block trains at ``decay`` x the lr, as
    in MAE's fine-tuning). Another timm model: its ``group_matcher``, as timm's
    ``param_groups_layer_decay`` derives them (``timm.models.group_parameters(...,
    reverse=True)``). A model with neither is refused."""
    from contrastive.methods._common import vit_layer_id

    blocks = getattr(encoder, "blocks", None)
    if hasattr(encoder, "patch_embed") and isinstance(blocks, nn.Sequential | nn.ModuleList):
        return {name: vit_layer_id(name, len(blocks)) for name, _ in encoder.named_parameters()}
    matcher = getattr(encoder, "group_matcher", None)
    if not callable(matcher):
        raise ValueError(f"--layer-decay needs a timm encoder (the layer ids come from its "
                         f"group_matcher); {type(encoder).__name__} has none: use --layer-decay 1")
    from timm.models import group_parameters

    return dict(group_parameters(encoder, matcher(coarse=False), reverse=True))


def layer_decay_groups(encoder: nn.Module, decay: float,
                       settings: FinetuneSettings) -> list[ParamGroup]:
    """Layer-wise lr decay as :class:`~contrastive.methods.ParamGroup` s: the encoder's layer
    ``i`` of ``n`` at ``decay ** (n - 1 - i)`` x the backbone's lr multiplier (timm's
    ``param_groups_layer_decay``: the final norm, and the new head outside the groups, keep the
    run's lr), held still for the backbone's warm start."""
    from contrastive.methods.base import ParamGroup

    ids = layer_ids(encoder)
    top = max(ids.values())
    by_layer: dict[int, list[nn.Parameter]] = {}
    for name, p in encoder.named_parameters():
        if p.requires_grad:
            by_layer.setdefault(ids.get(name, top), []).append(p)
    logger.info("layer-wise lr decay %g over %d layers: lr x %g (stem) ... 1 (last)", decay,
                top + 1, decay ** top)
    return [ParamGroup(f"layer_{i}", params, lr_scale=settings.lr_scale * decay ** (top - i),
                       frozen_steps=settings.frozen_steps)
            for i, params in sorted(by_layer.items())]


def save_classifier(folder: Path, module: nn.Module, cfg: LabelledImageConfig,
                    classes: Sequence[str], normalisation: tuple[Sequence[float], Sequence[float]],
                    *, step: int, recipe: str) -> Path:
    """The fine-tuned classifier in its encoder's family: a timm model folder for a timm
    encoder (``model.safetensors`` in timm's names with the head as its classifier, and timm's
    ``config.json``: ``timm.save_for_hf``), else ``model.safetensors`` (``encoder.*``,
    ``head.*``) and ``classifier.json``. Safetensors only: nothing runs code when loaded."""
    from safetensors.torch import save_file

    from contrastive.methods.image_classifier import ImageClassifier

    assert isinstance(module, ImageClassifier)
    folder.mkdir(parents=True, exist_ok=True)
    encoder: Any = module.encoder
    head = module.head
    mean, std = (list(v) for v in normalisation)
    if cfg.encoder.startswith("timm:"):
        from timm.models import save_for_hf

        model = copy.deepcopy(encoder).float()
        model.reset_classifier(head.out_features)
        model.get_classifier().load_state_dict(head.float().state_dict())
        save_for_hf(model, str(folder), safe_serialization=True,
                    model_args=cfg.encoder_options() or None,
                    model_config={"label_names": list(classes)} if classes else None,
                    data_config={"input_size": (3, cfg.image_size, cfg.image_size),
                                 "mean": tuple(mean), "std": tuple(std), "crop_pct": 0.875,
                                 "interpolation": "bicubic"})
        return folder
    state = {f"encoder.{k}": v.detach().float().contiguous().cpu()
             for k, v in encoder.state_dict().items()}
    state.update({f"head.{k}": v.detach().float().contiguous().cpu()
                  for k, v in head.state_dict().items()})
    save_file(state, str(folder / "model.safetensors"))
    (folder / OURS_FILE).write_text(json.dumps({
        "encoder": cfg.encoder, "encoder_kwargs": cfg.encoder_options(),
        "num_classes": head.out_features, "label_names": list(classes), "mean": mean, "std": std,
        "image_size": cfg.image_size, "step": step, "recipe": recipe}, indent=1) + "\n")
    return folder


def load_finetuned(folder: str | Path) -> nn.Module:
    """A ``classifier/`` folder as a module mapping normalised (N, 3, H, W) images to logits,
    in eval mode: the timm model for a timm encoder, else ``encoder`` then ``head``."""
    folder = Path(folder).expanduser()
    if (folder / "config.json").is_file():
        import timm

        return timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    meta_file = folder / OURS_FILE
    if not meta_file.is_file():
        raise ValueError(f"{folder}: no config.json (timm) nor {OURS_FILE}: not a classifier "
                         "folder written by contrastive-finetune")
    from safetensors.torch import load_file

    from contrastive.nn import create_encoder

    meta = json.loads(meta_file.read_text())
    encoder: Any = create_encoder(meta["encoder"], **meta.get("encoder_kwargs", {}))
    model = nn.Sequential(OrderedDict(encoder=encoder,
                                      head=nn.Linear(encoder.num_features, meta["num_classes"])))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval()


class TopKEvaluator:
    """Top-1 / top-5 (%) of ``module.predict`` on a labelled ``dataset`` (eval transform),
    ``prefix_top1`` / ``prefix_top5``; every process scores all the images
    (``gather_for_metrics``). ``last``: the latest figures."""

    per = "step"
    at_start = False

    def __init__(self, dataset: Any, name: str, *, every: int = 0, batch_size: int = 256,
                 num_workers: int = 0) -> None:
        self.dataset, self.name, self.every = dataset, name, every
        self.batch_size, self.num_workers = batch_size, num_workers
        self.last: dict[str, float] | None = None

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        from contrastive.eval.knn import topk_accuracy
        from contrastive.eval.runner import encode_split

        predict: Any = module.predict
        first = next(module.parameters())
        double = first.dtype == torch.float64
        with kept_global_rng():  # accelerator None: this process alone, on the model's device
            logits, labels = encode_split(lambda x: predict(x.double() if double else x),
                                          self.dataset, batch_size=self.batch_size,
                                          num_workers=self.num_workers, accelerator=accelerator,
                                          device=str(first.device), progress=False)
        ranked = logits.topk(min(5, logits.shape[1]), dim=1).indices
        acc = topk_accuracy(ranked, labels)
        self.last = {f"{self.name}_top1": round(acc["top1"], 4),
                     f"{self.name}_top5": round(acc["top5"], 4)}
        return dict(self.last)


@contextlib.contextmanager
def kept_global_rng() -> Iterator[None]:
    """The global torch / NumPy generators put back after the block (an evaluation mid-run
    must not move the training's stream)."""
    with torch.random.fork_rng(devices=[]):
        state = np.random.get_state()
        try:
            yield
        finally:
            np.random.set_state(state)


class FinetunedArtefacts:
    """``classifier/`` (:func:`save_classifier`: a timm model's
    folder for timm encoders, ours otherwise) and ``results.json``: the latest validation
    figures and, for the run's last step (the whole budget, not a ``--max-steps`` stop nor
    ``best/``), the test split scored once."""

    what = "the fine-tuned classifier"

    def __init__(self, adapter: LabelledImageAdapter) -> None:
        self.adapter = adapter

    def write(self, out: Path, cfg: LabelledImageConfig, module: nn.Module, recipe: str,
              step: int) -> Path:
        a = self.adapter
        result: dict[str, Any] = {"step": step, "protocol": cfg.protocol,
                                  "encoder": cfg.encoder, "init": cfg.init or None,
                                  "train_images": a.sizes.get("train"),
                                  "val_images": a.sizes.get("val"),
                                  **(a.val.last if a.val is not None and a.val.last else {})}
        final = step >= a.total_steps and out.name != BEST_DIR
        if final and a.test is not None:
            logger.info("scoring the test split once (%d images)", len(a.test.dataset))
            was = module.training
            module.eval()
            result.update(a.test(module, None))
            module.train(was)
        out.mkdir(parents=True, exist_ok=True)
        save_classifier(out / CLASSIFIER_DIR, module, cfg, a.classes, a.normalisation,
                        step=step, recipe=recipe)
        (out / RESULTS_FILE).write_text(json.dumps(result, indent=1) + "\n")
        return self.main_file(out)

    def step_of(self, out: Path) -> int | None:
        try:
            step = json.loads((out / RESULTS_FILE).read_text()).get("step")
        except (OSError, ValueError):
            return None
        return step if isinstance(step, int) else None

    def main_file(self, out: Path) -> Path:
        return out / CLASSIFIER_DIR


class LabelledImageAdapter(KitDefaults[LabelledImageConfig]):
    """Labelled images, one view each from timm's transforms in the loader workers, mixup /
    cutmix on the device; the backbone from ``--init``; throughput in images/s."""

    unit = "images"

    def __init__(self) -> None:
        self.init = BackboneInit()
        self.normalisation: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
        self.classes: list[str] = []
        self.num_classes = 0
        self._full: Any = None
        self._split: tuple[list[int], list[int]] = ([], [])
        self.sizes: dict[str, int] = {}
        self.val: TopKEvaluator | None = None
        self.test: TopKEvaluator | None = None
        self.total_steps = 0
        self.mixup: Any = None
        self._cfg: LabelledImageConfig | None = None
        self._given: LabelledImageConfig | None = None
        self._resolved: LabelledImageConfig | None = None
        self.artefacts = FinetunedArtefacts(self)

    def prepare(self, cfg: LabelledImageConfig) -> None:
        """Read ``--init`` and fill what it records (``--encoder``, ``--encoder-kwargs``,
        ``--image-size``, the normalisation), then the protocol's unset fields
        (``--drop-path``, ``--layer-decay``), written back on ``cfg`` (config.json records
        them); a bad source is one line. Nothing to read again for an equal ``cfg``."""
        if self._resolved is not None and cfg in (self._given, self._resolved):
            for f in dataclasses.fields(cfg):
                setattr(cfg, f.name, getattr(self._resolved, f.name))
            return
        from contrastive.augment import IMAGENET_MEAN, IMAGENET_STD

        given = dataclasses.replace(cfg)
        weights = self.init.resolve(cfg)
        recorded: dict[str, Any] = {}
        if weights is not None and weights.path is not None and weights.kind not in (
                "timm", "torchvision"):
            from contrastive.eval.checkpoint import read_checkpoint

            recorded = dict(read_checkpoint(weights.path).settings)
        if not cfg.encoder:
            if weights is None or not weights.encoder:
                raise ValueError("--encoder NAME is needed: no --init, or an --init source that "
                                 "does not record its architecture")
            cfg.encoder = weights.encoder
            if not cfg.encoder_kwargs and recorded.get("encoder_kwargs"):
                cfg.encoder_kwargs = json.dumps(recorded["encoder_kwargs"])
        if not cfg.image_size:
            cfg.image_size = int(recorded.get("image_size") or 224)
        timm_model = cfg.encoder.startswith("timm:")
        vit = cfg.protocol == "vit" and timm_model
        if cfg.drop_path is None:
            cfg.drop_path = 0.1 if vit else 0.0
        if cfg.layer_decay is None:  # BEiT's / MAE's decay is a ViT's: convnets keep one lr
            transformer = cfg.encoder.split(":", 1)[-1].startswith(VIT_FAMILIES)
            cfg.layer_decay = 0.65 if vit and transformer else 1.0
        if cfg.drop_path and not timm_model:
            raise ValueError(f"--drop-path {cfg.drop_path}: stochastic depth is timm's "
                             f"drop_path_rate, and {cfg.encoder} is not a timm encoder; use "
                             "--drop-path 0")
        resolve_finetune(cfg, pretrained=False)  # explicit flags only: fine-tuning trains all
        ours = (tuple(IMAGENET_MEAN), tuple(IMAGENET_STD))
        mean, std = self.init.normalisation(ours)
        self.normalisation = (tuple(float(v) for v in mean), tuple(float(v) for v in std))
        self._read_data(cfg)
        self._given, self._resolved = given, dataclasses.replace(cfg)

    def method_building(self, cfg: LabelledImageConfig) -> contextlib.AbstractContextManager[Any]:
        """Every ``--encoder`` backbone built inside starts from ``--init``."""
        return self.init.building(cfg.encoder)

    def transforms(self, cfg: LabelledImageConfig) -> tuple[Any, Any]:
        """(training, evaluation) transforms of a PIL image or uint8 tensor: timm's
        ``create_transform`` (training: random-resized crop, flip, the auto-augment policy,
        random erasing; evaluation: resize and centre crop at timm's crop_pct 0.875), with
        the run's normalisation."""
        from timm.data import create_transform

        mean, std = self.normalisation
        # no colour jitter (timm's default 0.4 when no policy is given): MAE's default
        # --color_jitter None, SimCLR's crop and flip only; timm reads None as off
        train = create_transform(cfg.image_size, is_training=True, scale=(cfg.crop_min, 1.0),
                                 hflip=cfg.hflip, color_jitter=None,  # type: ignore[arg-type]
                                 auto_augment=cfg.auto_augment or None,
                                 interpolation="bicubic", re_prob=cfg.reprob, re_mode="pixel",
                                 mean=mean, std=std)
        evaluate = create_transform(cfg.image_size, is_training=False, interpolation="bicubic",
                                    crop_pct=0.875, mean=mean, std=std)
        return _Then(_as_pil, train), _Then(_as_pil, evaluate)

    def _read_data(self, cfg: LabelledImageConfig) -> None:
        """The training split read (no transform yet) and cut into training and validation
        indices (:func:`split_indices`): a missing folder, a bad list or an empty class is
        one line here, before the run folder exists."""
        from contrastive.eval.runner import load_split

        full: Any = load_split(cfg.data, "train", None)
        targets = getattr(full, "targets", None)
        if not targets:
            raise ValueError(f"--data {cfg.data}: the training split has no labels (fine-tuning "
                             "needs class subfolders, or a labelled data set)")
        self.classes = [str(c) for c in getattr(full, "classes", []) or []]
        subset = read_subset_file(cfg.subset_file, full) if cfg.subset_file else None
        self._full = full
        self._split = split_indices(targets, val_fraction=cfg.val_fraction,
                                    label_fraction=cfg.label_fraction, subset=subset,
                                    seed=cfg.data_seed, classes=self.classes)
        self.num_classes = len(self.classes) or int(max(targets)) + 1

    def train_set(self, cfg: LabelledImageConfig, accelerator: Any) -> Any:
        from contrastive.data import SubsetDataset, has_split
        from contrastive.eval.runner import load_split

        if self._resolved is None:  # else prepared (the engine has resolved more fields since)
            self.prepare(cfg)
        self._cfg = cfg
        train_tf, eval_tf = self.transforms(cfg)
        full, (train_idx, val_idx) = self._full, self._split
        evaluated = copy.copy(full)  # the same images under the evaluation transform
        full.transform, evaluated.transform = train_tf, eval_tf
        workers = min(cfg.num_workers, 4)
        self.val = None
        if val_idx:
            self.val = TopKEvaluator(SubsetDataset(evaluated, val_idx), "val",
                                     every=cfg.eval_every, batch_size=cfg.eval_batch_size,
                                     num_workers=workers)
        self.test = None
        if has_split(cfg.data, "test"):
            self.test = TopKEvaluator(load_split(cfg.data, "test", eval_tf), "test",
                                      batch_size=cfg.eval_batch_size, num_workers=workers)
        else:
            logger.info("--data %s has no test split: results.json will hold no test score",
                        cfg.data)
        self.sizes = {"train": len(train_idx), "val": len(val_idx),
                      "test": len(self.test.dataset) if self.test is not None else 0}
        n = len(train_idx)
        self.total_steps = cfg.steps or (n // cfg.batch_size) * cfg.epochs
        self.mixup = None
        if cfg.mixup or cfg.cutmix:
            from timm.data import Mixup

            self.mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix,
                               label_smoothing=cfg.smoothing, num_classes=self.num_classes)
        return SubsetDataset(full, train_idx) if n < len(full) else full

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int,
              world: int = 1) -> dict[str, Any]:
        from contrastive.data.loader import mix_seed

        cfg = self._cfg
        assert cfg is not None, "LabelledImageAdapter: train_set() first"
        images, labels = sample[0].to(device, non_blocking=True), sample[1].to(device)
        if cfg.float64:
            images = images.double()
        if self.mixup is not None:  # timm draws from NumPy's global generator: seeded here
            state = np.random.get_state()
            np.random.seed(mix_seed(cfg.seed, 0x313, step, micro, rank) % 2**32)
            try:
                images, labels = self.mixup(images, labels)
            finally:
                np.random.set_state(state)
            labels = labels.to(images.dtype)
        return {"views": [images], "labels": labels, **sched}

    def count(self, batch: dict[str, Any]) -> Tensor | None:
        return None

    def prepare_method(self, cfg: LabelledImageConfig, method: nn.Module,
                       device: torch.device) -> nn.Module:
        """``--freeze-bn-stats`` on the backbone, when given."""
        freeze_backbone_bn(method, self.init.backbones, resolve_finetune(cfg, pretrained=False))
        return method

    def param_groups(self, cfg: LabelledImageConfig, method: nn.Module) -> list[ParamGroup]:
        """Layer-wise lr decay (:func:`layer_decay_groups`) when ``--layer-decay`` < 1, else
        the backbone controls' group (:func:`~contrastive.engine.kits.finetune.backbone_groups`,
        none when off)."""
        settings = resolve_finetune(cfg, pretrained=False)
        if cfg.layer_decay is not None and cfg.layer_decay < 1.0:
            return layer_decay_groups(method.encoder, cfg.layer_decay,  # type: ignore[arg-type]
                                      settings)
        return backbone_groups(self.init.backbones, settings)

    def evaluators(self, cfg: LabelledImageConfig, world: int) -> list[Any]:
        return [self.val] if self.val is not None else []

    def resolved(self) -> dict[str, Any]:
        mean, std = self.normalisation
        return {"normalisation": {"mean": list(mean), "std": list(std)},
                "images": dict(self.sizes), "num_classes": self.num_classes,
                **self.init.resolved()}

    def describe(self) -> str:
        return (f"{self.sizes.get('train')} training images, {self.sizes.get('val')} held out "
                f"for validation, {self.num_classes} classes")

    def handoff(self) -> HandOff:
        return {"num_classes": self.num_classes}


def _as_pil(img: Any) -> Any:
    """A uint8 (3, H, W) tensor (generated images) as a PIL image; a PIL image as it is."""
    if isinstance(img, Tensor):
        from torchvision.transforms.functional import to_pil_image

        return to_pil_image(img)
    return img


class _Then:
    """Two transforms in a row (picklable, for the loader workers)."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def __call__(self, img: Any) -> Any:
        return self.second(self.first(img))
