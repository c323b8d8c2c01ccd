"""Activation checkpointing (contrastive/nn/checkpointing.py, ``--grad-checkpointing``).

In float64 a checkpointed step recomputes each block with the same operations and the same
random state, so gradients, outputs and state (BatchNorm statistics, EMA copies, queues) equal
the plain step to rounding (``rtol=1e-9, atol=1e-12`` as the gradient-caching tests). Each test
also counts the block calls: a checkpointed block runs twice per step (forward, recomputation),
so a silently inactive checkpoint fails it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from contrastive.engine import run, train
from contrastive.methods import get_method
from contrastive.nn import create_encoder
from contrastive.nn.checkpointing import (
    CheckpointedSequential,
    GradCheckpointingError,
    enable_grad_checkpointing,
)
from tests.engine import test_grad_cache as gc
from tests.engine.test_init import _Cfg, _moco, _pipeline

VIT = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, drop_path_rate=0.3,
           proj_drop_rate=0.2)


def _count_calls(module: nn.Module) -> list[int]:
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1
    module.register_forward_pre_hook(hook)
    return calls


def _first_block(model: nn.Module) -> nn.Module:
    return next(m for m in model.modules() if isinstance(m, CheckpointedSequential))[0]


def _grads_and_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return gc.state(model)


class Blocks(nn.Module):
    """A tiny backbone whose stages are an ``nn.Sequential`` named ``blocks``, with BatchNorm
    and dropout: what checkpointing must replay (dropout) and not double-count (statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Dropout(0.3)),
            nn.Sequential(nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU()))
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.blocks(x))


def _family(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "hf-bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16))
        return model.double().train(), torch.randint(0, 50, (3, 10), generator=g)
    kwargs = VIT if "vit" in name else {}
    model = create_encoder(name, **kwargs).double().train()
    return model, torch.randn(4, 3, 16 if "vit" in name else 32, 16 if "vit" in name else 32,
                              generator=g, dtype=torch.float64)


def _step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(5)  # dropout / drop path draw the same masks in both runs
    out = model(x)
    out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()
    return out.detach()


@pytest.mark.parametrize("name", ["timm:vit_tiny_patch16_224", "timm:resnet18", "torchvision:resnet18",
                                  "cifar_resnet18", "hf-bert"])
def test_every_family_gives_the_same_gradients_outputs_and_statistics(name):
    plain, x = _family(name)
    checked = copy.deepcopy(plain)
    parts = enable_grad_checkpointing(checked)
    assert parts and checked.state_dict().keys() == plain.state_dict().keys()
    if name == "hf-bert":
        assert checked.is_gradient_checkpointing
        layer = checked.encoder.layer[0].attention  # inside the checkpointed layer
    else:
        layer = _first_block(checked)
    calls = _count_calls(layer)
    out_plain, out_checked = _step(plain, x), _step(checked, x)
    assert calls[0] == 2, f"the block ran {calls[0]} times: not recomputed"
    torch.testing.assert_close(out_checked, out_plain, rtol=0, atol=0)
    gc.assert_same(_grads_and_state(checked), _grads_and_state(plain))


def test_no_grad_and_eval_run_the_blocks_once():
    model = Blocks().double()
    enable_grad_checkpointing(model)
    calls = _count_calls(model.blocks[0])
    with torch.no_grad():
        model(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert calls[0] == 1


@pytest.mark.parametrize("name", sorted(gc.IMAGE_METHODS))
def test_every_image_method_steps_as_without_it(name):
    plain = gc.build(name, Blocks())
    checked = copy.deepcopy(plain)
    enable_grad_checkpointing(checked)
    calls = _count_calls(checked.encoder.blocks[0])
    batch = gc.batch_for(name, plain)
    torch.manual_seed(3)
    loss_plain = gc.whole_step(plain, batch)
    torch.manual_seed(3)
    loss_checked = gc.whole_step(checked, batch)
    assert calls[0] >= 2
    torch.testing.assert_close(loss_checked, loss_plain, rtol=1e-12, atol=0)
    gc.assert_same(_grads_and_state(checked), _grads_and_state(plain))


@pytest.mark.parametrize("name", ["mae", "ibot", "simmim"])
def test_masked_vit_methods_step_as_without_it(name):
    torch.manual_seed(0)
    if name == "simmim":
        plain = get_method("simmim", encoder="timm:vit_tiny_patch16_224", mask_patch_size=8,
                           encoder_kwargs=VIT).double().train()
    elif name == "mae":
        plain = get_method("mae", encoder="timm:vit_tiny_patch16_224", mask_ratio=0.75, decoder_dim=8,
                           decoder_depth=2, decoder_heads=2, encoder_kwargs=VIT).double().train()
    else:
        plain = get_method("ibot", encoder="timm:vit_tiny_patch16_224", out_dim=12, hidden_dim=16,
                           bottleneck_dim=8, encoder_kwargs={**VIT, "dynamic_img_size": True}).double().train()
    checked = copy.deepcopy(plain)
    parts = enable_grad_checkpointing(checked)
    assert any(p.startswith("encoder") for p in parts)
    calls = _count_calls(checked.encoder.blocks[0])
    g = torch.Generator().manual_seed(2)
    views = [torch.randn(4, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2 if name == "ibot" else 1)]
    losses = []
    for model in (plain, checked):
        torch.manual_seed(4)  # the masks, drop path
        losses.append(gc.whole_step(model, model.make_batch(views, step=1, total_steps=10)))
    assert calls[0] >= 2
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-12, atol=0)
    gc.assert_same(_grads_and_state(checked), _grads_and_state(plain))


@pytest.mark.parametrize("name", ["moco", "simclr"])
def test_with_gradient_caching_too(name):
    plain = gc.build(name, Blocks())
    checked = copy.deepcopy(plain)
    enable_grad_checkpointing(checked)
    batch = gc.batch_for(name, plain)
    torch.manual_seed(3)
    gc.cached_step(plain, batch, 2)
    torch.manual_seed(3)
    gc.cached_step(checked, batch, 2)
    gc.assert_same(_grads_and_state(checked), _grads_and_state(plain))


def test_a_backbone_without_block_sequences_is_one_line():
    with pytest.raises(GradCheckpointingError) as e:
        enable_grad_checkpointing(create_encoder("small_cnn"))
    assert "\n" not in str(e.value) and "leave the flag out" in str(e.value)


def test_the_engine_flag_reaches_the_method_and_refuses_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as stop:
        run(_Cfg, _moco, _pipeline, argv=["--grad-checkpointing", "--output-dir", str(tmp_path / "run")],
            name="t")
    assert "--grad-checkpointing: MoCo has no block sequence" in str(stop.value)
    assert "\n" not in str(stop.value)


@pytest.mark.slow
def test_the_engine_flag_trains_the_same_weights(tmp_path):
    """Through the engine: two steps of MoCo v2 on a CIFAR ResNet with --grad-checkpointing end
    at the run's weights without it (float64; BatchNorm in the backbone, EMA and queue)."""
    weights = {}
    for flag in (False, True):
        cfg = _Cfg(output_dir=str(tmp_path / str(flag)), encoder="cifar_resnet18", lr=0.1,
                              float64=True, grad_checkpointing=flag, save_every_steps=0)
        train(dataclasses.replace(cfg, steps=2), _moco, _pipeline, recipe="t")
        from safetensors.torch import load_file

        weights[flag] = load_file(next((tmp_path / str(flag)).rglob("model.safetensors")))
    assert weights[True].keys() == weights[False].keys()
    for k in weights[False]:
        torch.testing.assert_close(weights[True][k], weights[False][k], rtol=1e-9, atol=1e-12, msg=k)

