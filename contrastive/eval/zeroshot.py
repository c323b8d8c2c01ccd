"""Zero-shot classification and image-text retrieval for CLIP-style models.

Radford et al. 2021 (CLIP), sec. 3.1.2 and 3.1.4: every class name goes through prompt
templates ("a picture of a {}."), the text embeddings of one class are L2-normalised, averaged
and normalised again (the "prompt ensembling" of sec. 3.1.4; open_clip
``open_clip/zero_shot_classifier.py`` builds the classifier the same way from the model's
normalised text features), and an image is
assigned the class whose embedding is nearest in cosine similarity.

Retrieval (as the paper's Flickr30k / MSCOCO evaluation, Table 13): an image has several
captions; image-to-text recall@k counts an image as a hit when ANY of its captions is among the
k texts most similar to it, text-to-image recall@k counts a caption when its image is among the
k most similar images.

Everything here takes embeddings (rows need not be normalised); :func:`clip_embeddings` computes
them from a model with ``encode_image`` / ``encode_text`` (:class:`~contrastive.methods.CLIP`).
The console script ``contrastive-zeroshot`` (:func:`evaluate_run`) evaluates a run of
``recipes/clip.py`` (``clip.pt`` + ``tokenizer/``, :func:`contrastive.records.save_clip_record`)
on the held-out split of its data; the training engine's zero-shot evaluator
(:class:`contrastive.engine.evaluators.ZeroShotEvaluator`) computes the same figures with
:func:`evaluate_pairs`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DEFAULT_TEMPLATES", "PIXELS", "image_text_transform", "zero_shot_classifier", "zero_shot_accuracy", "retrieval_recall",
           "clip_embeddings", "heldout_pairs", "evaluate_pairs", "evaluate_shapes",
           "evaluate_run", "load_clip_run", "main"]

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATES: tuple[str, ...] = ("a {}", "a picture of a {}", "there is a {}")
"""Prompts for class names (``{}`` is the name); choose phrasings the captions use."""

PIXELS: tuple[tuple[float, ...], tuple[float, ...]] = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
"""(mean, std) of an image tower trained from scratch here: [0, 1] pixels, not normalised."""


def image_text_transform(image_size: int, mean: Sequence[float] | None = None,
                         std: Sequence[float] | None = None) -> Any:
    """The image-text runs' image transform (training, the zero-shot evaluator, this module's
    command): resize the shorter side and centre-crop to ``image_size`` (no augmentation:
    captions name colour and position, which crops and jitter would falsify), normalised with
    ``mean`` / ``std`` (an ``--init`` image tower's), else [0, 1] pixels (:data:`PIXELS`)."""
    from contrastive.augment import get_pipeline

    if mean is None or std is None:
        mean, std = PIXELS
    return get_pipeline("eval", image_size=image_size, crop_pct=1.0, mean=tuple(mean),
                        std=tuple(std))


def zero_shot_classifier(encode_text: Callable[[list[str]], Tensor], classnames: Sequence[str],
                         templates: Sequence[str] = DEFAULT_TEMPLATES) -> Tensor:
    """Class embeddings (C, D): per class, the normalised mean of its normalised prompt
    embeddings. ``encode_text(list of strings) -> (B, D)``."""
    if not classnames or not templates or any("{}" not in t for t in templates):
        raise ValueError("zero_shot_classifier: need class names and templates that each hold "
                         f"'{{}}' (where the class name goes); got {list(templates)}")
    prompts = [t.format(c) for c in classnames for t in templates]
    emb = F.normalize(encode_text(prompts).double(), dim=1)
    emb = emb.view(len(classnames), len(templates), -1).mean(dim=1)
    return F.normalize(emb, dim=1)


def zero_shot_accuracy(image_emb: Tensor, labels: Tensor, classifier: Tensor,
                       topk: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Top-k accuracy in % of nearest-class prediction: image_emb (N, D), labels (N,),
    classifier (C, D) from :func:`zero_shot_classifier`. Ties go to the lower class index."""
    if image_emb.shape[0] != labels.shape[0] or image_emb.shape[1] != classifier.shape[1]:
        raise ValueError(f"zero_shot_accuracy: image_emb {tuple(image_emb.shape)}, labels "
                         f"{tuple(labels.shape)}, classifier {tuple(classifier.shape)} disagree")
    sim = F.normalize(image_emb.double(), dim=1) @ F.normalize(classifier.double(), dim=1).T
    order = _rank(sim)
    out = {}
    for k in topk:
        if k <= classifier.shape[0]:
            hit = (order[:, :k] == labels.view(-1, 1).to(order.device)).any(dim=1)
            out[f"top{k}"] = 100.0 * hit.double().mean().item()
    return out


def _rank(sim: Tensor) -> Tensor:
    """Column indices by decreasing similarity, ties by increasing index (stable)."""
    return torch.sort(-sim, dim=1, stable=True).indices


def retrieval_recall(image_emb: Tensor, text_emb: Tensor, text_image: Tensor,
                     ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Recall@k in % both ways (module docstring): image_emb (N, D), text_emb (M, D),
    ``text_image`` (M,) the index of each text's image. Ties go to the lower index."""
    n, m = image_emb.shape[0], text_emb.shape[0]
    text_image = text_image.view(-1).long()
    if text_image.shape[0] != m or (m and (int(text_image.min()) < 0 or int(text_image.max()) >= n)):
        raise ValueError(f"retrieval_recall: text_image must give an image index in [0, {n}) for "
                         f"each of the {m} texts")
    sim = F.normalize(image_emb.double(), dim=1) @ F.normalize(text_emb.double(), dim=1).T
    i2t, t2i = _rank(sim), _rank(sim.T)
    out = {}
    for k in ks:
        own = text_image[i2t[:, :k]] == torch.arange(n).view(-1, 1)  # (N, k): a caption of mine
        out[f"image_to_text_R@{k}"] = 100.0 * own.any(dim=1).double().mean().item()
        hit = (t2i[:, :k] == text_image.view(-1, 1)).any(dim=1)
        out[f"text_to_image_R@{k}"] = 100.0 * hit.double().mean().item()
    return out


@torch.no_grad()
def clip_embeddings(model: Any, images: Tensor, texts: Sequence[str], tokenizer: Any,
                    batch_size: int = 256) -> tuple[Tensor, Tensor]:
    """(image embeddings (N, D), text embeddings (M, D)) of a model with ``encode_image`` /
    ``encode_text`` in eval mode; ``images`` float (N, C, H, W) as the model takes them."""
    from contrastive.data.captions import encode_fixed

    was = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        zi = [model.encode_image(images[s:s + batch_size].to(dev, dtype)).cpu()
              for s in range(0, images.shape[0], batch_size)]
        zt = []
        for s in range(0, len(texts), batch_size):
            ids, mask = encode_fixed(tokenizer, texts[s:s + batch_size])
            zt.append(model.encode_text(ids.to(dev), mask.to(dev)).cpu())
    finally:
        model.train(was)
    return torch.cat(zi), (torch.cat(zt) if zt else torch.empty(0, zi[0].shape[1]))


# ---- held-out image-caption pairs --------------------------------------------------------------

def heldout_pairs(dataset: Any, max_items: int = 1000
                  ) -> tuple[Tensor, Tensor | None, list[str], list[list[str]]]:
    """(images (N, C, H, W) float, labels (N,) or None, class names, captions per image) of the
    first ``max_items`` items of an image-text data set
    (:class:`~contrastive.data.captions.ImageTextDataset` whose images come through an
    evaluation transform giving one float view). Labels are None unless every image has one
    and the data set names its classes."""
    n = min(len(dataset), max_items)
    images = []
    for i in range(n):
        view = dataset.images[i][0]
        images.append(view[0] if isinstance(view, (list, tuple)) else view)
    targets = list(getattr(dataset, "targets", []))[:n]
    classes = [str(c) for c in getattr(dataset, "classes", [])]
    labels = None
    if classes and len(targets) == n and all(0 <= int(t) < len(classes) for t in targets):
        labels = torch.tensor([int(t) for t in targets])
    return torch.stack(images), labels, classes, [dataset.captions_of(i) for i in range(n)]


def evaluate_pairs(model: Any, tokenizer: Any, images: Tensor, captions: Sequence[Sequence[str]],
                   *, labels: Tensor | None = None, classes: Sequence[str] = (),
                   templates: Sequence[str] = DEFAULT_TEMPLATES) -> dict[str, float]:
    """Zero-shot top-1/top-5 (when ``labels`` and ``classes`` are given) and retrieval
    recall@1/5 both ways (any of an image's captions counts)."""
    texts = [c for cs in captions for c in cs]
    owner = torch.tensor([i for i, cs in enumerate(captions) for _ in cs])
    zi, zt = clip_embeddings(model, images, texts, tokenizer)
    out: dict[str, float] = {}
    if labels is not None and classes:
        clf = zero_shot_classifier(lambda t: clip_embeddings(model, images[:1], t, tokenizer)[1],
                                   classes, templates)
        out.update(zero_shot_accuracy(zi, labels, clf))
    out.update(retrieval_recall(zi, zt, owner))
    return out


# ---- a run folder: clip.pt (weights + JSON-able config) and tokenizer/ -------------------------

def load_clip_run(folder: str | Path) -> tuple[Any, Any, dict[str, Any]]:
    """(model in eval mode, tokenizer, config) of a run of ``recipes/clip.py`` or
    ``recipes/siglip.py`` (the registered method ``config["method"]``, CLIP when absent;
    :func:`contrastive.records.load_clip_record`: nothing in the files can run code)."""
    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.methods import method_class
    from contrastive.records import TOKENIZER_DIR, load_clip_record

    state, config = load_clip_record(folder)
    tokenizer = load_tokenizer(Path(folder) / TOKENIZER_DIR, max_length=int(config["max_length"]))
    model = method_class(str(config.get("method", "clip")))(**config["model"])
    model.load_state_dict(state)
    return model.eval(), tokenizer, config


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``contrastive-zeroshot`` (see :func:`evaluate_run`); exit status 0."""
    evaluate_run(argv)
    return 0


def evaluate_run(argv: Sequence[str] | None = None) -> dict[str, float]:
    """``contrastive-zeroshot RUN [--data SPEC] [--n-test N] [--templates T ...] [--classes C
    ...]``: zero-shot top-1/top-5 and retrieval recall@1/5 on the held-out split of the run's
    data (or ``--data``; its training split when it has none: retrieval only), the images
    normalised as ``clip.pt`` records (the ``--init`` image tower's; [0, 1] pixels when it
    records none); prints one JSON line."""
    p = argparse.ArgumentParser(prog="contrastive-zeroshot", description=evaluate_run.__doc__)
    p.add_argument("run", help="folder with clip.pt and tokenizer/ (recipes/clip.py)")
    p.add_argument("--data", default=None, help="image-text data spec (default: the run's)")
    p.add_argument("--n-test", type=int, default=1000, help="held-out images (default 1000)")
    p.add_argument("--templates", nargs="+", default=list(DEFAULT_TEMPLATES),
                   help="prompt templates, '{}' is the class name")
    p.add_argument("--classes", nargs="+", default=None, help="class names (default: the "
                   "data's)")
    args = p.parse_args(argv)
    from contrastive.data import get_dataset, has_split
    from contrastive.records import recorded_normalisation

    model, tokenizer, config = load_clip_run(args.run)
    spec = args.data or config["data"]
    split = "test" if has_split(spec, "test") else "train"
    # the image tower's normalisation as clip.pt records it ([0, 1] pixels when it records none)
    tf = image_text_transform(int(config["image_size"]), *recorded_normalisation(config))
    images, labels, classes, captions = heldout_pairs(get_dataset(spec, split, transform=tf),
                                                      args.n_test)
    if args.classes is not None:
        if len(args.classes) != len(classes):
            raise SystemExit(f"--classes: give {len(classes)} names, got {len(args.classes)}")
        classes = list(args.classes)
    result = evaluate_pairs(model, tokenizer, images, captions, labels=labels, classes=classes,
                            templates=args.templates)
    sys.stdout.write(json.dumps({k: round(v, 2) for k, v in result.items()}) + "\n")
    return result


def evaluate_shapes(model: Any, tokenizer: Any, classes: Sequence[str],
                    templates: Sequence[str] = DEFAULT_TEMPLATES, *, n: int = 1000,
                    size: int = 32, seed: int = 0) -> dict[str, float]:
    """Zero-shot accuracy and retrieval recall on the first ``n`` test images of ``shapes``."""
    from contrastive.data.generated import generate_shapes, shape_captions

    images, labels = generate_shapes(n, size, seed, "test")
    return evaluate_pairs(model, tokenizer, images.float() / 255, shape_captions(n, seed, "test"),
                          labels=labels, classes=classes, templates=templates)
