"""The loss registry: names, aliases, errors, user registration."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import contrastive
from contrastive.losses import (
    CosNCELoss,
    DCLLoss,
    InfoNCELoss,
    KDLoss,
    NTXentLoss,
    SupConLoss,
    UnknownLossError,
    get_loss,
    list_losses,
    loss_class,
    register_loss,
    registry,
)


@pytest.fixture
def clean_registry(monkeypatch):
    """Let a test register losses without leaking them into the other tests."""
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())


@pytest.mark.parametrize(
    "name,cls",
    [
        ("infonce", InfoNCELoss),
        ("ntxent", NTXentLoss),
        ("cosnce", CosNCELoss),
        ("supcon", SupConLoss),
        ("dcl", DCLLoss),
        ("kd", KDLoss),
        ("NT_Xent", NTXentLoss),  # alias, any case
        ("Info_NCE", InfoNCELoss),
    ],
)
def test_get_loss_builds_the_registered_class(name, cls):
    loss_fn = get_loss(name)
    assert type(loss_fn) is cls and isinstance(loss_fn, nn.Module)
    assert loss_class(name) is cls


def test_get_loss_forwards_keyword_arguments():
    loss_fn = get_loss("ntxent", temperature=0.5, reduction="sum")
    assert loss_fn.temperature == 0.5 and loss_fn.reduction == "sum"
    assert get_loss("infonce").temperature == 0.07  # MoCo v1 default
    assert get_loss("ntxent").temperature == 0.1  # SimCLR paper default
    assert get_loss("supcon").temperature == 0.1
    assert get_loss("kd").temperature == 1.0


def test_list_losses_is_sorted_primary_names_and_filters():
    names = list_losses()
    assert names == sorted(names)
    assert "nt_xent" not in names  # aliases are not listed
    assert list_losses("*nce") == ["cosnce", "infonce"]
    assert list_losses("nothing*") == []


def test_unknown_name_lists_known_names_and_closest_match():
    with pytest.raises(KeyError) as info:
        get_loss("infonse")
    err = info.value
    assert isinstance(err, UnknownLossError)
    message = str(err)
    assert "did you mean 'infonce'" in message
    for name in list_losses():
        assert name in message
    assert not message.startswith('"')  # plain text, not KeyError's repr


def test_unknown_name_without_close_match_still_lists_names():
    with pytest.raises(UnknownLossError, match="known losses: .*ntxent") as info:
        get_loss("zzzzzzzz")
    assert "did you mean" not in str(info.value)


def test_top_level_package_exposes_the_registry_lazily():
    assert contrastive.get_loss is get_loss
    assert contrastive.list_losses is list_losses
    assert contrastive.register_loss is register_loss


@pytest.mark.usefixtures("clean_registry")
def test_register_a_user_loss():
    @register_loss("test_l2", "test_squared")
    class L2(nn.Module):
        def __init__(self, scale: float = 1.0) -> None:
            super().__init__()
            self.scale = scale

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.scale * (a - b).pow(2).sum(dim=1).mean()

    assert "test_l2" in list_losses() and "test_squared" not in list_losses()
    loss_fn = get_loss("test_squared", scale=2.0)
    assert isinstance(loss_fn, L2) and loss_fn.scale == 2.0
    out = loss_fn(torch.ones(2, 3), torch.zeros(2, 3))
    assert out.item() == pytest.approx(6.0)


@pytest.mark.usefixtures("clean_registry")
def test_duplicate_names_raise_and_leave_the_registry_unchanged():
    @register_loss("test_dup")
    class First(nn.Module):
        pass

    class Second(nn.Module):
        pass

    with pytest.raises(ValueError, match="test_dup.*already registered"):
        register_loss("test_dup")(Second)
    with pytest.raises(ValueError, match="ntxent.*already registered"):
        register_loss("test_new", "NTXENT")(Second)  # alias taken by a built-in
    assert "test_new" not in list_losses()
    assert loss_class("test_dup") is First
    assert loss_class("ntxent") is NTXentLoss
    with pytest.raises(ValueError, match="repeated"):
        register_loss("test_x", "test_x")
    with pytest.raises(ValueError, match="non-empty string"):
        register_loss("")


@pytest.mark.usefixtures("clean_registry")
def test_reregistering_the_same_definition_needs_override():
    """Reloading a module (notebooks, importlib.reload) re-runs the decorator: the shared
    registry policy (contrastive.registry) makes that an error unless ``override=True``."""

    def make() -> type[nn.Module]:
        class Reloaded(nn.Module):
            pass

        return Reloaded

    first, second = make(), make()
    register_loss("test_reload")(first)
    with pytest.raises(ValueError, match="test_reload.*already registered.*override=True"):
        register_loss("test_reload")(second)
    assert loss_class("test_reload") is first
    register_loss("test_reload", override=True)(second)
    assert loss_class("test_reload") is second
