"""The ViT recipes' crops fit their ViT: dino_vit_small's 96-px local crops go through the
method its defaults build (a ViT-S/16 made for 224 px, built with ``dynamic_img_size`` so that
timm resamples the position embedding to the crop's patch grid, as DINO's
``interpolate_pos_encoding``), where the fixed-size ViT rejects them; mocov3_vit_small has no
local crops (every view is ``--image-size``)."""

from __future__ import annotations

import pytest
import torch

from contrastive.engine import data_info, parse_config


def _dino_step(mod, *args: str) -> torch.Tensor:
    """One training forward and backward of the recipe's method on one image per crop, the
    crops at the sizes of the recipe's pipeline (2 x 224 px, then the 96-px local crops)."""
    cfg = parse_config(mod.DINOViTSmall, ["--data", "shapes", "--out-dim", "32",
                                          "--local-crops", "1", *args])
    method = mod.build_method(cfg, data_info(cfg, 10 * cfg.batch_size))  # no dataset read
    sizes = [v.size for v in mod.build_pipeline(cfg).views]
    assert sizes == [224, 224, 96]
    torch.manual_seed(0)
    views = [torch.randn(1, 3, s, s) for s in sizes]
    out = method({"views": views, "momentum": 0.996, "teacher_temperature": 0.04})
    out["loss"].backward()
    return out["loss"]


def test_dino_vit_small_takes_its_96px_local_crops(rx, monkeypatch):
    mod = rx.load_recipe("dino_vit_small")
    loss = _dino_step(mod)
    assert torch.isfinite(loss)
    with pytest.raises(AssertionError, match="doesn't match model"):
        _dino_step(mod, "--encoder-kwargs", "{}")  # timm's fixed 224-px ViT


def test_mocov3_vit_small_has_no_local_crops(rx):
    mod = rx.load_recipe("mocov3_vit_small")
    cfg = parse_config(mod.MoCoV3ViTSmall, ["--data", "shapes"])
    assert [v.size for v in mod.build_pipeline(cfg).views] == [224, 224]
