"""Encoder registry: backbones by name, classifier removed, pooled features out.

Names:

- ``"timm:<model>"``: any ``timm.list_models()`` architecture, built with ``num_classes=0``
  (timm's own pooled, pre-logits output); extra keyword arguments go to
  ``timm.create_model`` (e.g. ``img_size=32`` for a ViT), save ``drop_path_uniform=True``:
  every block of a ViT drops its paths at ``drop_path_rate`` (DINOv2's
  ``student.drop_path_uniform``; timm grows the rate linearly from 0 over the blocks), see
  :func:`set_uniform_drop_path`.
- ``"torchvision:<model>"``: any torchvision classification model; its last ``nn.Linear``
  (the classifier) is replaced by ``nn.Identity``; keyword arguments go to
  ``torchvision.models.get_model``.
- registered names: ``"cifar_resnet18"``, ``"cifar_resnet50"`` (3x3 stem, no max-pool),
  ``"small_cnn"`` (~0.4M parameters), ``"dcgan32"``, ``"dcgan64"``, ``"alexnet64"`` (Deep
  InfoMax's encoders, 64-d output, :mod:`contrastive.nn.dim_encoders`), and your own via
  :func:`register_encoder`.
- text (the ``text`` extra): ``"hf:<folder>"``, a local Hugging Face checkpoint folder with its
  weights (offline, no remote code, safetensors or ``weights_only`` pickles), and ``"bert"``,
  a BERT with random weights from sizes (``num_layers``, ``hidden_size``, ``num_heads``, ...)
  or from ``config=<folder>``; they take token ids, see :mod:`contrastive.nn.text_encoders`.

Every encoder has ``num_features`` and maps (N, 3, H, W) -> (N, num_features). State-dict keys
are the library's own (timm / torchvision) minus the classifier, so exported weights load into
a fresh timm / torchvision model with only the classifier missing.

Intermediate features (for distillation): :func:`stage_features(encoder, x)` returns the list
of intermediate feature maps, from ``encoder.forward_stages`` (our backbones, or your own),
torchvision ResNets' ``layer1..layer4``, timm's ``forward_intermediates`` (for timm ResNets:
the stem then the 4 stages; for ViTs: every block's tokens as (N, C, h, w) maps), or the
children of a torchvision ``features`` Sequential (VGG, MobileNet, EfficientNet, ConvNeXt).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import fnmatch
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from torch import Tensor, nn

from contrastive.registry import Registry, RegistryKeyError

__all__ = [
    "EncoderArgumentError",
    "UnknownEncoderError",
    "create_encoder",
    "starting_weights",
    "list_encoders",
    "register_encoder",
    "resolve_encoder",
    "set_uniform_drop_path",
    "strip_drop_path",
    "split_classifier",
    "stage_features",
]

class UnknownEncoderError(RegistryKeyError):
    """An encoder name that no registry knows; the message lists the closest names."""


class EncoderArgumentError(TypeError):
    """A keyword argument the named encoder does not take (a ViT's ``dynamic_img_size`` given to
    a ResNet: a ViT recipe's ``--encoder-kwargs`` with another ``--encoder``); the message
    names the encoder, the argument and the fix in one line."""


# the policy shared by the package's registries is in contrastive.registry
_REGISTRY: Registry[Callable[..., nn.Module]] = Registry("encoder", error=UnknownEncoderError)


def register_encoder(name: str, *, override: bool = False) -> Callable:
    """Decorator registering an encoder factory (a function or class) under ``name``.

    The factory is called as ``factory(**kwargs)`` (plus ``pretrained=True`` when asked) and
    must return an ``nn.Module`` with an int attribute ``num_features`` whose forward maps
    (N, 3, H, W) to (N, num_features). Give it ``forward_stages(x) -> list[Tensor]`` to make
    :func:`stage_features` work for it.

    Example::

        @register_encoder("tiny")
        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3)
                self.num_features = 8
            def forward(self, x):
                return self.conv(x).mean((2, 3))
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(
            f"register_encoder: name must be a non-empty str without ':', got {name!r}"
        )
    # a taken name raises ValueError unless override=True (contrastive.registry's policy)
    return _REGISTRY.register(name, override=override)


def _timm_names() -> list[str]:
    import timm

    return [f"timm:{n}" for n in timm.list_models()]


def _torchvision_names() -> list[str]:
    import torchvision.models as tvm

    return [f"torchvision:{n}" for n in tvm.list_models(module=tvm)]


def list_encoders(pattern: str | None = None, external: bool = True) -> list[str]:
    """Sorted encoder names, optionally filtered by a shell pattern (``"timm:resnet*"``).

    ``external=False`` lists only the registered names (no timm / torchvision import).
    """
    names = _REGISTRY.names()
    if external:
        names += _torchvision_names() + _timm_names()
    if pattern is not None:
        names = fnmatch.filter(names, pattern)
    return sorted(names)


def _unknown(name: str, candidates: list[str], first: tuple[str, ...] = ()) -> UnknownEncoderError:
    close = list(first) + difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
    close = list(dict.fromkeys(close))
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    registered = ", ".join(_REGISTRY.names())
    return UnknownEncoderError(
        f"unknown encoder {name!r}.{hint} Registered: {registered}; also 'timm:<model>', "
        "'torchvision:<model>' (see list_encoders('timm:*')) and 'hf:<local folder>'."
    )


def _create_timm(model: str, pretrained: bool, **kwargs: Any) -> nn.Module:
    import timm

    if not timm.is_model(model):
        raise _unknown(f"timm:{model}", _timm_names())
    kwargs.setdefault("num_classes", 0)
    uniform = bool(kwargs.pop("drop_path_uniform", False))
    net = timm.create_model(model, pretrained=pretrained, **kwargs)
    if uniform:
        set_uniform_drop_path(net, float(kwargs.get("drop_path_rate") or 0.0),
                              what=f"timm:{model}")
    return net


def set_uniform_drop_path(vit: nn.Module, rate: float, *, what: str = "the encoder") -> None:
    """Give every block of a timm ViT (``vit.blocks``, each with ``drop_path1`` /
    ``drop_path2``) drop path at ``rate``, in place of timm's linear growth from 0 in the first
    block to ``rate`` in the last (``calculate_drop_path_rates``): DINOv2's
    ``drop_path_uniform`` (``dinov2/models/vision_transformer.py``: ``DinoVisionTransformer``,
    ``dpr = [drop_path_rate] * depth``; true in ``ssl_default_config.yaml``). timm's
    ``DropPath`` keeps a sample with probability 1 - rate and scales it by 1 / (1 - rate);
    DINOv2's blocks do that below rate 0.1 and above it run the residual on a random
    ``int(B (1 - rate))`` samples scaled by B / their number (``dinov2/layers/block.py``:
    ``drop_add_residual_stochastic_depth``): the same expectation, a fixed count."""
    from timm.layers import DropPath

    found = getattr(vit, "blocks", None)
    blocks = list(found.children()) if isinstance(found, nn.Module) else []
    if not blocks or any(not (hasattr(b, "drop_path1") and hasattr(b, "drop_path2"))
                         for b in blocks):
        raise EncoderArgumentError(
            f"encoder {what!r}: drop_path_uniform needs a timm ViT whose blocks have drop_path1 "
            "and drop_path2; leave drop_path_uniform out of the encoder kwargs")
    if not 0.0 <= rate < 1.0:
        raise EncoderArgumentError(f"encoder {what!r}: drop_path_rate must be in [0, 1), got "
                                   f"{rate}")
    for block in blocks:
        block.drop_path1 = DropPath(rate) if rate > 0 else nn.Identity()
        block.drop_path2 = DropPath(rate) if rate > 0 else nn.Identity()


def strip_drop_path(module: nn.Module) -> int:
    """Replace every drop-path (stochastic depth) module inside ``module`` by ``nn.Identity``, in
    place; returns how many. Drop path holds no state, so the state dict keeps its keys. For
    a self-distillation teacher copied from its student: DINO's, iBOT's and DINOv2's teachers
    are built without it (``main_dino.py`` / ``main_ibot.py``: ``teacher =
    vits.__dict__[args.arch](patch_size=...)``, the student with ``drop_path_rate``;
    ``dinov2/models/__init__.py`` ``build_model``: only the student gets ``drop_path_rate`` and
    ``drop_path_uniform``), while their teachers run in train mode, where a copied ``DropPath``
    would drop the teacher's residual branches at random. timm's ``DropPath`` and
    torchvision's ``StochasticDepth``."""
    kinds: list[type] = []
    try:
        from timm.layers import DropPath
        kinds.append(DropPath)
    except ImportError:  # timm is optional
        pass
    try:
        from torchvision.ops import StochasticDepth
        kinds.append(StochasticDepth)
    except ImportError:
        pass
    found = [(parent, name) for parent in module.modules()
             for name, child in parent.named_children() if isinstance(child, tuple(kinds))]
    for parent, name in found:
        setattr(parent, name, nn.Identity())
    return len(found)


def _create_torchvision(model: str, pretrained: bool, **kwargs: Any) -> nn.Module:
    import torchvision.models as tvm

    if model not in tvm.list_models(module=tvm):
        raise _unknown(f"torchvision:{model}", _torchvision_names())
    net = tvm.get_model(model, weights="DEFAULT" if pretrained else None, **kwargs)
    net, fc = split_classifier(net)
    if fc is None:
        raise ValueError(
            f"torchvision:{model} has no nn.Linear classifier to remove; wrap it yourself and "
            "register it with register_encoder"
        )
    return net


def create_encoder(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build an encoder by name (see the module docstring), classifier removed.

    Args:
        name: ``"timm:<model>"``, ``"torchvision:<model>"``, ``"hf:<folder>"`` or a
            registered name.
        pretrained: load the library's pretrained weights (timm / torchvision download them);
            our own backbones have none.
        **kwargs: passed to the factory.

    Returns:
        an ``nn.Module`` with ``num_features``; forward (N, 3, H, W) -> (N, num_features).

    Raises:
        UnknownEncoderError: (a KeyError) listing close matches for an unknown name.
        EncoderArgumentError: (a TypeError) naming a keyword argument the encoder does not take.
    """
    if not isinstance(name, str):
        raise TypeError(f"create_encoder: name must be a str, got {type(name).__name__}")
    try:
        net = _create(name, pretrained, **kwargs)
    except TypeError as e:  # early and in one place: every method and recipe gets the line
        error = _argument_error(name, kwargs, e)
        if error is None:
            raise
        raise error from e
    net = _checked(net, name)
    start = _STARTING.get()
    if start is not None and start.name == name:
        start.load(net)
        start.loaded += 1
    return net


class _Start:
    def __init__(self, name: str, load: Callable[[nn.Module], None]) -> None:
        self.name, self.load, self.loaded = name, load, 0


_STARTING: ContextVar[_Start | None] = ContextVar("starting_weights", default=None)


@contextlib.contextmanager
def starting_weights(name: str, load: Callable[[nn.Module], None]) -> Iterator[_Start]:
    """Inside the block, every :func:`create_encoder` of ``name`` calls ``load(encoder)`` on
    the new encoder before returning it: a method built there starts its backbone from those
    weights, and every copy it makes of it afterwards (a momentum encoder, a teacher) starts
    equal to it (``--init``). The yielded object's ``loaded`` counts the encoders loaded."""
    start = _Start(name, load)
    token = _STARTING.set(start)
    try:
        yield start
    finally:
        _STARTING.reset(token)


# Python's message for a keyword that a function or class does not take
_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")


def _argument_error(name: str, kwargs: dict[str, Any],
                    e: TypeError) -> EncoderArgumentError | None:
    """The one-line error for a keyword of ``kwargs`` that the encoder's factory refused; None
    for another TypeError (a bug keeps its traceback)."""
    found = _UNEXPECTED.search(str(e))
    if found is None or found.group(1) not in kwargs:
        return None
    return EncoderArgumentError(
        f"encoder {name!r} takes no keyword argument {found.group(1)!r} (encoder kwargs "
        f"{kwargs!r}): leave it out; in a recipe, whose --encoder-kwargs default fits its own "
        f"--encoder, pass --encoder-kwargs '{{}}' or a JSON object of what {name!r} takes")


def _create(name: str, pretrained: bool, **kwargs: Any) -> nn.Module:
    """Call the factory ``name`` names (see :func:`create_encoder`)."""
    if name.startswith("timm:"):
        net = _create_timm(name[len("timm:") :], pretrained, **kwargs)
    elif name.startswith("torchvision:"):
        net = _create_torchvision(name[len("torchvision:") :], pretrained, **kwargs)
    elif name.startswith("hf:"):  # the folder is the pretrained model: its weights always load
        from contrastive.nn.text_encoders import load_text_encoder

        net = load_text_encoder(name[len("hf:") :], **kwargs)
    elif name in _REGISTRY:
        net = _REGISTRY.get(name)(**({"pretrained": True} if pretrained else {}), **kwargs)
    else:
        same = tuple(n for n in _torchvision_names() + _timm_names() if n.endswith(":" + name))
        raise _unknown(name, _REGISTRY.names(), first=same)
    return net


def _checked(net: nn.Module, what: str) -> nn.Module:
    if not isinstance(net, nn.Module) or not isinstance(getattr(net, "num_features", None), int):
        raise TypeError(
            f"encoder {what!r} must be an nn.Module with an int attribute `num_features` "
            "(the width of its pooled output)"
        )
    return net


def resolve_encoder(encoder: str | nn.Module, **kwargs: Any) -> nn.Module:
    """A name -> :func:`create_encoder`; a module -> itself, checked for ``num_features``."""
    if isinstance(encoder, str):
        return create_encoder(encoder, **kwargs)
    if kwargs:
        raise ValueError(f"resolve_encoder: keyword arguments {sorted(kwargs)} need a name")
    return _checked(encoder, type(encoder).__name__)


def split_classifier(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """Split a classification model into (backbone with pooled output, classifier or None).

    timm models: ``get_classifier()`` is copied and ``reset_classifier(0)`` leaves the backbone
    returning pre-logits. Others: the last ``nn.Linear`` is taken out and replaced by
    ``nn.Identity`` (right when it is the model's last operation: ResNet ``fc``, ViT ``heads``).
    The backbone gets ``num_features`` (the classifier's input width).
    """
    get_classifier = getattr(model, "get_classifier", None)
    reset_classifier = getattr(model, "reset_classifier", None)
    if callable(get_classifier) and callable(reset_classifier):
        head = get_classifier()
        if not isinstance(head, nn.Linear):
            return model, None
        head = copy.deepcopy(head)
        reset_classifier(0)
        # setattr: an int attribute (nn.Module.__setattr__ is typed for tensors and modules)
        setattr(model, "num_features", head.in_features)  # noqa: B010
        return model, head
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        return model, None
    path, head = linears[-1]
    parent = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    setattr(parent, path.rpartition(".")[2], nn.Identity())
    setattr(model, "num_features", head.in_features)  # noqa: B010 (as above)
    return model, head


def stage_features(encoder: nn.Module, x: Tensor) -> list[Tensor]:
    """Intermediate feature maps of ``encoder`` on ``x`` (N, 3, H, W), shallow to deep.

    See the module docstring for what each family returns. Raises TypeError for a model
    without a known way; give it ``forward_stages(x) -> list[Tensor]``.
    """
    forward_stages = getattr(encoder, "forward_stages", None)
    if callable(forward_stages):
        return list(forward_stages(x))
    if all(hasattr(encoder, a) for a in ("conv1", "bn1", "relu", "maxpool", "layer4")):
        net: Any = encoder  # a torchvision / timm ResNet, duck-typed
        x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        out = []
        for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
            x = layer(x)
            out.append(x)
        return out
    forward_intermediates = getattr(encoder, "forward_intermediates", None)  # timm
    if callable(forward_intermediates):
        return list(forward_intermediates(x, intermediates_only=True))
    features = getattr(encoder, "features", None)
    if isinstance(features, nn.Sequential):
        out = []
        for block in features:
            x = block(x)
            out.append(x)
        return out
    raise TypeError(
        f"stage_features: no known way to get stages of {type(encoder).__name__}; "
        "give it a method forward_stages(x) -> list[Tensor]"
    )


# -- built-in backbones (torchvision is imported only when one is built) ---------------------


def _no_pretrained(name: str, pretrained: bool) -> None:
    if pretrained:
        raise ValueError(f"{name} has no pretrained weights; use pretrained=False")


@register_encoder("cifar_resnet18")
def cifar_resnet18(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """ResNet-18 with the CIFAR stem (3x3, stride 1, no max-pool); num_features 512."""
    from contrastive.nn.backbones import BasicBlock, CifarResNet

    _no_pretrained("cifar_resnet18", pretrained)
    return CifarResNet(BasicBlock, [2, 2, 2, 2], **kwargs)


@register_encoder("cifar_resnet50")
def cifar_resnet50(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """ResNet-50 with the CIFAR stem; num_features 2048."""
    from contrastive.nn.backbones import Bottleneck, CifarResNet

    _no_pretrained("cifar_resnet50", pretrained)
    return CifarResNet(Bottleneck, [3, 4, 6, 3], **kwargs)


@register_encoder("small_cnn")
def small_cnn(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """4-block CNN, 32-64-128-256 channels, ~0.39M parameters; num_features 256."""
    from contrastive.nn.small_cnn import SmallCNN

    _no_pretrained("small_cnn", pretrained)
    return SmallCNN(**kwargs)


@register_encoder("dcgan32")
def dcgan32(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Deep InfoMax's CIFAR encoder (convs 64-128-256, fc 1024, 64-d out); local stage 1."""
    from contrastive.nn.dim_encoders import DCGANEncoder

    _no_pretrained("dcgan32", pretrained)
    return DCGANEncoder(**{"widths": (64, 128, 256), "local_stage": 1, **kwargs})


@register_encoder("dcgan64")
def dcgan64(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """The 64-px variant (convs 64-128-256-512, fc 1024, 64-d out); local stage 2."""
    from contrastive.nn.dim_encoders import DCGANEncoder

    _no_pretrained("dcgan64", pretrained)
    return DCGANEncoder(**{"widths": (64, 128, 256, 512), "local_stage": 2, **kwargs})


@register_encoder("alexnet64")
def alexnet64(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Deep InfoMax's STL-10 encoder (5 convs, 2 fc 4096, 64-d out, 64 px); local stage 2."""
    from contrastive.nn.dim_encoders import AlexNetEncoder

    _no_pretrained("alexnet64", pretrained)
    return AlexNetEncoder(**kwargs)


@register_encoder("bert")
def bert(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """BERT with random weights (``contrastive.text.build_text_encoder``); input token ids."""
    from contrastive.nn.text_encoders import build_text_encoder

    if pretrained:
        raise ValueError("'bert' builds random weights; for a pretrained BERT use 'hf:<folder>'")
    return build_text_encoder(**kwargs)
