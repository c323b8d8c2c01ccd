"""CLIP (Radford et al. 2021) through the training engine, on any image-caption data.

    python recipes/clip.py                                   # the demo: shapes with captions, CPU minutes
    python recipes/clip.py --data captions:/path/to/images   # images + captions.tsv / .jsonl
    python recipes/clip.py --init FILE --lock-image --text-encoder hf:FOLDER   # LiT
    accelerate launch --multi_gpu --num_processes 2 recipes/clip.py --data wds-captions:/shards
    contrastive-zeroshot runs/clip                           # zero-shot + retrieval again

Data (``--data``, needs the ``text`` extra): ``shapes-captions`` (the built-in ``shapes`` with five
generated captions per image, the default), ``captions:ROOT`` (image files under ROOT with a
``captions.tsv`` / ``captions.jsonl``) or ``wds-captions:DIR`` (WebDataset shards of ``.jpg`` +
``.txt``); a deterministic WordPiece tokenizer is trained on the training captions, and one
caption per image is drawn per epoch, seeded by (seed, epoch, index). Images are centre crops
scaled to [0, 1], without augmentation: the captions name colour and position, which crops and
colour jitter would falsify.

Model (:class:`contrastive.methods.CLIP`): the ``--encoder`` image backbone (``small_cnn``; from
``--init SOURCE``'s weights when given), a ``--layers`` x ``--hidden`` BERT text encoder (random
init, mean pooling; ``--text-encoder hf:FOLDER``: a local Hugging Face checkpoint, mean pooled,
whose tokenizer then tokenises the captions), a ``--dim`` shared space, the learnable logit scale clamped after every optimiser step. AdamW (CLIP:
decoupled weight decay 0.2, beta2 0.98; here 0.1 at this size), lr 2e-3 absolute, cosine schedule
after a 50-step linear warm-up, a 300-step budget (``--steps``) at global batch 128. Every engine
flag works (``--help``): ``--max-steps``, ``--resume auto``, ``--mixed-precision``, ``--float64``,
checkpoints, SIGTERM (exit 75), several processes (the negatives are gathered with their
gradient, so N processes train as one with the whole batch). ``--lock-image`` is LiT (Zhai et al.
2022): the image tower frozen, BatchNorm statistics included, the text tower and both projections
trained (:class:`~contrastive.methods.dual_encoder.DualEncoder` says what big_vision does).

Evaluation: zero-shot top-1/top-5 on the held-out split's class names (prompts ``"a {}"``, ``"a
picture of a {}"``, ``"there is a {}"``) and retrieval recall@1/5 both ways, at the end and every
``--eval-every`` steps, into ``metrics.jsonl``. Run folder: the engine's (``config.json``,
``metrics.jsonl``, ``checkpoints/``, ``run_state.json``) plus ``clip.pt`` (weights + model
configuration; ``weights_only`` loads it), ``tokenizer/`` and the image tower's ``encoder.pt``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contrastive.engine import (
    DataInfo,
    DualEncoderConfig,
    ImageTextAdapter,
    dual_encoder_kwargs,
    help_field,
    run,
)


@dataclass
class ClipConfig(DualEncoderConfig):
    """CLIP on image-caption data (see the module docstring for the sources); the schedule and
    the towers' sizes are :class:`~contrastive.engine.DualEncoderConfig`'s."""

    temperature: float = help_field(0.07, "initial temperature (logit scale log(1 / t))")


def model_config(cfg: ClipConfig, tokenizer: Any) -> dict[str, Any]:
    """CLIP's keyword arguments (recorded in clip.pt, so evaluation rebuilds the model)."""
    return {**dual_encoder_kwargs(cfg, tokenizer), "temperature": cfg.temperature}


def make(argv: list[str] | None = None) -> tuple[type[ClipConfig], Any, ImageTextAdapter]:
    """(config class, build_method, adapter): what ``run`` needs (tests call it too)."""
    return ClipConfig, build_method, ImageTextAdapter(model_config)


def build_method(cfg: ClipConfig, data: DataInfo) -> Any:
    """CLIP over the training set's tokenizer."""
    from contrastive.methods import CLIP

    return CLIP(**model_config(cfg, data.tokenizer))


def main(argv: list[str] | None = None) -> Any:
    """Parse ``argv`` and train; returns the :class:`~contrastive.engine.TrainResult`."""
    cls, build_method, adapter = make()
    return run(cls, build_method, adapter=adapter, argv=argv, name="clip")


if __name__ == "__main__":
    main()
