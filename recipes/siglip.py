"""SigLIP (Zhai et al. ICCV 2023, arXiv 2303.15343) through the training engine, on any
image-caption data: recipes/clip.py with the pairwise sigmoid loss.

    python recipes/siglip.py                                   # the demo: shapes with captions
    python recipes/siglip.py --data captions:/path/to/images   # images + captions.tsv / .jsonl
    accelerate launch --multi_gpu --num_processes 2 recipes/siglip.py --data wds-captions:/shards
    contrastive-zeroshot runs/siglip                           # zero-shot + retrieval again

Data, tokenizer, towers, optimiser, schedule, evaluation and run folder: recipes/clip.py's (see
its docstring; ``clip.pt`` records ``"method": "siglip"``, so ``contrastive-zeroshot`` rebuilds
this model). Model (:class:`contrastive.methods.SigLIP`): CLIP's towers; the loss is the registry's
``siglip`` with its learnable scale t = exp(t') and bias b, initialised t = 10, b = -10 (the
paper's; ``--scale-init``, ``--bias-init``), no clamp, no weight decay on them. Several
processes: the paper's chunked exchange (texts passed round the processes), no gather, so N
processes train as one with the whole batch. The optimiser settings are CLIP's recipe's at this
size, not the paper's (Adam(W) with batch 32k, lr 1e-3, weight decay 1e-4 at its scale), so
that the two methods compare on the same budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contrastive.engine import ImageTextAdapter, ImageTextConfig, help_field, run


@dataclass
class SigLIPConfig(ImageTextConfig):
    """SigLIP on image-caption data (see the module docstring and recipes/clip.py)."""

    steps: int = help_field(300, "optimiser steps (the budget the schedule follows)")
    batch_size: int = 128
    optimizer: str = help_field("adamw", "AdamW with decoupled weight decay (CLIP)",
                                choices=("sgd", "adamw", "lars"))
    lr: float = 2e-3
    lr_scaling: str = help_field("none", "lr is absolute", choices=("linear", "sqrt", "none"))
    weight_decay: float = help_field(0.1, "CLIP uses 0.2 at scale; 0.1 at this size")
    betas: tuple[float, float] = help_field((0.9, 0.98), "CLIP's AdamW betas")
    warmup_steps: int = 50
    save_every_steps: int = 100
    num_workers: int = 0
    log_every: int = 50
    # model
    dim: int = help_field(64, "shared embedding width")
    text_layers: int = help_field(2, "text encoder layers")
    text_width: int = help_field(64, "text encoder hidden size")
    text_heads: int = help_field(2, "text encoder attention heads")
    text_dropout: float = help_field(0.1, "text encoder dropout (hidden and attention; BERT's)")
    scale_init: float = help_field(10.0, "initial logit scale t = exp(t') (the paper's 10)")
    bias_init: float = help_field(-10.0, "initial logit bias b (the paper's -10)")


def model_config(cfg: SigLIPConfig, tokenizer: Any) -> dict[str, Any]:
    """SigLIP's keyword arguments (recorded in clip.pt, so evaluation rebuilds the model)."""
    return dict(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options(), text_encoder="bert",
                dim=cfg.dim, scale_init=cfg.scale_init, bias_init=cfg.bias_init,
                text_kwargs=dict(
                    num_layers=cfg.text_layers, hidden_size=cfg.text_width,
                    num_heads=cfg.text_heads, vocab_size=tokenizer.vocab_size,
                    dropout=cfg.text_dropout, attention_dropout=cfg.text_dropout,
                    max_position_embeddings=int(tokenizer.max_length), pooling="mean"))


def make(argv: list[str] | None = None) -> tuple[type[SigLIPConfig], Any, ImageTextAdapter]:
    """(config class, build_method, adapter): what ``run`` needs (tests call it too)."""
    adapter = ImageTextAdapter(model_config)

    def build_method(cfg: SigLIPConfig) -> Any:
        from contrastive.methods import SigLIP

        return SigLIP(**model_config(cfg, adapter.tokenizer))  # tokenizer: the training set's

    return SigLIPConfig, build_method, adapter


def main(argv: list[str] | None = None) -> Any:
    """Parse ``argv`` and train; returns the :class:`~contrastive.engine.TrainResult`."""
    cls, build_method, adapter = make()
    return run(cls, build_method, adapter=adapter, argv=argv, name="siglip")


if __name__ == "__main__":
    main()
