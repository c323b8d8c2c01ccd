"""The image-text kit: runs on image-caption pairs (CLIP, SigLIP).

- configuration: :class:`ImageTextConfig` (the image tower's name, options and crop size, the
  zero-shot evaluator's cadence) and :class:`DualEncoderConfig` (the CPU-scale schedule the
  CLIP family's recipes share and the text tower's sizes);
- data: :class:`ImageTextAdapter`, centre crops scaled to [0, 1] (or normalised as the
  ``--init`` image tower was trained) on the device, and the caption's tokens;
- the model's arguments: :func:`dual_encoder_kwargs`;
- evaluators: :class:`ZeroShotEvaluator` (zero-shot top-k and retrieval recall);
- artefacts: :class:`ClipArtefacts`, ``clip.pt`` + ``tokenizer/`` and the image tower's
  ``encoder.pt``, both recording the images' normalisation (``contrastive-zeroshot`` reads it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn

from contrastive.augment.share import Share
from contrastive.engine.config import RunConfig, parse_json_object
from contrastive.engine.fields import help_field, override
from contrastive.engine.kits.base import Artefacts, HandOff, KitDefaults
from contrastive.engine.kits.image import encoder_step, make_batch, prepare_views, write_encoder
from contrastive.engine.kits.init import BackboneInit, InitFields
from contrastive.engine.kits.text import BertSizes
from contrastive.engine.sharding import unsharded_type
from contrastive.eval.zeroshot import PIXELS, image_text_transform
from contrastive.records import CLIP_FILE, save_clip_record

if TYPE_CHECKING:
    from contrastive.augment.pipeline import Pipeline
    from contrastive.data.tokenizer import TextTokenizer

__all__ = ["ImageTextConfig", "DualEncoderConfig", "ImageTextAdapter", "ZeroShotEvaluator",
           "ClipArtefacts", "build_zeroshot_evaluator", "dual_encoder_kwargs"]

logger = logging.getLogger(__name__)

#: a recipe's image-text configuration
C = TypeVar("C", bound="ImageTextConfig")


@dataclass
class ImageTextConfig(InitFields, RunConfig):
    """A run on image-text pairs (CLIP): the fields every run has and the image tower's name,
    options, starting weights (``--init``, ``--lock-image``) and crop size, the text tower's
    source, and the zero-shot / retrieval evaluator's cadence. No augmentation, kNN or probe
    fields: the images are centre crops (captions name colour and position)."""

    data: str = help_field(
        "shapes-captions", "image-text data spec: shapes-captions[:n=..,size=..] | "
        "captions:ROOT (images + captions.tsv/.jsonl) | wds-captions:DIR (.jpg + .txt shards)")
    encoder: str = help_field("small_cnn", "image backbone name for create_encoder")
    encoder_kwargs: str = help_field("", "create_encoder keyword arguments as a JSON object")
    image_size: int = help_field(32, "centre-crop size in pixels (shorter side resized to it)")
    eval_every: int = help_field(
        0, "zero-shot top-1 and retrieval recall every N optimiser steps (0 = at the end only)")
    eval_at_start: bool = help_field(False, "also evaluate before training (random init)")
    eval_max: int = help_field(1000, "held-out pairs the evaluator uses (0 = no evaluator)")
    text_encoder: str = help_field(
        "bert", "the text tower: bert (random weights of --layers/--hidden/--heads, the "
        "captions' own WordPiece tokenizer) | hf:FOLDER (a local Hugging Face checkpoint folder: "
        "its weights, and its tokenizer for the captions; the sizes do not apply)")
    lock_image: bool = help_field(
        False, "LiT (Zhai et al. 2022): the image tower locked (no gradient, not optimised, "
        "BatchNorm statistics frozen) while the text tower and both projections train; meant "
        "with --init")

    def encoder_options(self) -> dict[str, Any]:
        """The ``--encoder-kwargs`` JSON (recorded in ``encoder.pt`` and ``clip.pt``)."""
        return parse_json_object("encoder_kwargs", self.encoder_kwargs)

    def validate(self) -> None:
        """The checks of every run, a positive crop size, a valid ``--encoder-kwargs`` and
        ``--text-encoder``."""
        super().validate()
        if self.image_size <= 0 or self.eval_every < 0 or self.eval_max < 0:
            raise ValueError("--image-size must be positive, --eval-every and --eval-max >= 0")
        self.encoder_options()
        text_folder(self)  # bert or hf:FOLDER, else one line naming both


@dataclass
class DualEncoderConfig(BertSizes, ImageTextConfig):
    """An image tower and a text tower trained on image-caption pairs at CPU scale (the CLIP
    family: recipes/clip.py, recipes/siglip.py): the schedule both recipes share (so that the
    methods compare on the same budget) and the text tower's sizes (:class:`BertSizes`: the
    image tower has none of its own, it is sized by ``--encoder`` / ``--encoder-kwargs``). A
    recipe adds its loss's fields and builds its method from :func:`dual_encoder_kwargs`."""

    steps: int = override(300, "optimiser steps (the budget the schedule follows); "
                          "--steps 0 --epochs N for an epoch budget")
    batch_size: int = 128
    optimizer: str = override("adamw", "AdamW with decoupled weight decay (CLIP)")
    lr: float = 2e-3
    lr_scaling: str = override("none", "lr is absolute")
    weight_decay: float = override(0.1, "CLIP uses 0.2 at scale; 0.1 at this size")
    betas: tuple[float, float] = override((0.9, 0.98), "CLIP's AdamW betas")
    warmup_steps: int = 50
    save_every_steps: int = 100
    num_workers: int = 0
    log_every: int = 50
    # model
    dim: int = help_field(64, "shared embedding width")
    layers: int = override(2, "the text tower")
    hidden: int = override(64, "the text tower")
    heads: int = override(2, "the text tower")

    def validate(self) -> None:
        """The image-text checks and the text tower's sizes."""
        super().validate()
        self.check_bert_sizes()


def text_folder(cfg: ImageTextConfig) -> str | None:
    """The folder of ``--text-encoder hf:FOLDER``, None for ``bert`` (a one-line ValueError
    naming the two forms otherwise)."""
    from contrastive.nn.text_encoders import hf_folder

    return hf_folder(cfg.text_encoder)


class ImageTextAdapter(KitDefaults[C]):
    """Image-text pairs (:class:`contrastive.data.captions.ImageTextDataset`, e.g. ``--data
    shapes-captions | captions:ROOT | wds-captions:DIR``): uint8 centre crops from the workers,
    scaled to [0, 1] on the device (normalised as the ``--init`` image tower was trained when it
    records how or ``--init-mean/--init-std`` say), and the caption's ``input_ids`` /
    ``attention_mask``.
    Throughput in samples/s (pairs); the zero-shot / retrieval evaluator; ``clip.pt``,
    ``tokenizer/`` and the image tower's ``encoder.pt``.

    ``model_config(cfg, tokenizer)`` (from the recipe, on :func:`dual_encoder_kwargs`) is
    recorded in ``clip.pt``, so evaluation rebuilds the model from it. ``tokenizer`` is the
    training set's, known after :meth:`train_set` (handed to the recipe's ``build_method``);
    with ``--text-encoder hf:FOLDER`` it is the folder's (at the data spec's ``max_length``),
    which then tokenises the captions of every caption data set.

    Pretrained towers (issue 49): :meth:`prepare` reads and checks ``--init`` (the image tower,
    :class:`~contrastive.engine.kits.init.BackboneInit`) and the ``hf:`` text folder (a pickle
    that would run code is refused unread, :func:`~contrastive.nn.text_encoders.
    check_safe_weights`; its tokenizer read) before the run folder exists;
    :meth:`method_building` loads the image tower as the method builds it. The ``--init``
    normalisation reaches training, the zero-shot evaluator, ``clip.pt`` and ``encoder.pt``
    through :attr:`pipeline`.
    """

    unit = "samples"
    # from train_set on:
    artefacts: Artefacts[C]  # ClipArtefacts
    tokenizer: TextTokenizer  # the training set's
    pipeline: Pipeline  # image_text_transform(--image-size, the --init normalisation)

    def __init__(self, model_config: Callable[[C, TextTokenizer], dict[str, Any]]) -> None:
        self.model_config = model_config
        self.device_fn: Callable[..., list[Tensor]] | None = None
        self._seed, self._float64, self._size = 0, False, 0
        self._model: dict[str, Any] = {}
        self.init = BackboneInit()  # --init, resolved by prepare
        self._norm: tuple[Sequence[float], Sequence[float]] = PIXELS  # the images', by prepare
        self._prepared: C | None = None

    def prepare(self, cfg: C) -> None:
        """``--init`` and an ``hf:`` text folder read and checked before the run folder exists
        (one line when they cannot be used); nothing to do again for an equal ``cfg``."""
        if self._prepared is not None and self._prepared == cfg:
            return
        from contrastive.data.tokenizer import load_tokenizer
        from contrastive.nn.text_encoders import check_safe_weights

        weights = self.init.resolve(cfg)
        self._norm = self.init.normalisation(PIXELS)
        if cfg.lock_image and weights is None:
            logger.warning("--lock-image without --init locks the image tower's starting "
                           "weights (random unless --encoder-kwargs loads some)")
        folder = text_folder(cfg)
        if folder:
            check_safe_weights(folder)  # a pickle that would run code: refused, unread
            load_tokenizer(folder)  # the captions' tokenizer must be there
        self._prepared = cfg

    def method_building(self, cfg: C) -> contextlib.AbstractContextManager[None]:
        """With ``--init``: the ``--encoder`` image tower the method creates starts from the
        weights (:meth:`BackboneInit.building`)."""
        return self.init.building(cfg.encoder)

    def train_set(self, cfg: C, accelerator: Any) -> Any:
        from contrastive.data import get_dataset

        self._seed, self._float64 = cfg.seed, cfg.float64
        self.pipeline = image_text_transform(cfg.image_size, *self._norm)
        transform, self.device_fn = self.pipeline.split()
        ds: Any = get_dataset(cfg.data, "train", transform=transform, strict=cfg.strict_data)
        tokenizer = getattr(ds, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(f"--data {cfg.data} is not an image-text data set (captions): use "
                             "shapes-captions, captions:ROOT or wds-captions:DIR")
        folder = text_folder(cfg)
        if folder:  # the text tower's own tokenizer, at the data's token length
            from contrastive.data.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(folder, max_length=int(tokenizer.max_length))
            ds.tokenizer = tokenizer
        self.tokenizer, self._size = tokenizer, len(ds)
        self._model = self.model_config(cfg, tokenizer)
        self.artefacts = ClipArtefacts(self._model, tokenizer, self.pipeline)
        return ds

    def batch(self, sample: tuple[Any, ...], needs: tuple[str, ...], sched: dict[str, float], *,
              device: torch.device, step: int, micro: int, rank: int,
              world: int = 1) -> dict[str, Any]:
        views = prepare_views(sample[0], device, self.device_fn, seed=self._seed, step=step,
                              micro=micro, share=Share(rank, world), float64=self._float64)
        return make_batch(views, sample, needs, sched, device)

    def count(self, batch: dict[str, Any]) -> Tensor | None:
        return None

    def evaluators(self, cfg: C, world: int) -> list[Any]:
        ev = build_zeroshot_evaluator(cfg, self.pipeline, self.tokenizer)
        return [] if ev is None else [ev]

    def resolved(self) -> dict[str, Any]:
        return {"train_samples": self._size, "model": self._model, **self.init.resolved()}

    def describe(self) -> str:
        return "image-text pairs, centre crops on device"

    def handoff(self) -> HandOff:
        return {"tokenizer": self.tokenizer, "pipeline": self.pipeline}


def dual_encoder_kwargs(cfg: DualEncoderConfig, tokenizer: Any) -> dict[str, Any]:
    """The two towers' keyword arguments of :class:`~contrastive.methods.CLIP` and its kin:
    the image encoder, the text encoder (mean pooled): a BERT of ``cfg``'s sizes over
    ``tokenizer``'s vocabulary, or ``--text-encoder hf:FOLDER``'s model; the shared width;
    ``lock_image`` when ``--lock-image`` asks for it."""
    from contrastive.nn.text_encoders import bert_options

    text_kwargs = {"pooling": "mean"} if text_folder(cfg) else bert_options(
        **cfg.bert_sizes(), vocab_size=tokenizer.vocab_size,
        max_position_embeddings=int(tokenizer.max_length), pooling="mean")
    locked = {"lock_image": True} if cfg.lock_image else {}
    return dict(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(),
                text_encoder=cfg.text_encoder, dim=cfg.dim, text_kwargs=text_kwargs, **locked)


class ZeroShotEvaluator:
    """Zero-shot top-k and retrieval recall of an image-text model (``encode_image`` /
    ``encode_text``) on held-out image-caption pairs, every ``every`` optimiser steps.

    Every process computes the same figures on its own (no collective): the held-out set is
    monitor-sized (``max_items``).
    """

    name, per = "zeroshot", "step"

    def __init__(self, images: torch.Tensor, captions: Sequence[Sequence[str]], tokenizer: Any,
                 *, labels: torch.Tensor | None = None, classes: Sequence[str] = (),
                 templates: Sequence[str] | None = None, every: int = 0,
                 at_start: bool = False) -> None:
        self.images, self.captions, self.tokenizer = images, captions, tokenizer
        self.labels, self.classes, self.templates = labels, list(classes), templates
        self.every, self.at_start = every, at_start

    def __call__(self, module: nn.Module, accelerator: Any) -> dict[str, float]:
        from contrastive.eval.zeroshot import DEFAULT_TEMPLATES, evaluate_pairs

        res = evaluate_pairs(module, self.tokenizer, self.images, self.captions,
                             labels=self.labels, classes=self.classes,
                             templates=self.templates or DEFAULT_TEMPLATES)
        return {(f"zeroshot_{k}" if k.startswith("top") else k): round(v, 4)
                for k, v in res.items()}


def build_zeroshot_evaluator(cfg: ImageTextConfig, pipeline: Any, tokenizer: Any
                             ) -> ZeroShotEvaluator | None:
    """The zero-shot / retrieval evaluator (``--eval-every`` steps; 0 = only at the end), on
    the first ``--eval-max`` pairs of the held-out split (the training split when the data has
    none: retrieval only, a fit measure). Zero-shot needs class names (``classes``) and labels."""
    from contrastive.data import get_dataset, has_split
    from contrastive.eval.zeroshot import heldout_pairs

    if cfg.eval_max <= 0:
        return None
    split = "test" if has_split(cfg.data, "test") else "train"
    ds = get_dataset(cfg.data, split, transform=pipeline, strict=cfg.strict_data)
    images, labels, classes, captions = heldout_pairs(ds, cfg.eval_max)
    if split == "train":
        logger.info("zero-shot evaluator: --data %s has no held-out split; retrieval on the "
                    "first %d training pairs", cfg.data, len(captions))
    return ZeroShotEvaluator(images, captions, tokenizer, labels=labels, classes=classes,
                             every=cfg.eval_every, at_start=cfg.eval_at_start)


class ClipArtefacts:
    """``clip.pt`` + ``tokenizer/`` and the image tower's ``encoder.pt``: ``model`` (the
    recipe's model configuration, which evaluation rebuilds the model from), the training
    ``tokenizer`` and ``pipeline`` (its normalisation goes into ``clip.pt`` and ``encoder.pt``). ``what`` names
    the method written last (CLIP, SigLIP...): recipes/clip.py and recipes/siglip.py share
    these artefacts."""

    def __init__(self, model: dict[str, Any], tokenizer: TextTokenizer,
                 pipeline: Pipeline) -> None:
        self.model, self.tokenizer, self.pipeline = model, tokenizer, pipeline
        self.what = "the image-text model (its image tower also in encoder.pt)"

    def write(self, out: Path, cfg: ImageTextConfig, module: nn.Module, recipe: str,
              step: int) -> Path:
        name = unsharded_type(module).__name__  # CLIP, not FSDP's FSDPCLIP under --fsdp
        self.what = f"the {name} model (its image tower also in encoder.pt)"
        clamp = getattr(module, "clamp_logit_scale", None)
        if callable(clamp):
            clamp()
        config = {"model": self.model, "max_length": int(self.tokenizer.max_length),
                  "data": cfg.data, "image_size": cfg.image_size, "step": step, "recipe": recipe,
                  "method": name.lower(),  # the registered name (clip, siglip)
                  "mean": list(self.pipeline.mean), "std": list(self.pipeline.std)}
        path = save_clip_record(out, module.state_dict(), config, self.tokenizer)
        write_encoder(out, cfg, module, self.pipeline, recipe, step)  # the image tower alone
        return path

    def step_of(self, out: Path) -> int | None:
        return encoder_step(out) if self.main_file(out).is_file() else None

    def main_file(self, out: Path) -> Path:
        return out / CLIP_FILE
