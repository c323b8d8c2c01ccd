"""Recipe pieces against the official code's formulas: MoCo v3's momentum schedule and the
ViT's fixed 2-D sin-cos position embedding; the hyper-parameters the papers fix."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_mocov3_momentum_matches_official_formula(rx):
    from contrastive.engine import parse_config

    mod = rx.load_recipe("mocov3_r50")
    cfg = parse_config(mod.MoCoV3R50, ["--data", "shapes", "--encoder", "small_cnn",
                                        "--mlp-hidden", "16", "--dim", "8"])
    momentum = rx.build_alone(mod, cfg).schedules()["momentum"]  # the recipe's m0, the method's law
    epochs, spe = cfg.epochs, 7
    for step in range(0, epochs * spe, 37):
        epoch = step / spe  # main_moco.py: epoch + i / iters_per_epoch
        ref = 1.0 - 0.5 * (1.0 + math.cos(math.pi * epoch / epochs)) * (1.0 - 0.99)
        assert momentum(step, epochs * spe) == pytest.approx(ref, abs=1e-12)
    cfg.momentum_cosine = False
    assert rx.build_alone(mod, cfg).schedules()["momentum"](5 * spe, epochs * spe) == 0.99


def test_sincos_position_embedding_matches_formula():
    from contrastive.nn.pos_embed import sincos_pos_embed

    grid, dim = 3, 8
    pe = sincos_pos_embed(grid, dim)
    assert pe.shape == (1, 1 + grid * grid, dim) and torch.all(pe[0, 0] == 0)
    quarter = dim // 4
    for p in range(grid * grid):
        r, c = p // grid, p % grid
        for i in range(quarter):
            w = 10000.0 ** (-i / quarter)
            expected = [math.sin(r * w), math.cos(r * w), math.sin(c * w), math.cos(c * w)]
            got = [pe[0, 1 + p, k * quarter + i].item() for k in range(4)]
            assert got == pytest.approx(expected, abs=1e-6)


def test_vit_recipe_fixes_every_position_embedding(rx):
    mod = rx.load_recipe("mocov3_vit_small")
    from contrastive.engine import parse_config
    from contrastive.nn.pos_embed import sincos_pos_embed

    cfg = parse_config(mod.MoCoV3ViTSmall, ["--data", "shapes", "--encoder",
                                            "timm:vit_tiny_patch16_224", "--mlp-hidden", "32",
                                            "--dim", "16"])
    method = rx.build_alone(mod, cfg)
    embeds = [m.pos_embed for m in method.modules() if hasattr(m, "pos_embed")]
    assert len(embeds) == 2  # query and key ViTs
    for pe in embeds:
        assert not pe.requires_grad
        torch.testing.assert_close(pe.data, sincos_pos_embed(14, 192))
    assert not any(p.requires_grad for p in method.encoder.patch_embed.parameters())


@pytest.mark.parametrize("name, values", [
    ("moco_r50", dict(lr=0.03, batch_size=256, epochs=200, weight_decay=1e-4, queue_size=65536,
                      momentum=0.999, temperature=0.2, dim=128, mlp_hidden=2048)),
    ("mocov1_r50", dict(lr=0.03, batch_size=256, epochs=200, lr_milestones=(120, 160),
                        temperature=0.07, queue_size=65536, momentum=0.999)),
    ("mocov3_r50", dict(lr=0.6, batch_size=4096, epochs=100, weight_decay=1e-6,
                        warmup_epochs=10, temperature=1.0, momentum=0.99, dim=256,
                        mlp_hidden=4096, optimizer="lars", crop_min=0.2)),
    ("mocov3_vit_small", dict(lr=1.5e-4, batch_size=4096, epochs=300, weight_decay=0.1,
                              warmup_epochs=40, temperature=0.2, optimizer="adamw",
                              crop_min=0.08, freeze_patch_embed=True)),
    ("simclr_r50", dict(lr=0.3, batch_size=4096, epochs=100, weight_decay=1e-6,
                        warmup_epochs=10, temperature=0.1, optimizer="lars")),
    ("simclr_cifar", dict(lr=1.0, batch_size=512, epochs=1000, weight_decay=1e-4,
                          temperature=0.5, color_strength=0.5, optimizer="lars")),
    ("dcl_cifar", dict(batch_size=256, epochs=200, temperature=0.1, dim=128)),
    ("dcl_cifar", dict(weighting="none", sigma=0.5)),  # --weighting vmf: DCLW's sigma
    ("moco_cifar", dict(lr=0.03, batch_size=512, epochs=200, weight_decay=5e-4,
                        queue_size=4096, momentum=0.99, temperature=0.1, split_bn=8)),
])
def test_paper_defaults(rx, name, values):
    import dataclasses

    mod = rx.load_recipe(name)
    (cls,) = [v for v in vars(mod).values()
              if dataclasses.is_dataclass(v) and v.__module__ == mod.__name__]
    cfg = cls()
    for key, value in values.items():
        assert getattr(cfg, key) == value, key


# recipe -> (method class name, preset): a paper's hyper-parameters, written in the recipe's
# config and in the method's presets, must agree
RECIPE_PRESETS = {
    "barlow_twins_cifar": ("BarlowTwins", "cifar"), "barlow_twins_r50": ("BarlowTwins", "resnet50"),
    "byol_cifar": ("BYOL", "cifar"), "byol_r50": ("BYOL", "resnet50"),
    "dino_cifar": ("DINO", "cifar"), "dino_vit_small": ("DINO", "vit_small"),
    "densecl_cifar": ("DenseCL", "cifar"), "densecl_r50": ("DenseCL", "r50"),
    "moco_cifar": ("MoCo", "cifar"), "moco_r50": ("MoCo", "v2"), "mocov1_r50": ("MoCo", "v1"),
    "mocov3_r50": ("MoCoV3", "resnet50"), "mocov3_vit_small": ("MoCoV3", "vit_small"),
    "nnclr_cifar": ("NNCLR", "cifar"), "nnclr_r50": ("NNCLR", "resnet50"),
    "simclr_cifar": ("SimCLR", "cifar"),
    "dcl_cifar": ("DCL", "cifar"),
    "simclr_r50": ("SimCLR", "imagenet"), "simsiam_cifar": ("SimSiam", "cifar"),
    "simsiam_r50": ("SimSiam", "resnet50"), "supcon_cifar": ("SupCon", "cifar"),
    "supcon_r50": ("SupCon", "resnet50"),
    "swav_cifar": ("SwAV", "cifar"), "swav_r50": ("SwAV", "resnet50"),
    "vicreg_cifar": ("VICReg", "cifar"), "vicreg_r50": ("VICReg", "resnet50"),
    "vicregl_cifar": ("VICRegL", "cifar"), "vicregl_in1k": ("VICRegL", "resnet50"),
    "simcse": ("SimCSE", "sup"),  # the default --mode; --mode unsup builds the other preset
    "siglip": ("SigLIP", "paper"),
    "mae_cifar": ("MAE", "cifar"), "mae_in1k": ("MAE", "vit_large"),
    "simmim_cifar": ("SimMIM", "cifar"), "simmim_in1k": ("SimMIM", "vit_base"),
    "ijepa_cifar": ("IJEPA", "cifar"), "ijepa_vith14_in1k": ("IJEPA", "vit_huge14"),
    "ibot_cifar": ("IBOT", "cifar"), "ibot_in1k": ("IBOT", "vit_small"),
    "msn_cifar": ("MSN", "cifar"), "msn_vits16_in1k": ("MSN", "vit_small"),
    "dinov2_cifar": ("IBOT", "dinov2_cifar"), "dinov2_in1k": ("IBOT", "dinov2_in1k"),
}
# presets no recipe builds (a variant of a recipe's preset, or a model size without a recipe)
PRESETS_WITHOUT_RECIPE = {("DCL", "imagenet"), ("DCLW", "imagenet"),
                          ("DCLW", "cifar"),  # recipes/dcl_cifar.py --weighting vmf
                          ("MoCo", "cifar_symmetric"), ("MoCoV3", "resnet50_1000ep"),
                          ("MoCoV3", "vit_base"), ("DeepInfoMax", "*"),
                          ("SimCSE", "unsup"),  # recipes/simcse.py --mode unsup
                          ("MAE", "vit_base"),  # recipes/mae_in1k.py trains the ViT-L preset
                          # DINOv2's ViT-L/14 on LVD-142M (train/vitl14.yaml): data the
                          # toolkit has no recipe for; dinov2_in1k is its ImageNet-1k setup
                          ("IBOT", "dinov2")}

# where a recipe deliberately departs from its preset, and why
RECIPE_OVERRIDES = {
    # the official README's CIFAR-10 command trains --resnet_depth=18; the paper's appendix B.9
    # (the preset) a ResNet-50
    "simclr_cifar": {"encoder": "cifar_resnet18"},
}


class _Built(Exception):
    pass


def _constructor_arguments(rx, monkeypatch, recipe: str, cls) -> dict:
    """The keyword arguments the recipe's build_method passes (defaults filled in), with the
    recipe's default configuration; nothing is built."""
    import inspect

    from contrastive.engine import RunConfig, data_info, parse_config

    seen: dict = {}
    init = cls.__init__

    def capture(self, *args, **kwargs):
        bound = inspect.signature(init).bind(self, *args, **kwargs)
        bound.apply_defaults()
        seen.update({k: v for k, v in bound.arguments.items() if k != "self"})
        raise _Built

    monkeypatch.setattr(cls, "__init__", capture)
    mod = rx.load_recipe(recipe)
    config_class = next(v for v in vars(mod).values() if isinstance(v, type)
                        and v.__module__ == mod.__name__ and issubclass(v, RunConfig))
    with pytest.raises(_Built):
        if hasattr(mod, "make"):  # image-text and text: a stand-in for the run's tokenizer
            cfg = parse_config(config_class, [])
            mod.build_method(cfg, data_info(cfg, cfg.batch_size, kit={"tokenizer": SimpleNamespace(
                vocab_size=100, max_length=16)}))
        else:
            rx.build_alone(mod, parse_config(config_class, ["--data", "shapes"]))
    return seen


@pytest.mark.parametrize("recipe", sorted(RECIPE_PRESETS))
def test_recipe_defaults_equal_the_method_preset(recipe, rx, monkeypatch):
    import contrastive.methods as methods

    cls_name, preset = RECIPE_PRESETS[recipe]
    cls = getattr(methods, cls_name)
    got = _constructor_arguments(rx, monkeypatch, recipe, cls)
    expected = {**cls.presets[preset], **RECIPE_OVERRIDES.get(recipe, {})}
    differ = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    assert not differ, f"{recipe} vs {cls_name}.presets[{preset!r}] (recipe, preset): {differ}"


# preset keys a recipe derives instead of reading (MoCo v3: ``vit`` from the encoder's name)
DERIVED = {"mocov3_r50": {"vit"}, "mocov3_vit_small": {"vit"}, "simcse": {"mlp_only_train"}}


def _changed(value):
    """Another value of the same type (a string stays a string, a flag flips)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, dict):
        return {**value, "changed": 1}
    if isinstance(value, (tuple, list)):  # a range such as iBOT's mask ratio
        return type(value)(_changed(v) for v in value)
    if isinstance(value, (int, float)):
        return value + 1 if isinstance(value, int) else value / 2
    return f"{value}_x"


@pytest.mark.parametrize("recipe", sorted(RECIPE_PRESETS))
def test_recipe_reads_the_method_preset(recipe, rx, monkeypatch):
    """One home for a paper's settings: each method argument the preset holds reaches the
    recipe's build_method from the preset itself (change it there and the recipe follows), not
    from a copy in the recipe. Would fail for a recipe default written as a literal."""
    import contrastive.methods as methods

    cls_name, preset = RECIPE_PRESETS[recipe]
    cls = getattr(methods, cls_name)
    keys = [k for k, v in cls.presets[preset].items() if v is not None and k not in
            {*RECIPE_OVERRIDES.get(recipe, {}), *DERIVED.get(recipe, ())}]
    for key in keys:
        monkeypatch.setitem(cls.presets[preset], key, _changed(cls.presets[preset][key]))
    got = _constructor_arguments(rx, monkeypatch, recipe, cls)
    stale = {k: got.get(k) for k in keys if got.get(k) != cls.presets[preset][k]}
    assert not stale, f"{recipe}: not read from {cls_name}.presets[{preset!r}]: {stale}"


def test_every_preset_has_a_recipe_or_is_listed():
    import contrastive.methods as methods

    covered = set(RECIPE_PRESETS.values())
    for name in dir(methods):
        cls = getattr(methods, name)
        for preset in getattr(cls, "presets", {}) if isinstance(cls, type) else {}:
            key = (name, preset)
            assert key in covered or key in PRESETS_WITHOUT_RECIPE or (name, "*") in \
                PRESETS_WITHOUT_RECIPE, f"preset {key} has no recipe: map it in RECIPE_PRESETS"


def test_dcl_recipe_builds_dclw_with_vmf_weighting(rx):
    """recipes/dcl_cifar.py is both of the paper's methods: --weighting vmf is DCLW."""
    from contrastive.engine import data_info
    from contrastive.methods import DCL, DCLW

    mod = rx.load_recipe("dcl_cifar")
    cfgs = {w: mod.DCLCifar(encoder="small_cnn", weighting=w, sigma=0.7) for w in ("none", "vmf")}
    built = {w: mod.build_method(cfg, data_info(cfg, cfg.batch_size)) for w, cfg in cfgs.items()}
    assert type(built["none"]) is DCL and type(built["vmf"]) is DCLW
    assert built["vmf"].criterion.sigma == 0.7


def test_dcl_recipe_reads_dclw_sigma_from_its_preset(rx, monkeypatch):
    """DCLW.presets["cifar"] (listed as without a recipe of its own) is still the one home of
    --sigma: change it there and recipes/dcl_cifar.py's default follows."""
    from contrastive.methods import DCLW

    monkeypatch.setitem(DCLW.presets["cifar"], "sigma", 0.25)
    assert rx.load_recipe("dcl_cifar").DCLCifar().sigma == 0.25


def _image_recipes() -> list[str]:
    """Every recipe on the image kit (its configuration an ImageConfig)."""
    import ast

    names = []
    for path in sorted(ROOT.glob("recipes/*.py")):
        tree = ast.parse(path.read_text())
        bases = {getattr(b, "id", getattr(b, "attr", "")) for node in ast.walk(tree)
                 if isinstance(node, ast.ClassDef) for b in node.bases}
        if bases & {"ImageConfig", "CifarConfig", "DIMConfig"}:
            names.append(path.stem)
    return names


@pytest.mark.parametrize("recipe", _image_recipes())
def test_every_image_recipe_builds_its_backbone_by_name_so_init_reaches_it(recipe, rx):
    """``--init`` loads into each ``--encoder`` backbone a method creates
    (:func:`~contrastive.nn.encoders.starting_weights`), before the method copies it: every
    image recipe's build_method creates one, at its default configuration (the build stops
    there: the rest of the method is not needed)."""
    from contrastive.engine import RunConfig, parse_config
    from contrastive.nn.encoders import starting_weights

    class Reached(Exception):
        pass

    def stop(net):
        raise Reached

    mod = rx.load_recipe(recipe)
    config_class = next(v for v in vars(mod).values() if isinstance(v, type)
                        and v.__module__ == mod.__name__ and issubclass(v, RunConfig))
    cfg = parse_config(config_class, ["--data", "shapes:n=64,n_test=16"])
    if "vit" in cfg.encoder:  # one block is enough to see the name (ViT-L builds in seconds)
        cfg.encoder_kwargs = json.dumps({**cfg.encoder_options(), "depth": 1})
    with pytest.raises(Reached), starting_weights(cfg.encoder, stop):
        rx.build_alone(mod, cfg)
