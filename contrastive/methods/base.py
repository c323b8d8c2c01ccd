"""The contract every method follows (see :mod:`contrastive.methods` for the prose).

:class:`Method` is an ``nn.Module`` with

- ``forward(batch) -> dict``: ``batch`` is a mapping of named inputs (``"views"``, ``"labels"``,
  ``"indices"``, one entry per schedule, ...); it returns ``loss`` and cheap detached metrics;
- ``needs``: the batch keys it reads besides its schedules; the engine provides exactly those
  (:data:`contrastive.engine.kits.base.BATCH_KEYS` and the data set's fields);
- :meth:`schedules`: name -> function ``(step, total_steps) -> float`` that the training loop
  evaluates once per optimiser step and passes as ``batch[name]`` (and logs);
- :meth:`param_groups`: optional :class:`ParamGroup` s (weight decay, fixed lr, frozen steps) the
  engine builds its optimiser from;
- :meth:`clip_parts`: optional parts whose gradient norms the engine clips apart
  (``--clip-grad-norm`` on each part, DINOv2), all parameters together by default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

#: how a ParamGroup's frozen_steps hold it still: its gradients dropped, or its lr set to 0
FROZEN_BY = ("grad", "lr")
#: what ``--clip-grad-norm`` clips apart (:func:`clip_parts_by`): all parameters together, each
#: part, each parameter
CLIP_MODES = ("all", "part", "parameter")

__all__ = ["Method", "ParamGroup", "Schedule", "read", "views_of", "encoder_of",
           "evaluated_encoder"]

Schedule = Callable[[int, int], float]
"""``f(step, total_steps) -> value``: step is the 0-based optimiser step of the run."""

@dataclass
class ParamGroup:
    """Parameters that the optimiser treats apart (a method's :meth:`Method.param_groups`).

    Args:
        name: shown in logs and errors.
        params: the parameters (only those with ``requires_grad`` are optimised).
        weight_decay: None = the run's ``--weight-decay``; e.g. 0.0 for no decay at all.
        lr: a fixed learning rate (not scaled, not scheduled; SimSiam's predictor); None = the
            run's schedule.
        frozen_steps: no update during the first N optimiser steps: SwAV's prototypes, DINO's
            last layer.
        frozen_by: how they are held still. ``"grad"``: their gradients are dropped before the
            clip and the step, so neither the weights nor the optimiser state move (SwAV's
            ``p.grad = None``, DINO's ``utils.cancel_gradients_last_layer``). ``"lr"``: their lr
            is 0 for those steps; the gradients stay (in the clipped norm), AdamW's moments and
            step count move and its decoupled decay ``lr * wd`` is 0, as DINOv2's
            ``last_layer_lr_schedule`` zeroed for ``freeze_last_layer_epochs``
            (``dinov2/train/train.py``: ``build_schedulers``, ``apply_optim_scheduler``).
        lr_scale: a multiplier on the run's scheduled lr (same warm-up and decay, scaled):
            Barlow Twins' biases and norm parameters, 0.0048 / 0.2 = 0.024 of the weights' lr
            in the official code. Only with the schedule, not with a fixed ``lr``.
    """

    name: str
    params: Sequence[nn.Parameter]
    weight_decay: float | None = None
    lr: float | None = None
    frozen_steps: int = 0
    lr_scale: float = 1.0
    frozen_by: str = "grad"

    def __post_init__(self) -> None:
        if self.frozen_by not in FROZEN_BY:
            raise ValueError(f"param group {self.name!r}: frozen_by must be one of {FROZEN_BY}, "
                             f"got {self.frozen_by!r}")
        if self.frozen_steps < 0 or (self.lr is not None and self.lr < 0) or (
                self.weight_decay is not None and self.weight_decay < 0) or \
                not self.lr_scale >= 0:
            raise ValueError(f"param group {self.name!r}: lr, weight_decay, frozen_steps and "
                             f"lr_scale must be >= 0, got {self.lr}, {self.weight_decay}, "
                             f"{self.frozen_steps}, {self.lr_scale}")
        if self.lr is not None and self.lr_scale != 1.0:
            raise ValueError(f"param group {self.name!r}: give a fixed lr ({self.lr}) or an "
                             f"lr_scale on the schedule ({self.lr_scale}), not both")


#: the methods' encoder arguments (a name or a module) -> their arguments for building one by name
#: (Method.from_preset drops a preset's when the caller gives a module)
_BUILD_OPTIONS = {"encoder": "encoder_kwargs", "text_encoder": "text_kwargs",
                  "teacher": "teacher_kwargs", "student": "student_kwargs"}


class Method(nn.Module):
    """Base class of the methods: the contract, plus the shared conveniences.

    Subclasses set ``needs`` (class or instance attribute), implement ``forward(batch)`` and,
    when they have any, :meth:`schedules` and :meth:`param_groups`.
    """

    needs: tuple[str, ...] = ("views",)
    uses_in_batch_negatives: bool = False  # a class or an instance attribute (Distiller)
    #: the loss couples the batch's samples through the gradient by other means than in-batch
    #: negatives (batch statistics of the embeddings: Barlow Twins, VICReg); with
    #: ``uses_in_batch_negatives`` it makes the engine refuse --grad-accum-steps
    couples_samples: bool = False
    #: why --grad-accum-steps would train another experiment (the engine refuses it with this
    #: reason), for a reason other than the two above; "" = accumulation is fine
    no_accumulation: str = ""
    #: the backbones the engine may run chunk by chunk (--grad-cache-chunk,
    #: :mod:`contrastive.engine.grad_cache`): submodule names the method calls only as
    #: ``backbone(tensors...)`` -> one row per input row; () = the loss reads more than their
    #: output (intermediate layers), no caching
    backbones: tuple[str, ...] = ("encoder",)
    #: the backbone a run exports (``encoder.pt``) and evaluates during training (the kNN
    #: monitor, the online probe), as a dotted submodule path (:func:`evaluated_encoder`): the
    #: trained ``encoder`` by default; the momentum copy where the paper evaluates that one
    #: (DINO's and iBOT's teacher, MSN's and I-JEPA's target encoder)
    evaluated: str = "encoder"
    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> Method:
        """Refuse the ``sync_bn`` keyword the methods once took: global BN is the engine's one
        switch (``--sync-bn``, which converts the whole model when several GPU processes train),
        so a method never converts its own layers."""
        if "sync_bn" in kwargs:
            raise TypeError(f"{cls.__name__}: sync_bn is not a method argument any more; "
                            "SyncBatchNorm is the engine's --sync-bn (RunConfig.sync_bn), or "
                            "contrastive.nn.convert_to_sync_bn(method) by hand")
        return super().__new__(cls)

    def schedules(self) -> dict[str, Schedule]:
        """Name -> ``f(step, total_steps)``; each value arrives as ``batch[name]``."""
        return {}

    def param_groups(self) -> list[ParamGroup]:
        """Groups the optimiser treats apart; parameters in none of them form the default group."""
        return []

    def clip_parts(self) -> dict[str, list[nn.Parameter]]:
        """Parts whose gradient norms are clipped apart, each to ``--clip-grad-norm`` (DINOv2
        clips its backbone and heads so); trainable parameters in no part form one more part.
        Empty by default: all parameters together. :func:`clip_parts_by` builds them for a
        method's ``clip_mode`` (DINO, iBOT)."""
        return {}

    def step_spans(self) -> dict[str, int]:
        """Settings counted in optimiser steps from the start (a teacher warm-up, a frozen
        layer): name -> steps. The trainer warns when one covers the whole run, as a recipe's
        epochs turned into steps do under a short ``--steps``; none by default."""
        return {}

    def after_optimizer_step(self) -> None:
        """Called by the training loop after every optimiser step (not after accumulation
        micro-batches), e.g. CLIP's clamp of its logit scale; nothing by default."""

    def schedule_values(self, step: int, total_steps: int) -> dict[str, float]:
        """Every schedule's value at optimiser step ``step`` of ``total_steps``."""
        return {name: float(fn(step, total_steps)) for name, fn in self.schedules().items()}

    def make_batch(self, views: Sequence[Tensor], *, step: int = 0, total_steps: int = 1,
                   **inputs: Any) -> dict[str, Any]:
        """A batch for calling the method by hand: ``views``, ``inputs`` and the schedules'
        values at ``step`` (what the training loop builds)."""
        return {"views": list(views), **self.schedule_values(step, total_steps), **inputs}

    def forward(self, batch: Mapping[str, Any]) -> dict[str, Tensor]:  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> Method:
        """Build with the keyword arguments of ``presets[name]`` (a paper's settings, whose one
        home the presets are: the recipes' fields default to them), ``overrides`` winning.

        A module given for an encoder (``encoder=my_vit``) drops the preset's keyword arguments
        for building that encoder by name (``encoder_kwargs``: DINO's ``vit_small``
        ``dynamic_img_size``), which a built module cannot take; the caller's own such
        arguments with a module are refused in one line."""
        if name not in cls.presets:
            raise KeyError(
                f"{cls.__name__}.from_preset: unknown preset {name!r}; known: {sorted(cls.presets)}"
            )
        kwargs = {**cls.presets[name], **overrides}
        for encoder, options in _BUILD_OPTIONS.items():
            if isinstance(overrides.get(encoder, ""), str):  # absent or a name: both apply
                continue
            if overrides.get(options):
                raise ValueError(
                    f"{cls.__name__}.from_preset({name!r}): {options}={overrides[options]!r} "
                    f"build {encoder} by name, but {encoder} is a module "
                    f"({type(overrides[encoder]).__name__}): build the module with them, or "
                    f"pass its name")
            if options not in overrides:
                kwargs.pop(options, None)
        return cls(**kwargs)


def read(batch: Mapping[str, Any], key: str, method: str) -> Any:
    """``batch[key]`` or a ``KeyError`` that names the method, the key and how to provide it."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{method}: forward takes a mapping of named inputs (batch['views'] = "
                        f"[x1, x2, ...]), got {type(batch).__name__}; see contrastive.methods")
    try:
        return batch[key]
    except KeyError:
        raise KeyError(
            f"{method}: the batch has no {key!r} (it has {sorted(batch)}); the training engine "
            f"provides a method's needs and schedules; by hand use method.make_batch(views, "
            f"step=..., total_steps=..., ...)") from None


def views_of(batch: Mapping[str, Any], method: str, n: int | None = None,
             min_n: int = 1) -> list[Tensor]:
    """``batch["views"]`` as a list of (N, C, H, W) tensors with the same N, checked.

    ``n``: exactly that many views; ``min_n``: at least that many. Sizes may differ.
    """
    views = read(batch, "views", method)
    if isinstance(views, Tensor) or not isinstance(views, Sequence):
        got = f"a tensor {tuple(views.shape)}" if isinstance(views, Tensor) else type(views).__name__
        raise ValueError(f"{method}: batch['views'] must be a list of tensors (N, C, H, W), got "
                         f"{got}")
    if (n is not None and len(views) != n) or len(views) < min_n:
        want = f"{n}" if n is not None else f"at least {min_n}"
        raise ValueError(f"{method}: batch['views'] must hold {want} tensors (N, C, H, W), got "
                         f"{len(views)}")
    if any(not isinstance(v, Tensor) or v.dim() != 4 for v in views) or \
            len({v.shape[0] for v in views}) != 1:
        shapes = [tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__ for v in views]
        raise ValueError(f"{method}: every view must be a (N, C, H, W) tensor with the same N, "
                         f"got {shapes}")
    return list(views)


def encoder_of(method: nn.Module) -> nn.Module:
    """The method's backbone (its ``encoder`` attribute, part of the contract): what the engine
    compiles, exports and monitors."""
    encoder = getattr(method, "encoder", None)
    if not isinstance(encoder, nn.Module):
        raise TypeError(f"{type(method).__name__} has no encoder module (attribute 'encoder')")
    return encoder


def evaluated_encoder(method: nn.Module) -> nn.Module:
    """The backbone a run exports and evaluates: the submodule at the method's
    :attr:`Method.evaluated` path (its ``encoder`` where it declares none). The engine still
    trains and compiles :func:`encoder_of`; a momentum copy follows it by EMA."""
    path = getattr(method, "evaluated", "encoder")
    if path == "encoder":
        return encoder_of(method)
    try:
        return method.get_submodule(path)
    except AttributeError:
        raise TypeError(f"{type(method).__name__}.evaluated names {path!r}, which is not a "
                        "submodule of it") from None


def check_clip_mode(method: str, clip_mode: str) -> None:
    """A one-line ValueError unless ``clip_mode`` is one of :data:`CLIP_MODES`."""
    if clip_mode not in CLIP_MODES:
        raise ValueError(f"{method}: clip_mode must be one of {CLIP_MODES}, got {clip_mode!r}")


def clip_parts_by(clip_mode: str,
                  parts: Mapping[str, Sequence[nn.Parameter]]) -> dict[str, list[nn.Parameter]]:
    """:meth:`Method.clip_parts` of a clip mode over a method's trainable ``parts``:

    - ``"all"``: none, all parameters clipped together (torch's ``clip_grad_norm_``, the
      engine's default);
    - ``"part"``: each of ``parts`` apart (DINOv2's ``do_train``: ``for v in
      model.student.values(): v.clip_grad_norm_(...)``);
    - ``"parameter"``: each trainable parameter of ``parts`` apart, named ``part[i]``: the
      gradient ``g`` of each times ``min(1, c / (|g| + 1e-6))``, as DINO's and iBOT's
      ``utils.clip_gradients`` (facebookresearch/dino, bytedance/ibot; called in their
      ``train_one_epoch`` before ``cancel_gradients_last_layer``). Each parameter's clip
      reads its own gradient only, so the order against a dropped (frozen) gradient does not
      matter.
    """
    if clip_mode == "all":
        return {}
    if clip_mode == "part":
        return {name: list(ps) for name, ps in parts.items()}
    if clip_mode == "parameter":
        return {f"{name}[{i}]": [p] for name, ps in parts.items()
                for i, p in enumerate(ps) if p.requires_grad}
    raise ValueError(f"clip_mode must be one of {CLIP_MODES}, got {clip_mode!r}")
