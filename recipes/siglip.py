"""SigLIP (Zhai et al. ICCV 2023, arXiv 2303.15343) through the training engine, on any
image-caption data: recipes/clip.py with the pairwise sigmoid loss.

    python recipes/siglip.py                                   # the demo: shapes with captions
    python recipes/siglip.py --data captions:/path/to/images   # images + captions.tsv / .jsonl
    accelerate launch --multi_gpu --num_processes 2 recipes/siglip.py --data wds-captions:/shards
    contrastive-zeroshot runs/siglip                           # zero-shot + retrieval again

Data, tokenizer, towers (``--init``, ``--text-encoder hf:FOLDER``, ``--lock-image``), optimiser,
schedule, evaluation and run folder: recipes/clip.py's (see its docstring; ``clip.pt`` records
``"method": "siglip"``, so ``contrastive-zeroshot`` rebuilds this model). Model
(:class:`contrastive.methods.SigLIP`): CLIP's towers; the loss is the registry's ``siglip`` with
its learnable scale t = exp(t') and bias b, initialised t = 10, b = -10 (the paper's,
``SigLIP.presets["paper"]``; ``--scale-init``, ``--bias-init``), no clamp, no weight decay on
them. Several processes: the paper's chunked exchange (texts passed round the
processes), no gather, so N processes train as one with the whole batch. The optimiser settings
are CLIP's recipe's at this size (AdamW, beta2 0.98, lr 2e-3, batch 128), not the paper's
(ScalingViT-Adafactor, beta2 0.95, batch 32k; see contrastive/methods/siglip.py), so that the
two methods compare on the same budget.
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
from contrastive.methods.siglip import SigLIP

#: the method's keyword arguments in the paper's setting: the one home of these values
PRESET = SigLIP.presets["paper"]


@dataclass
class SigLIPConfig(DualEncoderConfig):
    """SigLIP on image-caption data (see the module docstring and recipes/clip.py); the schedule
    and the towers' sizes are :class:`~contrastive.engine.DualEncoderConfig`'s, as CLIP's."""

    scale_init: float = help_field(PRESET["scale_init"],
                                   "initial logit scale t = exp(t') (the paper's 10)")
    bias_init: float = help_field(PRESET["bias_init"], "initial logit bias b (the paper's -10)")


def model_config(cfg: SigLIPConfig, tokenizer: Any) -> dict[str, Any]:
    """SigLIP's keyword arguments (recorded in clip.pt, so evaluation rebuilds the model)."""
    return {**dual_encoder_kwargs(cfg, tokenizer), "scale_init": cfg.scale_init,
            "bias_init": cfg.bias_init}


def make(argv: list[str] | None = None) -> tuple[type[SigLIPConfig], Any, ImageTextAdapter]:
    """(config class, build_method, adapter): what ``run`` needs (tests call it too)."""
    return SigLIPConfig, build_method, ImageTextAdapter(model_config)


def build_method(cfg: SigLIPConfig, data: DataInfo) -> SigLIP:
    """SigLIP over the training set's tokenizer."""
    return SigLIP(**model_config(cfg, data.tokenizer))


def main(argv: list[str] | None = None) -> Any:
    """Parse ``argv`` and train; returns the :class:`~contrastive.engine.TrainResult`."""
    cls, build_method, adapter = make()
    return run(cls, build_method, adapter=adapter, argv=argv, name="siglip")


if __name__ == "__main__":
    main()
