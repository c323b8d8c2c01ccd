"""The surface every method shares (what the engine relies on), checked for each method."""

from __future__ import annotations

import pytest
import torch

from contrastive.methods import MoCo, MoCoV3, SimCLR, get_method, list_methods

SMALL = {
    "moco": dict(dim=8, queue_size=12, mlp_hidden=8),
    "mocov3": dict(dim=8, mlp_hidden=8),
    "simclr": dict(dim=8),
}


def _make(name, encoder, seed=0):
    torch.manual_seed(seed)
    return get_method(name, encoder=encoder, **SMALL[name])


def test_registry():
    assert list_methods() == ["barlowtwins", "byol", "clip", "dcl", "dclw", "deepinfomax", "densecl", "dino",
                              "distill", "ibot", "ijepa", "imageclassifier", "lrcbert", "mae", "moco", "mocov3", "msn", "nnclr", "siglip",
                              "simclr", "simcse", "simmim", "simsiam", "supcon", "swav", "textclassifier", "vicreg",
                              "vicregl"]
    assert isinstance(get_method("MoCo-V3", encoder="small_cnn", mlp_hidden=8), MoCoV3)
    assert type(get_method("dim", encoder="small_cnn", mi_units=8)).__name__ == "DeepInfoMax"
    with pytest.raises(KeyError, match="simclr"):
        get_method("simclrr")


@pytest.mark.parametrize("name", ["moco", "mocov3", "simclr"])
def test_output_contract(name, tiny, views):
    method = _make(name, tiny())
    out = method(method.make_batch(views(4), momentum=0.5))
    assert set(out) == {"loss", "pos_acc", "pos_sim", "neg_sim", "embeddings"}
    assert out["loss"].dim() == 0 and out["loss"].requires_grad
    assert out["loss"].dtype == torch.float32
    for key in ("pos_acc", "pos_sim", "neg_sim"):
        assert (
            out[key].dim() == 0 and not out[key].requires_grad and out[key].dtype == torch.float32
        )
    assert 0 <= float(out["pos_acc"]) <= 100
    emb = out["embeddings"]
    assert emb.shape == (4, 8) and not emb.requires_grad
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(4))
    assert method.encoder.num_features == 8 and method.encoder(views(4)[0]).shape == (4, 8)


@pytest.mark.parametrize("name", ["moco", "mocov3", "simclr"])
def test_state_dict_round_trip(name, tiny, views):
    a = _make(name, tiny(), seed=0)
    a(a.make_batch(views(4)))  # one step: moves the EMA, fills the queue
    b = _make(name, tiny(), seed=1)
    b.load_state_dict(a.state_dict())
    a.eval(), b.eval()
    x = views(4, seed=5)
    torch.testing.assert_close(a(a.make_batch(x))["loss"], b(b.make_batch(x))["loss"])
    if name == "moco":
        assert torch.equal(a.queue.keys, b.queue.keys) and torch.equal(a.queue.ptr, b.queue.ptr)


@pytest.mark.parametrize("name", ["moco", "mocov3", "simclr"])
def test_bf16_autocast_gives_float32_loss(name, tiny, views):
    method = _make(name, tiny())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = method(method.make_batch(views(4)))
    assert out["loss"].dtype == torch.float32 and torch.isfinite(out["loss"])
    out["loss"].backward()


@pytest.mark.parametrize("cls", [MoCo, MoCoV3, SimCLR])
def test_presets_build(cls, tiny, tiny_patch):
    for name, preset in cls.presets.items():
        enc = tiny_patch() if preset.get("vit") else tiny()
        extra = {"queue_size": 16} if cls is MoCo else {}
        method = cls.from_preset(name, encoder=enc, **extra)
        assert method.encoder is enc


# a 2-block ViT at 16 px: small enough for the ViT presets' own encoder_kwargs to be replaced
_VIT = dict(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2,
            dynamic_img_size=True)
_HEAD = dict(out_dim=8, hidden_dim=8, bottleneck_dim=4)


@pytest.mark.parametrize("cls_name", ["DINO", "IBOT"])
def test_from_preset_with_an_encoder_module_drops_the_presets_encoder_kwargs(cls_name):
    """DINO / IBOT.from_preset("vit_small", encoder=<module>) build (before: the preset's
    encoder_kwargs reached resolve_encoder with the module, "keyword arguments ... need a
    name", unless the caller passed encoder_kwargs=None)."""
    import contrastive.methods as methods
    from contrastive.nn import create_encoder

    cls = getattr(methods, cls_name)
    assert cls.presets["vit_small"]["encoder_kwargs"]  # what there is to drop
    vit = create_encoder("timm:vit_tiny_patch16_224", **_VIT)
    assert cls.from_preset("vit_small", encoder=vit, **_HEAD).encoder is vit
    for empty in (None, {}):  # the old way still works
        assert cls.from_preset("vit_small", encoder=vit, encoder_kwargs=empty,
                               **_HEAD).encoder is vit
    # a name: the preset's encoder_kwargs apply (dynamic_img_size, for the local crops)
    named = cls.from_preset("vit_small", encoder="timm:vit_tiny_patch16_224", **_HEAD)
    assert named.encoder.dynamic_img_size
    with pytest.raises(ValueError) as exc:
        cls.from_preset("vit_small", encoder=vit, encoder_kwargs={"drop_path_rate": 0.1})
    assert str(exc.value) == (
        f"{cls_name}.from_preset('vit_small'): encoder_kwargs={{'drop_path_rate': 0.1}} build "
        "encoder by name, but encoder is a module (VisionTransformer): build the module with "
        "them, or pass its name")


def test_from_preset_drops_only_the_options_of_the_encoders_given_as_modules(tiny):
    """One rule for every method's encoders (encoder, text_encoder, teacher, student)."""
    from contrastive.methods import Method

    class _Two(Method):
        presets = {"p": dict(encoder="small_cnn", encoder_kwargs={"a": 1}, text_encoder="bert",
                             text_kwargs={"b": 2})}

        def __init__(self, **kwargs):
            super().__init__()
            self.kwargs = kwargs

    enc = tiny()
    assert _Two.from_preset("p", text_encoder=enc).kwargs == dict(
        encoder="small_cnn", encoder_kwargs={"a": 1}, text_encoder=enc)
    assert _Two.from_preset("p", encoder=enc).kwargs == dict(
        encoder=enc, text_encoder="bert", text_kwargs={"b": 2})
    assert _Two.from_preset("p").kwargs == _Two.presets["p"]
    with pytest.raises(ValueError, match="text_kwargs=.* build text_encoder by name"):
        _Two.from_preset("p", text_encoder=enc, text_kwargs={"b": 3})


def test_views_are_checked(tiny, views):
    method = _make("simclr", tiny())
    with pytest.raises(ValueError, match="at least 2 tensors"):
        method({"views": views(4)[:1]})
    with pytest.raises(ValueError, match="same N"):
        method({"views": [views(4)[0], views(3)[0]]})
    moco = _make("moco", tiny())
    with pytest.raises(ValueError, match="2 tensors"):
        moco(moco.make_batch(views(4) * 2))
    with pytest.raises(ValueError, match="same shape"):
        moco(moco.make_batch([views(4)[0], views(4, size=8)[0]]))
    with pytest.raises(TypeError, match="mapping of named inputs"):
        method(views(4))  # the old positional list


def test_width_reads_the_encoder_contract(tiny):
    from torch import nn

    from contrastive.methods._common import width

    enc = tiny()
    assert width(enc) == enc.num_features
    with pytest.raises(TypeError, match="int attribute `num_features`"):
        width(nn.Linear(2, 3))


@pytest.mark.parametrize("name", ["moco", "mocov3", "simclr", "byol", "simsiam", "swav",
                                  "barlowtwins", "vicreg", "supcon", "nnclr"])
def test_sync_bn_is_the_engines_switch(name):
    """The ten methods that once took ``sync_bn`` refuse it with a message naming the engine's
    ``--sync-bn`` (the one switch), through the constructor and ``get_method`` alike."""
    with pytest.raises(TypeError, match=r"sync_bn is not a method argument.*--sync-bn"):
        get_method(name, encoder="small_cnn", sync_bn=True)


VIT16 = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2)


@pytest.mark.parametrize("name, kwargs, path", [
    ("dino", dict(encoder="small_cnn", out_dim=8, hidden_dim=8, bottleneck_dim=4),
     "teacher.module.0"),
    ("ibot", dict(encoder="timm:vit_tiny_patch16_224", out_dim=8, hidden_dim=8, bottleneck_dim=4,
                  encoder_kwargs=VIT16), "teacher.module.encoder"),
    ("msn", dict(encoder="timm:vit_tiny_patch16_224", hidden_dim=8, out_dim=8, num_prototypes=4,
                 encoder_kwargs=VIT16), "teacher.module.0"),
    ("ijepa", dict(encoder="timm:vit_tiny_patch16_224", predictor_dim=8, predictor_depth=1,
                   min_keep=4, encoder_kwargs=dict(VIT16, patch_size=2, class_token=False,
                                                   global_pool="avg", fc_norm=False)),
     "target.module"),
    ("moco", dict(encoder="small_cnn", **SMALL["moco"]), "encoder"),
])
def test_the_evaluated_backbone_is_the_one_the_paper_evaluates(name, kwargs, path):
    """encoder.pt, the kNN monitor and the online probe read ``evaluated_encoder``: the
    momentum copy of the backbone for DINO, iBOT (teacher), MSN and I-JEPA (target), the trained
    encoder elsewhere; the same architecture as the trained one, a separate module."""
    from contrastive.engine.kits.image import feature_fn
    from contrastive.methods.base import evaluated_encoder

    method = get_method(name, **kwargs)
    backbone = evaluated_encoder(method)
    assert backbone is method.get_submodule(path)
    assert (backbone is method.encoder) == (path == "encoder")
    assert set(backbone.state_dict()) == set(method.encoder.state_dict())
    assert feature_fn(method, "backbone") is backbone


def test_an_evaluated_path_that_names_no_submodule_is_one_clear_error():
    from contrastive.methods.base import evaluated_encoder

    method = _make("simclr", "small_cnn")
    method.evaluated = "teacher.module.0"
    with pytest.raises(TypeError, match=r"SimCLR.evaluated names 'teacher.module.0'"):
        evaluated_encoder(method)


def test_batch_accuracy_is_the_percent_of_rows_whose_top_logit_is_the_label():
    from contrastive.methods._common import batch_accuracy

    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [5.0, 4.0, 6.0], [1.0, 9.0, 2.0]],
                          requires_grad=True)
    acc = batch_accuracy(logits, torch.tensor([0, 1, 1, 0]))  # rows 0 and 1 right
    assert acc.item() == 50.0 and acc.dim() == 0 and not acc.requires_grad
