"""Gradient caching (contrastive/engine/grad_cache.py): one step with the backbone in chunks gives
the whole batch's gradients and state updates, for every image method of the registry.

Everything in float64 with a backbone without batch norm (GroupNorm): the cached step differs
from the whole batch only by the order of floating-point sums (the weight gradients are summed
chunk by chunk), ~1e-16 relative per operation over ~1e3 operations, so ``rtol=1e-9,
atol=1e-12`` holds with a wide margin, while computing the loss per chunk (the mutation below)
changes values by > 1e-4.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from contrastive.engine.grad_cache import GradCache, GradCacheError, check_grad_cache
from contrastive.methods import get_method, list_methods, method_class

N = 6  # images per step; chunk 2 divides it, chunk 4 does not (4 + 2)


class Tiny(nn.Module):
    """A two-conv backbone with GroupNorm (no batch norm) and optional dropout."""

    def __init__(self, dropout: float = 0.0, bn: bool = False) -> None:
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.GroupNorm(2, c))
        self.net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), norm(6), nn.ReLU(),
                                 nn.Dropout(dropout), nn.Conv2d(6, 8, 3, stride=2, padding=1),
                                 norm(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


GLOBAL, LOCAL = 8, 4  # crop sizes in pixels
#: per image method: small keyword arguments and the views' sizes
IMAGE_METHODS: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "barlowtwins": (dict(dim=8, mlp_hidden=8), (GLOBAL, GLOBAL)),
    "byol": (dict(dim=4, mlp_hidden=8), (GLOBAL, GLOBAL)),
    "dcl": (dict(dim=4, mlp_hidden=8), (GLOBAL, GLOBAL)),
    "dclw": (dict(dim=4, mlp_hidden=8), (GLOBAL, GLOBAL)),
    "dino": (dict(out_dim=16, hidden_dim=8, bottleneck_dim=4), (GLOBAL, GLOBAL, LOCAL, LOCAL)),
    "moco": (dict(dim=4, mlp_hidden=8, queue_size=16, symmetric=True), (GLOBAL, GLOBAL)),
    "mocov3": (dict(dim=4, mlp_hidden=8), (GLOBAL, GLOBAL)),
    "nnclr": (dict(dim=4, proj_hidden=8, pred_hidden=8, support_size=16), (GLOBAL, GLOBAL)),
    "simclr": (dict(dim=4, mlp_hidden=8), (GLOBAL, GLOBAL, LOCAL)),
    "simsiam": (dict(dim=4, proj_hidden=8, pred_hidden=8), (GLOBAL, GLOBAL)),
    "supcon": (dict(dim=4, mlp_hidden=8), (GLOBAL, GLOBAL)),
    "swav": (dict(dim=4, mlp_hidden=8, num_prototypes=6, queue_size=12), (GLOBAL, GLOBAL, LOCAL)),
    "vicreg": (dict(dim=8, mlp_hidden=8), (GLOBAL, GLOBAL)),
}
#: image methods whose loss reads more than the backbone's output: caching refused
#: (mae, ibot, simmim, ijepa, msn: masked ViT tokens)
NOT_CACHEABLE = {"deepinfomax", "distill", "mae", "ibot", "simmim", "densecl", "ijepa", "msn", "vicregl"}
OTHER_MODALITIES = {"clip", "siglip", "simcse", "lrcbert", "textclassifier"}  # own tests below
#: supervised fine-tuning (contrastive-finetune; tests/eval/test_finetune.py), not pretraining
SUPERVISED = {"imageclassifier"}


def build(name: str, encoder: nn.Module | None = None) -> nn.Module:
    kwargs, _ = IMAGE_METHODS[name]
    torch.manual_seed(0)
    method = get_method(name, encoder=encoder or Tiny(), **kwargs).double()
    if name == "swav":  # a full queue, so that the step uses it in the Sinkhorn
        method.queue_rows.fill_(method.queue.size)
    return method.train()


def batch_for(name: str, method: nn.Module, n: int = N, seed: int = 1) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(n, 3, s, s, generator=g, dtype=torch.float64)
             for s in IMAGE_METHODS[name][1]]
    return method.make_batch(views, step=3, total_steps=10,
                             labels=torch.tensor([0, 1, 0, 2, 1, 2] * (n // 6 + 1))[:n])


def whole_step(method: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    loss = method(batch)["loss"]
    loss.backward()
    return loss.detach()


def cached_step(method: nn.Module, batch: dict[str, Any], chunk: int, **kw: Any) -> torch.Tensor:
    cache = GradCache(method, chunk, **kw)
    with cache.recording():
        loss = method(batch)["loss"]
    loss.backward()
    cache.backward()
    return loss.detach()


def per_chunk_step(method: nn.Module, batch: dict[str, Any], chunk: int) -> torch.Tensor:
    """The mutation: the loss computed per chunk (accumulation), not on the whole batch."""
    n, total = batch["views"][0].shape[0], 0.0
    for s in range(0, n, chunk):
        part = {k: [v[s:s + chunk] for v in val] if k == "views" else
                val[s:s + chunk] if isinstance(val, torch.Tensor) and val.dim() else val
                for k, val in batch.items()}
        loss = method(part)["loss"] * (min(chunk, n - s) / n)
        loss.backward()
        total += float(loss.detach())
    return torch.tensor(total, dtype=torch.float64)


def state(method: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient and every state entry (EMA copies, queues, centres)."""
    out = {f"grad.{k}": p.grad for k, p in method.named_parameters() if p.grad is not None}
    out.update({f"state.{k}": v for k, v in method.state_dict().items()})
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-9, atol=1e-12, msg=lambda m, k=k: f"{k}: {m}")


def test_every_image_method_of_the_registry_is_covered():
    image = {n for n in list_methods() if "views" in getattr(method_class(n), "needs", ())}
    missing = image - set(IMAGE_METHODS) - NOT_CACHEABLE - OTHER_MODALITIES - SUPERVISED
    assert not missing, (f"add {sorted(missing)} to IMAGE_METHODS (small kwargs and view "
                         "sizes) or, when its loss reads more than the backbone's output, "
                         "set its backbones = () and add it to NOT_CACHEABLE")


@pytest.mark.parametrize("chunk", [2, 4])
@pytest.mark.parametrize("name", sorted(IMAGE_METHODS))
def test_cached_step_equals_the_whole_batch(name, chunk):
    ref = build(name)
    cached = copy.deepcopy(ref)
    batch = batch_for(name, ref)
    loss_ref = whole_step(ref, batch)
    loss = cached_step(cached, batch, chunk)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-12, atol=1e-12)
    grads = [p.grad for p in cached.encoder.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)  # the backbone did learn
    assert_same(state(cached), state(ref))


@pytest.mark.parametrize("name", sorted(IMAGE_METHODS))
def test_the_comparison_catches_a_loss_computed_per_chunk(name):
    ref = build(name)
    mutant = copy.deepcopy(ref)
    batch = batch_for(name, ref)
    whole_step(ref, batch)
    per_chunk_step(mutant, batch, 2)
    with pytest.raises(AssertionError):
        assert_same(state(mutant), state(ref))


@pytest.mark.parametrize("name", sorted(NOT_CACHEABLE))
def test_methods_reading_more_than_the_backbone_output_are_refused(name):
    assert method_class(name).backbones == ()
    with pytest.raises(GradCacheError, match="no backbone the engine can cache"):
        check_grad_cache(method_class(name).__new__(method_class(name)), 4, 1)


def test_calling_a_backbone_method_inside_a_cached_step_is_a_clear_error():
    class Odd(nn.Module):
        needs = ("views",)

        def __init__(self) -> None:
            super().__init__()
            self.encoder = Tiny()

        def forward(self, batch):
            return {"loss": self.encoder.features(batch["views"][0]).sum()}

    class Features(Tiny):
        def features(self, x):
            return self.net(x)

    m = Odd().double()
    m.encoder = Features().double()
    assert m.encoder.num_features == 8
    cache = GradCache(m, 2)
    with pytest.raises(GradCacheError, match=r"Odd.encoder.features\(\) was called"), \
            cache.recording():
        m({"views": [torch.zeros(4, 3, 8, 8, dtype=torch.float64)]})
    assert type(m.encoder) is Features  # the proxy is gone after the error


def test_an_input_changed_in_place_after_the_call_is_a_clear_error():
    class Inplace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = Tiny()

        def forward(self, batch):
            x = batch["views"][0]
            h = self.encoder(x)
            x.mul_(2.0)
            return {"loss": h.sum()}

    m = Inplace().double()
    cache = GradCache(m, 2)
    with cache.recording():
        loss = m({"views": [torch.ones(4, 3, 8, 8, dtype=torch.float64)]})["loss"]
    loss.backward()
    with pytest.raises(GradCacheError, match="changed in place"):
        cache.backward()


def test_batch_norm_backbone_differs_by_its_per_chunk_statistics_and_updates_them_once():
    """The documented difference: a BN backbone normalises each chunk with its own statistics.
    Measured here (printed by -s): the backbone's relative gradient difference for 12
    images in chunks of 4 with this toy (1.6), far above rounding (it shrinks as chunks grow); the
    running statistics are those of ONE pass over the chunks, never of two."""
    ref = build("simclr", Tiny(bn=True))
    cached = copy.deepcopy(ref)
    batch = batch_for("simclr", ref, n=12)
    expect = copy.deepcopy(ref.encoder)
    with torch.no_grad():  # what the first pass alone does to the running statistics
        for v in batch["views"]:
            for s in range(0, 12, 4):
                expect(v[s:s + 4])
    whole_step(ref, batch)
    cached_step(cached, batch, 4)
    g_ref = torch.cat([p.grad.flatten() for p in ref.encoder.parameters()])
    g = torch.cat([p.grad.flatten() for p in cached.encoder.parameters()])
    rel = float((g - g_ref).norm() / g_ref.norm())
    print(f"BN backbone, chunks of 4 of 12: relative gradient difference {rel:.3g}")
    assert rel > 1e-3
    for b, e in zip(cached.encoder.buffers(), expect.buffers()):
        torch.testing.assert_close(b, e, rtol=1e-12, atol=1e-12)


# ---- the engine's step: --grad-accum-steps through the cache ------------------------------------

def _steps(name: str, accum: int, cached: bool, steps: int = 2) -> dict[str, torch.Tensor]:
    """``steps`` optimiser steps of ``name`` through :func:`optimisation_step`, each batch of N
    images served in ``accum`` micro-batches; the method's state afterwards."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from contrastive.engine import reset_accelerate_state
    from contrastive.engine.run_log import ScalarWindow
    from contrastive.engine.step import NonFiniteGuard, Updater, optimisation_step

    reset_accelerate_state()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=accum)
    method = build(name)
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.5)
    model, opt = acc.prepare(method, opt)
    up, cfg = Updater(model, opt, acc), SimpleNamespace(on_nonfinite="stop", clip_grad_norm=0.0)
    cache = GradCache(method, N // accum) if cached else None
    guard, window = NonFiniteGuard(acc.device), ScalarWindow()
    for step in range(steps):
        batch = batch_for(name, method, seed=10 + step)
        part = N // accum
        for i in range(accum):
            micro = {k: [v[i * part:(i + 1) * part] for v in val] if k == "views" else
                     val[i * part:(i + 1) * part] if isinstance(val, torch.Tensor) and val.dim()
                     else val for k, val in batch.items()}
            optimisation_step(model, micro, opt, acc, cfg, step, guard, window, updater=up,
                              cache=cache)
    assert len(window.means(acc)) > 0
    return {k: v.detach().clone() for k, v in method.state_dict().items()}


@pytest.mark.parametrize("name", ["moco", "byol"])
def test_accumulation_equals_the_whole_batch_and_the_old_accumulation_did_not(name,
                                                                               fresh_accelerate):
    """Two optimiser steps (the EMA of step 0 is a no-op: target == online), float64."""
    whole = _steps(name, 1, cached=False)
    assert_same(_steps(name, 2, cached=True), whole)
    assert_same(_steps(name, 3, cached=True), whole)
    with pytest.raises(AssertionError):  # per micro-batch: EMA and queue k times, BN heads
        assert_same(_steps(name, 2, cached=False), whole)


@pytest.mark.parametrize("name", ["simclr", "supcon", "nnclr", "barlowtwins", "vicreg", "clip",
                                  "simcse", "mocov3", "dcl"])
def test_accumulation_is_refused_where_the_loss_couples_samples(name):
    method = method_class(name).__new__(method_class(name))
    with pytest.raises(GradCacheError, match=r"^--grad-accum-steps 2 with .*couples the samples"
                                             r".*--grad-cache-chunk N instead"):
        check_grad_cache(method, 0, 2)
    assert check_grad_cache(method, 4, 1) == "cache"


def test_accumulation_is_refused_for_ibot_which_cannot_be_cached_either():
    method = method_class("ibot").__new__(method_class("ibot"))
    with pytest.raises(GradCacheError, match=r"^--grad-accum-steps 2 with IBOT: .*couples the "
                                             r"samples.*smaller --batch-size, or more processes"):
        check_grad_cache(method, 0, 2)


@pytest.mark.parametrize("name", ["moco", "byol", "dino", "simsiam", "swav"])
def test_accumulation_of_per_sample_methods_goes_through_the_cache(name):
    assert check_grad_cache(method_class(name).__new__(method_class(name)), 0, 4) == "cache"


# ---- the run's settings ------------------------------------------------------------------------

def _simclr_run(tmp_path, **kw: Any):
    import dataclasses

    from contrastive.augment import get_pipeline
    from contrastive.engine import ImageConfig, train
    from contrastive.methods import SimCLR

    @dataclasses.dataclass
    class Cfg(ImageConfig):
        data: str = "synthetic:n=32,size=16"
        encoder: str = "small_cnn"
        image_size: int = 16
        batch_size: int = 8
        epochs: int = 1
        num_workers: int = 0
        progress: bool = False
        mixed_precision: str = "no"
        save_every_steps: int = 1

    cfg = Cfg(output_dir=str(tmp_path / "run"), **kw)
    return train(cfg, lambda c, data: SimCLR(encoder="small_cnn", dim=8, mlp_hidden=16),
                 lambda c: get_pipeline("mocov2", image_size=16), recipe="gc")


def test_the_chunk_is_a_setting_of_the_run_and_older_run_folders_resume(tmp_path,
                                                                       fresh_accelerate):
    import json

    from contrastive.engine.compat import IncompatibleCheckpointError

    _simclr_run(tmp_path, grad_cache_chunk=4, max_steps=1)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["grad_cache_chunk"] == 4 and config["resolved"]["grad_cache_chunk"] == 4
    meta_path = tmp_path / "run" / "checkpoints" / "step_00000001" / "meta.json"
    assert json.loads(meta_path.read_text())["config"]["grad_cache_chunk"] == 4
    with pytest.raises(IncompatibleCheckpointError, match=r"grad_cache_chunk: 4 -> 2"):
        _simclr_run(tmp_path, grad_cache_chunk=2, max_steps=2, resume="auto")
    # a run folder written before the option existed: its checkpoint has no such field
    old = tmp_path / "old"
    _simclr_run(old, max_steps=1)
    meta_path = old / "run" / "checkpoints" / "step_00000001" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["config"]["grad_cache_chunk"]
    meta_path.write_text(json.dumps(meta))
    result = _simclr_run(old, max_steps=2, resume="auto")
    assert result.steps_trained == 1 and result.step == 2


# ---- randomness in the backbone: dropout replayed ------------------------------------------------

class _ChunkedWithGrad(nn.Module):
    """The reference for a backbone with dropout: the backbone run chunk by chunk WITH gradient in
    one graph, so that it draws the same masks as the cache's first pass."""

    def __init__(self, inner: nn.Module, chunk: int) -> None:
        super().__init__()
        self.inner, self.chunk = inner, chunk

    def forward(self, *args: Any) -> torch.Tensor:
        n = args[0].shape[0]
        return torch.cat([self.inner(*[a[s:s + self.chunk] if isinstance(a, torch.Tensor)
                                        else a for a in args]) for s in range(0, n, self.chunk)])


def _simcse() -> tuple[nn.Module, dict[str, Any]]:
    from contrastive.methods import SimCSE

    torch.manual_seed(0)
    m = SimCSE(encoder="bert", encoder_kwargs=dict(num_layers=1, hidden_size=16, num_heads=2,
                                                   intermediate_size=16, vocab_size=40,
                                                   max_position_embeddings=16, dropout=0.3,
                                                   attention_dropout=0.3))
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 40, (6, 7), generator=g)
    mask = torch.ones(6, 7, dtype=torch.long)
    mask[::2, 5:] = 0  # padding
    return m.double().train(), {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("chunk", [4, 5])
def test_dropout_in_the_backbone_is_equal_only_with_the_replay(chunk):
    """SimCSE (unsupervised: each sentence twice, 12 rows in one backbone call) with dropout 0.3:
    the cached gradient equals the one of the same masks (the backbone run chunk by chunk in one
    graph) when the second pass replays the first pass's random state, and differs without."""
    ref, batch = _simcse()
    cached, plain = copy.deepcopy(ref), copy.deepcopy(ref)
    ref._modules["encoder"] = _ChunkedWithGrad(ref.encoder, chunk)
    torch.manual_seed(7)
    whole_step(ref, batch)
    torch.manual_seed(7)
    cached_step(cached, batch, chunk)
    grads = {k: p.grad for k, p in cached.named_parameters() if p.grad is not None}
    ref_grads = {k.replace("encoder.inner.", "encoder."): p.grad
                 for k, p in ref.named_parameters() if p.grad is not None}
    assert_same(grads, ref_grads)
    torch.manual_seed(7)
    cached_step(plain, batch, chunk, replay_rng=False)
    no_replay = {k: p.grad for k, p in plain.named_parameters() if p.grad is not None}
    with pytest.raises(AssertionError):
        assert_same(no_replay, ref_grads)
    after = torch.get_rng_state()  # the second pass leaves the stream where the first left it
    torch.manual_seed(7)
    cached_step(copy.deepcopy(plain), batch, chunk)
    assert torch.equal(torch.get_rng_state(), after)


@pytest.mark.parametrize("chunk", [2, 4])
@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_image_text_methods_cache_both_towers_exactly(name, chunk):
    """CLIP and SigLIP: the image backbone and the text backbone (a BERT without dropout) both
    run in chunks; float64 gradients equal the whole batch's."""
    torch.manual_seed(0)
    text = dict(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=16, vocab_size=40,
                max_position_embeddings=16, dropout=0.0, attention_dropout=0.0)
    ref = get_method(name, encoder=Tiny(), text_encoder="bert", dim=4,
                     text_kwargs=text).double().train()
    assert GradCache(ref, chunk).names == ("encoder", "text_encoder")
    cached = copy.deepcopy(ref)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 40, (N, 7), generator=g)
    mask = torch.ones(N, 7, dtype=torch.long)
    mask[1::2, 4:] = 0
    batch = ref.make_batch([torch.randn(N, 3, 8, 8, generator=g, dtype=torch.float64)],
                           input_ids=ids, attention_mask=mask)
    whole_step(ref, batch)
    cached_step(cached, batch, chunk)
    assert cached.text_encoder.model.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert_same(state(cached), state(ref))


def test_the_second_pass_runs_under_the_first_pass_autocast():
    """bf16 autocast (the engine's mixed precision): the backbone's second pass runs in bf16
    as its first did, and the gradients match the whole batch's to bf16 precision."""
    ref = get_method("simclr", encoder=Tiny(), dim=4, mlp_hidden=8).train()
    cached = copy.deepcopy(ref)
    dtypes: list[torch.dtype] = []
    cached.encoder.register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    g = torch.Generator().manual_seed(0)
    batch = ref.make_batch([torch.randn(N, 3, 8, 8, generator=g) for _ in range(2)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_ref = ref(batch)["loss"]
    loss_ref.backward()
    cache = GradCache(cached, 4)
    with cache.recording(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = cached(batch)["loss"]
    loss.backward()
    cache.backward()
    assert dtypes == [torch.bfloat16] * 8  # 2 views x 2 chunks, twice
    g = torch.cat([p.grad.flatten() for p in cached.parameters()])
    g_ref = torch.cat([p.grad.flatten() for p in ref.parameters()])
    assert float((g - g_ref).norm() / g_ref.norm()) < 2e-2  # bf16 rounding (8 bits), per chunk


def test_a_cached_run_keeps_the_online_probe_and_the_knn_monitor(tmp_path, fresh_accelerate):
    """The probe reads the backbone after the step and the monitor between steps: neither sees
    the proxies, and both report as in a plain run."""
    import json

    _simclr_run(tmp_path, grad_cache_chunk=3, max_steps=4, online_probe=True, knn_every=1,
                data="shapes:n=32,n_test=16,size=16", log_every=2)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("probe_top1") is not None for r in rows), rows
    assert any("knn_top1" in r for r in rows), rows
    assert all(r["loss"] == r["loss"] for r in rows if "loss" in r)  # finite, not NaN
