"""Pictures of what a model learned: ViT self-attention, MAE reconstructions, retrieval grids.

The PNGs of ``contrastive-plot attention | mae | retrieval`` (matplotlib's Agg back-end). Each
figure is a grid of square panels of ``panel_px`` pixels under a header of ``HEADER_PX``:
``cols * panel_px`` by ``rows * panel_px + HEADER_PX`` pixels exactly.

- :func:`cls_attention`: the last block's self-attention of a timm ViT, the class token's query
  over the patches, per head (DINO's figure: Caron et al., "Emerging Properties in
  Self-Supervised Vision Transformers", ICCV 2021, fig. 1 / 3; the authors'
  facebookresearch/dino ``visualize_attention.py``). The attention is recomputed from the block's
  ``qkv`` by a forward hook (``softmax(q k^T * scale)``, timm untouched, fused kernel or not); the
  class row is renormalised over the patches (DINO drops the class column and, for its masks,
  renormalises the same way), so each head's map sums to 1. :func:`mass_mask` is DINO's
  ``--threshold``: the smallest set of patches holding that fraction of the mass (0.6 in its
  figures).
- :func:`mae_reconstruct`: MAE's figure 2 (He et al., CVPR 2022): original, masked, and the
  reconstruction with the visible patches pasted (the authors' ``demo/mae_visualize.ipynb``,
  ``run_one_image``). A model trained with normalised-pixel targets (``norm_pix``) predicts each
  patch's pixels up to its mean and variance; the picture gives each predicted patch the
  original patch's mean and variance (which the model never saw for a masked patch), so it
  shows the predicted structure, not the predicted colour: the figure says so.
- :func:`plot_retrieval`: queries and their top-k neighbours from a ``contrastive-embed`` folder,
  found by its own search (:func:`contrastive.eval.embed_store.search`), the cosine under each.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastive.eval.plot import save_figure, use_agg

__all__ = [
    "HEADER_PX",
    "PictureError",
    "MaeReconstruction",
    "check_attention_vit",
    "last_self_attention",
    "cls_attention",
    "mass_mask",
    "plot_attention",
    "load_mae_run",
    "mae_reconstruct",
    "plot_mae",
    "retrieval_neighbours",
    "plot_retrieval",
    "load_images",
    "unnormalise",
]

log = logging.getLogger(__name__)

HEADER_PX = 44  # two lines of title, and the first row's panel titles
_DPI = 100
_GREY = 0.5  # the masked patches' colour (the paper's figure 2 shows them grey)


class PictureError(ValueError):
    """The input cannot be drawn; one line: the problem and the fix."""


# ---- figures ----------------------------------------------------------------------------------

def _grid(rows: int, cols: int, panel_px: int, title: str) -> tuple[Any, Any]:
    plt = use_agg()
    width, height = cols * panel_px, rows * panel_px + HEADER_PX
    fig, axes = plt.subplots(rows, cols, figsize=(width / _DPI, height / _DPI), dpi=_DPI,
                             squeeze=False)
    fig.subplots_adjust(left=0.005, right=0.995, bottom=0.005, top=1 - HEADER_PX / height,
                        wspace=0.04, hspace=0.16)
    import textwrap

    lines = textwrap.wrap(title, width=max(24, width // 5))
    if len(lines) > 2:
        lines = [lines[0], textwrap.shorten(" ".join(lines[1:]), width=max(24, width // 5))]
    fig.suptitle("\n".join(lines), fontsize=7, y=1 - 3 / height, va="top")
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.axis("off")
    return fig, axes


def _rgb(image: Tensor) -> Any:
    """(3, H, W) in [0, 1] -> an (H, W, 3) array for ``imshow``."""
    return image.clamp(0, 1).permute(1, 2, 0).cpu().numpy()


def _panel(ax: Any, image: Tensor, title: str = "") -> None:
    ax.imshow(_rgb(image), interpolation="nearest")
    if title:
        ax.set_title(title, fontsize=6, pad=2)


def unnormalise(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Normalised images (N, 3, H, W) back to [0, 1] pixels."""
    m = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return (x * s + m).clamp(0, 1)


def load_images(*, images: Sequence[str] = (), data: str | None = None, split: str = "test",
                count: int = 4, transform: Any) -> Tensor:
    """(N, 3, H, W) under ``transform``: the image files ``images``, else ``count`` items spread
    evenly over ``data``'s ``split`` (a data spec, as for training)."""
    from contrastive.eval.features import unwrap_views

    if count < 1:
        raise PictureError(f"--num-images {count}: draw at least one image")
    if images:
        from contrastive.data.io import load_rgb

        missing = [p for p in images if not Path(p).is_file()]
        if missing:
            raise PictureError(f"--images: no such image file {missing[0]}")
        return torch.stack([unwrap_views(transform(load_rgb(p))) for p in images])
    if data is None:
        raise PictureError("give --images FILE ... or --data SPEC (the images to draw)")
    from contrastive.eval.runner import load_split

    ds: Any = load_split(data, split, transform)
    rows = torch.linspace(0, len(ds) - 1, min(count, len(ds))).long().unique().tolist()
    return torch.stack([unwrap_views(ds[i][0]) for i in rows])


# ---- DINO's self-attention maps ---------------------------------------------------------------

def check_attention_vit(encoder: nn.Module, name: str) -> Any:
    """The last block's attention module of a timm ViT, or a one-line :class:`PictureError`."""
    blocks = getattr(encoder, "blocks", None)
    attn = getattr(blocks[-1], "attn", None) if isinstance(blocks, nn.Sequential) and len(blocks) else None
    if attn is None or not all(hasattr(attn, a) for a in ("qkv", "num_heads", "scale")) \
            or not hasattr(encoder, "num_prefix_tokens"):
        raise PictureError(f"encoder {name!r} is not a ViT ({type(encoder).__name__}): self-attention "
                           "maps need a timm VisionTransformer (e.g. timm:vit_small_patch16_224)")
    return attn


@torch.no_grad()
def last_self_attention(vit: nn.Module, images: Tensor) -> Tensor:
    """(N, heads, T, T): the last block's attention probabilities on ``images`` (rows sum to 1),
    ``softmax(q k^T * scale)`` recomputed from the block's ``qkv`` input by a forward hook."""
    attn = check_attention_vit(vit, type(vit).__name__)
    found: list[Tensor] = []

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        x = args[0]
        n, t, _ = x.shape
        q, k, _ = module.qkv(x).reshape(n, t, 3, module.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = getattr(module, "q_norm", nn.Identity())(q), getattr(module, "k_norm", nn.Identity())(k)
        found.append(((q * module.scale) @ k.transpose(-2, -1)).float().softmax(dim=-1))

    handle = attn.register_forward_hook(hook)
    try:
        vit.eval()(images)
    except AssertionError as e:  # timm's check of a fixed input size
        raise PictureError(f"the ViT does not take these {images.shape[-2]} x {images.shape[-1]} images "
                           f"({e}): leave --image-size out (the recorded size) or match it") from None
    finally:
        handle.remove()
    return found[-1]


def cls_attention(vit: nn.Module, images: Tensor) -> Tensor:
    """(N, heads, h, w): the class token's attention to the patches in the last block, per head,
    on the patch grid, renormalised over the patches (each map sums to 1)."""
    net: Any = vit  # a timm ViT (checked), duck-typed
    if getattr(net, "cls_token", None) is None:
        raise PictureError(f"{type(vit).__name__} has no class token (class_token=False): DINO's maps "
                           "are the [CLS] query's attention")
    full = last_self_attention(vit, images)
    patches = full[:, :, 0, int(net.num_prefix_tokens):]
    p = net.patch_embed.patch_size
    h, w = images.shape[-2] // p[0], images.shape[-1] // p[1]
    if h * w != patches.shape[-1]:
        raise PictureError(f"the ViT gives {patches.shape[-1]} patch tokens for a {images.shape[-2]} x "
                           f"{images.shape[-1]} image with {p} patches: pass --image-size")
    return (patches / patches.sum(dim=-1, keepdim=True)).reshape(*patches.shape[:2], h, w)


def mass_mask(maps: Tensor, fraction: float = 0.6) -> Tensor:
    """Bool like ``maps`` (..., h, w): DINO's ``--threshold``, the patches with the largest values
    whose sum holds ``fraction`` of each map's mass (the smallest such set)."""
    flat = maps.flatten(-2)
    values, order = flat.sort(dim=-1)
    values = values / values.sum(dim=-1, keepdim=True)
    keep_sorted = values.cumsum(dim=-1) > 1 - fraction
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted).reshape(maps.shape)


def plot_attention(images: Tensor, maps: Tensor, out: str | Path, *, threshold: float | None = 0.6,
                   with_mean: bool = True, title: str = "", panel_px: int = 128) -> Path:
    """Each image (a row: the image, then the mean over heads, then each head) with the
    class-token attention upsampled to it (nearest, as DINO) over it; ``threshold``: the
    outline of :func:`mass_mask`. ``images`` (N, 3, H, W) in [0, 1], ``maps`` (N, heads, h, w)."""
    n, heads = maps.shape[:2]
    shown = torch.cat([maps.mean(dim=1, keepdim=True), maps], dim=1) if with_mean else maps
    names = (["mean"] if with_mean else []) + [f"head {i}" for i in range(heads)]
    fig, axes = _grid(n, 1 + len(names), panel_px,
                      title or f"last-layer [CLS] attention, {heads} heads"
                      + (f" (outline: {threshold:.0%} of the mass)" if threshold else ""))
    size = images.shape[-2:]
    for r in range(n):
        _panel(axes[r, 0], images[r], "image")
        up = F.interpolate(shown[r : r + 1].float(), size=size, mode="nearest")[0]
        masks = (F.interpolate(mass_mask(shown[r], threshold)[None].float(), size=size, mode="nearest")[0]
                 if threshold else None)
        for c, name in enumerate(names):
            ax = axes[r, c + 1]
            _panel(ax, images[r] * 0.45, name)
            ax.imshow(up[c].cpu().numpy(), cmap="inferno", alpha=0.7, interpolation="nearest")
            if masks is not None and 0 < masks[c].sum() < masks[c].numel():
                ax.contour(masks[c].cpu().numpy(), levels=[0.5], colors="white", linewidths=0.6)
    return save_figure(fig, out, dpi=_DPI)


# ---- MAE reconstructions ----------------------------------------------------------------------

@dataclass
class MaeReconstruction:
    """One masking of a batch, as pixels in [0, 1] (N, 3, H, W), and the patch mask (N, L) bool
    (True: removed). ``pasted`` is the reconstruction with the visible patches of the input."""

    original: Tensor
    masked: Tensor
    reconstruction: Tensor
    pasted: Tensor
    mask: Tensor
    norm_pix: bool


def load_mae_run(run: str | Path) -> tuple[Any, dict[str, Any]]:
    """(the MAE method with its trained weights, in eval mode; the run's settings: ``image_size``,
    ``mean``, ``std``, ``data``, ``step``) from a run folder or one of its checkpoint folders.

    The decoder is only in the training checkpoint (``checkpoints/step_N``, read weights-only by
    :func:`~contrastive.eval.checkpoint.read_checkpoint`); the method is rebuilt from the run's
    config.json (the registered class its checkpoints record, with the config's values for its
    arguments) and must take the checkpoint's tensors exactly."""
    import inspect

    from contrastive.eval.checkpoint import read_checkpoint
    from contrastive.methods import method_class
    from contrastive.records import CHECKPOINTS, META, find_latest

    path = Path(run).expanduser()
    folder = path if (path / META).is_file() else find_latest(path / CHECKPOINTS)
    if folder is None:
        raise PictureError(f"{run}: no training checkpoint (checkpoints/step_*/{META}); MAE pictures "
                           "need the decoder, which only the training checkpoints hold (not encoder.pt)")
    meta = json.loads((folder / META).read_text(encoding="utf-8"))
    method = str((meta.get("signature") or {}).get("method", ""))
    if method.lower() != "mae":
        raise PictureError(f"{run} is a run of {method or 'an unknown method'}, not MAE: give a run of "
                           "recipes/mae_cifar.py or recipes/mae_in1k.py")
    raw = read_checkpoint(folder)
    config = raw.config or meta.get("config") or {}
    cls = method_class("mae")
    params = inspect.signature(cls).parameters
    kwargs = {k: config[k] for k in params if k in config and k not in ("encoder", "encoder_kwargs")}
    model = cls(encoder=raw.encoder_name, encoder_kwargs=raw.settings.get("encoder_kwargs") or {},
                **{**kwargs, "mae_init": False})
    try:
        model.load_state_dict(raw.state_dict, strict=True)
    except RuntimeError as e:
        raise PictureError(f"{folder}: the checkpoint does not fit the MAE its run's config.json "
                           f"describes ({str(e).splitlines()[0]}); was config.json edited?") from None
    from contrastive.augment import IMAGENET_MEAN, IMAGENET_STD

    settings = {"image_size": raw.settings.get("image_size") or 224,
                "mean": raw.settings.get("mean") or list(IMAGENET_MEAN),
                "std": raw.settings.get("std") or list(IMAGENET_STD),
                "data": config.get("data"), "step": meta.get("step")}
    return model.eval(), settings


@torch.no_grad()
def mae_reconstruct(method: Any, images: Tensor, *, mean: Sequence[float], std: Sequence[float],
                    mask_ratio: float | None = None, seed: int = 0) -> MaeReconstruction:
    """Mask ``images`` (N, 3, H, W, normalised with ``mean`` / ``std``) at random (``seed``; the
    run's ratio unless ``mask_ratio``), reconstruct them with the trained MAE ``method``."""
    from contrastive.nn.masked_vit import masked_tokens
    from contrastive.nn.masking import patchify, random_masking, unpatchify

    p, (height, width) = method.patch_size, images.shape[-2:]
    ratio = method.mask_ratio if mask_ratio is None else mask_ratio
    masking = random_masking(images.shape[0], method.num_patches, ratio,
                             generator=torch.Generator().manual_seed(seed))
    latent = masked_tokens(method.encoder, images, keep=masking.keep)
    pred = method.decoder(latent, masking.restore).float()
    norm_pix = bool(getattr(method.criterion, "norm_pix", False))
    if norm_pix:  # the target patch's own statistics (what the model predicts relative to)
        target = patchify(images.float(), p)
        eps = float(getattr(method.criterion, "eps", 1e-6))
        pred = pred * (target.var(dim=-1, keepdim=True) + eps).sqrt() + target.mean(dim=-1, keepdim=True)
    original = unnormalise(images.float(), mean, std)
    recon = unnormalise(unpatchify(pred, p, height, width), mean, std)
    removed = unpatchify(masking.mask[..., None].float().expand(-1, -1, p * p * images.shape[1]),
                         p, height, width).bool()
    return MaeReconstruction(original, torch.where(removed, torch.full_like(original, _GREY), original),
                             recon, torch.where(removed, recon, original), masking.mask, norm_pix)


def plot_mae(rec: MaeReconstruction, out: str | Path, *, title: str = "", panel_px: int = 128) -> Path:
    """One row per image: original, masked, reconstruction + visible (MAE's figure 2 and demo)."""
    ratio = rec.mask.float().mean().item()
    note = ("; norm_pix: predicted patches at the true patches' mean and variance" if rec.norm_pix
            else "")
    fig, axes = _grid(rec.original.shape[0], 3, panel_px,
                      (title or "MAE") + f": {ratio:.0%} of the patches masked{note}")
    for r in range(rec.original.shape[0]):
        _panel(axes[r, 0], rec.original[r], "original")
        _panel(axes[r, 1], rec.masked[r], "masked")
        _panel(axes[r, 2], rec.pasted[r], "reconstruction + visible")
    return save_figure(fig, out, dpi=_DPI)


# ---- retrieval grids --------------------------------------------------------------------------

def retrieval_neighbours(folder: str | Path, *, rows: Sequence[int] = (), queries: Sequence[str] = (),
                         top_k: int = 5) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the manifest, one entry per query: ``query`` (a corpus row or an image file), ``row``
    (None for a file), ``neighbours`` [(row, cosine)] best first) from the ``contrastive-embed``
    folder's own search; a corpus row is not its own neighbour. Query files are embedded by the
    encoder the manifest records (as ``contrastive-embed --query``)."""
    from contrastive.eval import embed
    from contrastive.eval.embed_store import read_vectors, search

    out = Path(folder).expanduser()
    if not out.is_dir():
        raise PictureError(f"{folder}: no such contrastive-embed folder (embed a corpus first: "
                           "contrastive-embed --checkpoint RUN --data IMAGES --out FOLDER)")
    manifest = embed.load_manifest(out)
    if manifest.get("modality") != "image":
        raise PictureError(f"{folder} holds {manifest.get('modality')} embeddings: a retrieval grid "
                           "shows images (embed an image folder or shards)")
    count = int(manifest["count"])
    if top_k < 1:
        raise PictureError(f"--top-k {top_k}: show at least one neighbour")
    if not rows and not queries:
        raise PictureError("give the queries: --rows (corpus rows) or --query FILE ...")
    bad = [r for r in rows if not 0 <= r < count]
    if bad:
        raise PictureError(f"--rows {bad[0]}: the corpus has rows 0-{count - 1}")
    found = []
    if rows:
        vectors, _ = read_vectors(out, manifest)
        for r in rows:
            hits = search(out, manifest, torch.from_numpy(vectors[r]), top_k + 1)
            found.append({"query": r, "row": r, "neighbours": [h for h in hits if h[0] != r][:top_k]})
    if queries:
        corpus = embed.query_corpus(out, manifest, torch.device("cpu"))
        for q in queries:
            found.append({"query": q, "row": None,
                          "neighbours": search(out, manifest, corpus.encode_query(q), top_k)})
    return manifest, found


def plot_retrieval(folder: str | Path, out: str | Path, *, rows: Sequence[int] = (),
                   queries: Sequence[str] = (), top_k: int = 5, panel_px: int = 112) -> tuple[Path, list[dict[str, Any]]]:
    """The grid: each query (a corpus row or an image file) and its ``top_k`` neighbours, the
    cosine similarity under each; the images are the embedded ones, reread from the corpus
    (``manifest["data"]``) at the encoder's crop, unnormalised. Returns (PNG, the neighbours)."""
    from contrastive.data.io import load_rgb
    from contrastive.eval import embed
    from contrastive.eval.embed_store import read_vectors
    from contrastive.eval.features import unwrap_views
    from contrastive.eval.runner import eval_transform

    manifest, found = retrieval_neighbours(folder, rows=rows, queries=queries, top_k=top_k)
    size = int(manifest["encoder"].get("image_size") or 224)
    show = eval_transform(size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    data = str(manifest.get("data"))
    try:
        ds: Any = embed.image_dataset(data, manifest.get("split") or "train", show)
    except (embed.BadInput, FileNotFoundError, ValueError) as e:
        raise PictureError(f"{folder}: the embedded images ({data}) cannot be read ({e}); the grid "
                           "shows them") from None
    ids = read_vectors(Path(folder).expanduser(), manifest)[1]
    cols = 1 + max((len(f["neighbours"]) for f in found), default=0)
    fig, axes = _grid(len(found), cols, panel_px,
                      f"top-{top_k} neighbours (cosine) in {Path(folder).name} "
                      f"({(manifest.get('index') or {}).get('type', 'exact')} search)")
    for r, f in enumerate(found):
        query = (unwrap_views(ds[f["row"]][0]) if f["row"] is not None
                 else unwrap_views(show(load_rgb(f["query"]))))
        _panel(axes[r, 0], query, f"query: {Path(ids[f['row']] if f['row'] is not None else f['query']).name}"[:28])
        for c, (row, sim) in enumerate(f["neighbours"], 1):
            _panel(axes[r, c], unwrap_views(ds[row][0]), f"{sim:.3f}  {Path(ids[row]).name}"[:28])
    return save_figure(fig, out, dpi=_DPI), found


def parse_rows(text: str) -> list[int]:
    """``--rows 0,5,9`` -> [0, 5, 9] (argparse type)."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows {text!r}: comma-separated corpus row numbers, "
                                         "e.g. 0,5,9") from None
