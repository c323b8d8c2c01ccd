"""FSDP2 (``--fsdp``): the method's parameters, gradients and optimiser state sharded across the
processes with torch's ``fully_shard`` (Zhao et al., "PyTorch FSDP", VLDB 2023; the per-parameter
sharding of ``torch.distributed.fsdp``), applied by the engine itself.

accelerate's FSDP plugin is not used: accelerate 1.15 turns it on for GPU processes only (on CPU
processes it silently runs DDP), so it could not be tested here. The engine shards instead, on
a device mesh of every process (gloo CPU processes included):

- each transformer block (a ViT's ``blocks``: timm's VisionTransformer, the masked ViT of MAE
  and iBOT, MAE's decoder, the momentum / EMA copies of them; a Hugging Face encoder's
  ``layer``: the BERT text tower of CLIP and SigLIP) is one unit, all-gathered for its forward
  and freed after it;
- each other part with parameters of a module holding such blocks (the patch embedding, the
  norms, MAE's decoder's projections) is a unit, and so is the module itself (the ViT: its
  tokens and position embedding, gathered for its forward and for timm's ``_pos_embed``, which
  the masked ViT of MAE, iBOT and SimMIM calls with the parts, without the ViT's forward); the
  encoder can then also run alone (evaluation);
- each part of the method holding parameters (the heads, the text tower's embeddings, the
  projections, the momentum / EMA copy) is a unit, and the method itself the root: the root
  then holds (almost) no parameter, so a momentum update in the method's forward, where the
  root's parameters are gathered, meets sharded parameters on both sides;
- a 0-dim parameter (CLIP's logit scale, SigLIP's t' and b) cannot be sharded on dim 0
  (``fully_shard`` asserts): it stays whole on every process, outside every unit (FSDP's
  ``ignored_params``), and a hook averages its gradient across the processes as soon as it is
  accumulated (:func:`replicate_scalars`), so every process takes the same step with it.

Each parameter becomes a DTensor sharded on dim 0 (``Shard(0)``): the momentum / EMA copies are
sharded like their source, so the teacher's ``lerp`` runs on the local shards; the gradient
norm of a clip is the sum of squares across the shards (torch's ``clip_grad_norm_`` on DTensor
gradients); the optimiser's state is sharded with its parameter. Checkpoints gather the full
state (:func:`full_state`) into the engine's usual files and shard it again on load
(:func:`shard_like`): a checkpoint of a run with ``--fsdp`` loads into one without.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["ShardingError", "check_fsdp", "shard_method", "is_sharded", "full_state", "shard_like",
           "shard_optimizer_state", "full_params", "sharded_fused", "replicate_scalars",
           "unsharded_type"]

logger = logging.getLogger(__name__)

#: the attributes that name a transformer's block sequence: ``blocks`` (timm's ViT, the masked
#: ViT, MAE's decoder), ``layer`` (a Hugging Face encoder: BERT's ``encoder.layer``)
BLOCKS = ("blocks", "layer")
#: timm's ViT method that adds the prefix tokens and the position embedding: the masked ViT
#: (MAE, iBOT, SimMIM) calls it, and the ViT's parts, without the ViT's forward
POS_EMBED = "_pos_embed"


class ShardingError(ValueError):
    """``--fsdp`` asked where it cannot run."""


def _dtensor() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor


def check_fsdp(world: int, *, cached: bool, compile: bool) -> None:
    """Refuse ``--fsdp`` where it cannot shard, with one line naming the fix."""
    if world < 2:
        raise ShardingError("--fsdp shards across processes and this run has one: launch "
                            "several (accelerate launch --multi_gpu --num_processes N) or leave "
                            "--fsdp out")
    if cached:
        raise ShardingError("--fsdp does not run with gradient caching (--grad-cache-chunk, or "
                            "--grad-accum-steps on a method that caches): leave one of them out")
    if compile:
        raise ShardingError("--fsdp with --compile is not supported yet: leave one of them out")


def sharded_fused(optimizer: str, fused: bool | None) -> bool | None:
    """``--fused-optimizer`` under ``--fsdp``: torch's fused SGD kernel has no DTensor rule, so
    an unset one is the foreach kernel for SGD (fused AdamW has one); LARS is refused (its
    trust ratio's norms on shards are untested)."""
    if optimizer == "lars":
        raise ShardingError("--fsdp with --optimizer lars is not supported: use sgd or adamw, or "
                            "leave --fsdp out")
    if optimizer != "sgd":
        return fused
    if fused:
        raise ShardingError("--fsdp: torch's fused SGD kernel does not run on sharded "
                            "parameters; pass --fused-optimizer false (or leave it unset)")
    return False


def _block_owners(method: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """The modules that hold a sequence of transformer blocks, with their names and the
    attribute (one of :data:`BLOCKS`) that holds the sequence."""
    owners = []
    for name, module in method.named_modules():
        for attr in BLOCKS:
            blocks = module._modules.get(attr)
            if isinstance(blocks, nn.Sequential | nn.ModuleList) and len(blocks) > 0:
                owners.append((name, module, attr))
    return owners


def _shardable(module: nn.Module) -> bool:
    """Whether ``module`` holds a parameter FSDP can shard (one with a dim 0, not a scalar)."""
    return any(p.ndim > 0 for p in module.parameters())


def _top_parts(module: nn.Module) -> list[nn.Module]:
    """The method's parts below the root that hold parameters and are not yet units (the heads,
    the momentum copies; inside a ModuleList, a ModuleDict or a MomentumEncoder, whose parts a
    method may call without it, their members): each is a unit, so the root holds (almost)
    nothing and a momentum update in the method's forward, where the root's parameters are
    gathered, meets sharded parameters on both sides. A part holding only 0-dim parameters
    (SigLIP's loss with its t' and b) is not one (:func:`replicate_scalars`)."""
    from torch.distributed.fsdp import FSDPModule

    from contrastive.nn.momentum import MomentumEncoder

    parts = []
    for child in module.children():
        # a wrapper whose parts the method may call one by one (DINO's teacher.module["head"])
        if isinstance(child, nn.ModuleList | nn.ModuleDict | MomentumEncoder):
            parts += _top_parts(child)
        elif not isinstance(child, FSDPModule) and _shardable(child):
            parts.append(child)
    return parts


def _average_gradient(param: torch.Tensor) -> None:
    """``param``'s accumulated gradient replaced by its mean over the processes (a collective:
    every process's backward reaches it, at the same point of the same graph)."""
    import torch.distributed as dist

    assert param.grad is not None  # a post-accumulate hook runs once the gradient is there
    dist.all_reduce(param.grad)
    param.grad.div_(dist.get_world_size())


def replicate_scalars(method: nn.Module) -> dict[str, nn.Parameter]:
    """The 0-dim parameters of ``method`` (CLIP's logit scale, SigLIP's t' and b), by name,
    each trainable one given a hook that averages its gradient across the processes once it
    is accumulated (what DDP does for every parameter): ``fully_shard`` cannot shard them, so
    they stay whole and alike on every process, outside FSDP (its ``ignored_params``). With
    accumulation the hook runs each micro-batch on the sum so far, which stays the mean: the
    earlier micro-batches' part is already the same on every process."""
    scalars = {name: p for name, p in method.named_parameters() if p.ndim == 0}
    for p in scalars.values():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(_average_gradient)
    return scalars


def shard_method(method: nn.Module, device: torch.device, world: int) -> list[str]:
    """``fully_shard`` every transformer block of ``method``, then each module holding blocks,
    then ``method`` itself (see the module docstring), in place, on a 1-D mesh of ``world``
    processes of ``device``'s type; its 0-dim parameters are kept whole
    (:func:`replicate_scalars`). Returns the names of the block sequences sharded.

    Raises:
        ShardingError: ``method`` holds no transformer blocks (a ResNet encoder, say).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    owners = _block_owners(method)
    if not any(attr == BLOCKS[0] for _, _, attr in owners):  # a text tower alone: untested
        raise ShardingError(f"--fsdp: {type(method).__name__} has no transformer blocks to shard "
                            "(a ViT's blocks; a text tower's layers are sharded beside them, not "
                            "alone); use a ViT encoder or leave --fsdp out")
    mesh = init_device_mesh(device.type, (world,))
    scalars = replicate_scalars(method)
    ignored = set(scalars.values())

    def shard(unit: nn.Module) -> None:
        fully_shard(unit, mesh=mesh, ignored_params=ignored)

    for _, owner, attr in owners:
        for block in owner._modules[attr]:  # type: ignore[union-attr]
            shard(block)
    for _, owner, _ in owners:  # its other parts: the masked ViT calls them without owner.forward
        for unit in _top_parts(owner):
            shard(unit)
    for _, owner, _ in owners:  # its own tokens and position embedding, used in _pos_embed
        shard(owner)
        if callable(getattr(owner, POS_EMBED, None)):
            register_fsdp_forward_method(owner, POS_EMBED)
    for unit in _top_parts(method):
        shard(unit)
    shard(method)
    # the method is the root even where an evaluation runs the encoder unit first (kNN at the
    # start): FSDP otherwise takes the first unit to run forward for its root
    method._get_fsdp_state()._lazy_init()  # type: ignore[operator]
    names = [f"{name}.{attr}" if name else attr for name, _, attr in owners]
    total = sum(p.numel() for p in method.parameters())
    dtensor = _dtensor()
    local = sum((p.to_local() if isinstance(p, dtensor) else p).numel()
                for p in method.parameters())
    whole = f"; kept whole on every process: {', '.join(scalars)}" if scalars else ""
    logger.info("FSDP: %d processes, %s; %d of %d parameter values on this process%s", world,
                ", ".join(names), local, total, whole)
    return names


def is_sharded(module: nn.Module) -> bool:
    """Whether any parameter of ``module`` is a DTensor (``--fsdp``)."""
    dtensor = _dtensor()
    return any(isinstance(p, dtensor) for p in module.parameters())


def full_state(state: Any) -> Any:
    """``state`` (a state dict, an optimiser's, nested dicts and lists) with every DTensor
    replaced by the full tensor on the CPU: a collective, every process must call it. Other
    values are returned as they are (nothing is copied without ``--fsdp``)."""
    dtensor = _dtensor()
    if isinstance(state, dtensor):
        return state.full_tensor().cpu()
    if isinstance(state, dict):
        return {k: full_state(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(full_state(v) for v in state)
    return state


def _shard_as(full: torch.Tensor, like: Any) -> torch.Tensor:
    """``full`` sharded as the DTensor ``like`` (this process's shard of it, no communication:
    every process read the same file)."""
    from torch.distributed.tensor import distribute_tensor

    full = full.to(device=like.device, dtype=like.dtype)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


def shard_like(model_state: dict[str, Any], live: nn.Module) -> dict[str, Any]:
    """A full model state dict (:func:`full_state`, read from a checkpoint) sharded as
    ``live``'s parameters are, ready for ``live.load_state_dict``."""
    dtensor = _dtensor()
    current = live.state_dict()
    return {k: _shard_as(v, current[k]) if isinstance(current.get(k), dtensor) else v
            for k, v in model_state.items()}


def shard_optimizer_state(opt_state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """A full optimiser state dict (:func:`full_state`) whose per-parameter tensors of the
    parameter's shape are sharded as that parameter is (a DTensor), for
    ``optimizer.load_state_dict``; scalars (``step``) are left as they are."""
    dtensor = _dtensor()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in opt_state.get("state", {}).items():
        param = params[int(index)] if 0 <= int(index) < len(params) else None
        if isinstance(param, dtensor) and isinstance(entry, dict):
            entry = {k: _shard_as(v, param) if torch.is_tensor(v) and v.shape == param.shape
                     else v for k, v in entry.items()}
        state[index] = entry
    return {**opt_state, "state": state}


@contextlib.contextmanager
def full_params(module: nn.Module) -> Iterator[None]:
    """Within the block, ``state_dict()`` of ``module`` and of any part of it holds the full
    parameters (plain tensors), where FSDP's own state-dict hook would give this process's
    shards: for a main process that writes the artefacts (``encoder.pt``, ``clip.pt``). A
    collective on entry (every parameter gathered): every process enters. Nothing happens
    without ``--fsdp``."""
    if not is_sharded(module):
        yield
        return
    dtensor = _dtensor()
    with torch.no_grad():
        full = {id(p): p.full_tensor() for p in module.parameters() if isinstance(p, dtensor)}

    def gathered(part: nn.Module, state: dict[str, Any], prefix: str, _: Any) -> None:
        for name, param in part._parameters.items():
            if param is not None and id(param) in full and prefix + name in state:
                state[prefix + name] = full[id(param)]

    handles = [part.register_state_dict_post_hook(gathered) for part in module.modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def unsharded_type(module: nn.Module) -> type:
    """``module``'s own class: the one ``fully_shard`` subclassed (``FSDPCLIP`` -> ``CLIP``),
    which artefacts record (evaluation rebuilds the model by its name)."""
    from torch.distributed.fsdp import FSDPModule

    return next(cls for cls in type(module).__mro__ if not issubclass(cls, FSDPModule))
