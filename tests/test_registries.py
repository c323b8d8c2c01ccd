"""One policy for the five registries (losses, encoders, augmentation pipelines, data sets,
methods), all built on contrastive.registry.Registry: a taken name raises unless override=True,
override replaces, unknown names suggest the closest."""

from __future__ import annotations

import pytest
from torch import nn

from contrastive.registry import Registry


def _losses():
    from contrastive.losses import get_loss, register_loss, registry

    return registry, register_loss, lambda n: type(get_loss(n)), "infonse"


def _encoders():
    from contrastive.nn import create_encoder, encoders, register_encoder

    return encoders, register_encoder, lambda n: type(create_encoder(n)), "small_cn"


def _pipelines():
    from contrastive.augment import get_pipeline, register_pipeline, registry

    return registry, register_pipeline, lambda n: get_pipeline(n).name, "mocov22"


def _datasets():
    from contrastive.data import spec

    return (spec, spec.register_dataset, lambda n: spec._REGISTRY.get(n).factory, "shapez")


def _methods():
    from contrastive.methods import get_method, register_method, registry

    return registry, register_method, lambda n: type(get_method(n)), "simclrr"


def _factories(kind):
    """Two distinct objects to register, each recognisable through the registry's getter."""
    from contrastive.augment import Pipeline, ViewConfig

    def make(tag):
        if kind == "pipelines":
            return lambda image_size=224: Pipeline([ViewConfig(size=image_size)], name=tag)
        if kind == "datasets":
            return lambda root, split, transform, strict: tag

        class Thing(nn.Module):
            num_features = 1

            def forward(self, x):
                return x

        Thing.__name__ = Thing.__qualname__ = tag
        return Thing

    return make("First"), make("Second")


def _identify(kind, got):
    if kind == "pipelines":
        return got
    if kind == "datasets":
        return got(None, "train", None, False)
    return got.__name__


@pytest.mark.parametrize("kind", ["losses", "encoders", "pipelines", "datasets", "methods"])
def test_reregistering_raises_unless_override(kind, monkeypatch):
    module, register, get, typo = {"losses": _losses, "encoders": _encoders,
                                   "pipelines": _pipelines, "datasets": _datasets,
                                   "methods": _methods}[kind]()
    assert isinstance(module._REGISTRY, Registry)  # one shared helper
    monkeypatch.setattr(module, "_REGISTRY", module._REGISTRY.copy())
    first, second = _factories(kind)
    register("zz_test_name")(first)
    assert _identify(kind, get("zz_test_name")) == "First"
    with pytest.raises(ValueError, match="zz_test_name.*already registered.*override=True"):
        register("zz_test_name")(second)
    with pytest.raises(ValueError, match="already registered"):
        register("zz_test_name")(first)  # the same object too: no silent re-registration
    assert _identify(kind, get("zz_test_name")) == "First"  # unchanged by the failed attempts
    register("zz_test_name", override=True)(second)
    assert _identify(kind, get("zz_test_name")) == "Second"
    with pytest.raises(KeyError) as info:  # unknown: did-you-mean
        get(typo)
    assert typo[:-1] in str(info.value) or typo[:-2] in str(info.value)


def test_registry_aliases_override_and_remove():
    r: Registry[int] = Registry("thing", normalize=str.lower)
    r.add("One", 1, "uno")
    assert r.get("ONE") == r.get("Uno") == 1 and r.names() == ["one"] and "uno" in r
    with pytest.raises(ValueError, match="'uno' is already registered"):
        r.add("two", 2, "uno")
    assert "two" not in r  # nothing registered by the failed call
    r.add("two", 2, "uno", override=True)  # the alias moves to "two"
    assert r.get("uno") == 2 and r.get("one") == 1
    with pytest.raises(KeyError, match="Did you mean 'two'"):
        r.get("twoo")
    r.remove("two")
    assert "uno" not in r and r.names() == ["one"] and len(r) == 1
    with pytest.raises(ValueError, match="repeated"):
        r.add("x", 0, "X")
    with pytest.raises(ValueError, match="non-empty"):
        r.add("  ", 0)
