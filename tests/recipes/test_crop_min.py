"""``--crop-min`` of the CIFAR recipes reaches their two-view pipelines (the learning checks on
``shapes`` and the methods table run them with whole-image crops, ``--crop-min 1.0``)."""

from __future__ import annotations

import pytest

from contrastive.engine import parse_config

# recipe -> its default crop minimum (solo-learn's CIFAR configurations; SimCLR's paper setup)
DEFAULTS = {"byol_cifar": 0.08, "simsiam_cifar": 0.2, "supcon_cifar": 0.08, "nnclr_cifar": 0.08,
            "barlow_twins_cifar": 0.08, "vicreg_cifar": 0.2, "swav_cifar": 0.08,
            "dino_cifar": 0.08, "simclr_cifar": 0.08}


def _config_class(mod):
    return next(v for v in vars(mod).values() if isinstance(v, type) and hasattr(v, "lr")
                and v.__module__ == mod.__name__)


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_crop_min_reaches_every_view(name, rx):
    mod = rx.load_recipe(name)
    cls = _config_class(mod)
    default = mod.build_pipeline(parse_config(cls, ["--data", "shapes"]))
    assert {v.scale for v in default.views} == {(DEFAULTS[name], 1.0)}
    whole = mod.build_pipeline(parse_config(cls, ["--data", "shapes", "--crop-min", "1.0"]))
    assert len(whole.views) == len(default.views) == 2
    assert {v.scale for v in whole.views} == {(1.0, 1.0)}


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5])
def test_crop_min_out_of_range_is_refused(value, rx):
    cls = _config_class(rx.load_recipe("byol_cifar"))
    with pytest.raises(ValueError, match="--crop-min"):
        cls(data="shapes", crop_min=value).validate()


@pytest.mark.parametrize("name,boundary", [("ibot_cifar", 0.25), ("dinov2_cifar", 0.32)])
def test_crop_min_splits_global_and_local_crops_of_the_multicrop_recipes(name, boundary, rx):
    """iBOT / DINOv2: --crop-min is where the global crops end and the local ones begin."""
    mod = rx.load_recipe(name)
    cls = _config_class(mod)
    for value in (boundary, 0.4):
        args = ["--data", "shapes"] + ([] if value == boundary else ["--crop-min", str(value)])
        views = mod.build_pipeline(parse_config(cls, args)).views
        assert {v.scale for v in views} == {(value, 1.0), (0.05, value)}


@pytest.mark.parametrize("name", ["swav_cifar", "dino_cifar"])
def test_crop_min_with_local_crops_is_refused_where_the_multicrop_keeps_its_scales(name, rx):
    cls = _config_class(rx.load_recipe(name))
    cls(data="shapes", local_crops=2).validate()  # the default --crop-min: accepted
    cls(data="shapes", crop_min=0.5).validate()  # two views read it
    with pytest.raises(ValueError, match="--crop-min 0.5 is not used with --local-crops"):
        cls(data="shapes", crop_min=0.5, local_crops=2).validate()
