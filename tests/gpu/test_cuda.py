"""What the engine adds for GPUs, checked on a CUDA device (skipped elsewhere, with the reason):
channels_last by default, ``--compile`` of both encoders, no host synchronisation inside the
training step (``torch.cuda.set_sync_debug_mode("error")`` around the batch preparation and the
optimisation step), and the batched nvJPEG decode against the CPU decoders.

Run on a GPU machine: ``python -m pytest tests/gpu -q``.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

from contrastive.engine import ImageConfig, train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (GPU-only code paths)")


@dataclasses.dataclass
class _Cfg(ImageConfig):
    data: str = "synthetic:n=512,size=40"
    encoder: str = "torchvision:resnet18"
    image_size: int = 32
    batch_size: int = 64
    epochs: int = 1
    num_workers: int = 2
    progress: bool = False
    mixed_precision: str = "auto"
    save_every_steps: int = 0
    save_every_epochs: int = 0
    log_every: int = 1000


def _method(cfg, data):
    from contrastive.methods import MoCo

    return MoCo(encoder=cfg.encoder, version=2, dim=64, mlp_hidden=256, queue_size=1024,
                momentum=0.99, temperature=0.2, shuffle_bn=False)


def _pipeline(cfg):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size)  # jitter with hue, blur, gray


def _guarded(monkeypatch, seen: dict, guard_batch: bool = True) -> None:
    """Raise on any synchronising CUDA call inside the batch preparation (``guard_batch``) and
    the step (from the third step on: the first steps may initialise lazily)."""
    from contrastive.engine import trainer
    from contrastive.engine.kits import image as adapters

    step_fn, batch_fn = trainer.optimisation_step, adapters.ImageAdapter.batch

    def guarded(fn, at_step, *a, **kw):
        if at_step >= 2:
            torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*a, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    def step(model, batch, optimizer, acc, cfg, step_, *a, **kw):
        seen["steps"] = seen.get("steps", 0) + 1
        return guarded(step_fn, step_, model, batch, optimizer, acc, cfg, step_, *a, **kw)

    def batch(self, sample, needs, sched, *, device, step, micro, rank):
        out = guarded(batch_fn, step if guard_batch else -1, self, sample, needs, sched,
                      device=device, step=step, micro=micro, rank=rank)
        seen["channels_last"] = out["views"][0].is_contiguous(memory_format=torch.channels_last)
        return out

    monkeypatch.setattr(trainer, "optimisation_step", step)
    monkeypatch.setattr(adapters.ImageAdapter, "batch", batch)


def _jpeg_folder(root, n: int = 512) -> str:
    """``n`` small JPEGs (two classes) of assorted sizes, for ``--decode device``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        h, w = (int(v) for v in rng.integers(40, 90, 2))
        small = rng.integers(0, 256, (6, 6, 3)).astype("uint8")
        Image.fromarray(small).resize((w, h), Image.BICUBIC).save(root / f"c{i % 2}" / f"{i}.jpg",
                                                                  quality=90)
    return str(root)


@pytest.mark.parametrize("mode", ["eager", "compiled", "decode_device", "resident"])
def test_the_step_never_syncs_with_the_host_and_channels_last_is_the_default(
        tmp_path, fresh_accelerate, monkeypatch, caplog, mode):
    """The batch preparation too, except with ``--decode device`` (nvJPEG's batched decode
    waits for its own work)."""
    seen: dict = {}
    _guarded(monkeypatch, seen, guard_batch=mode != "decode_device")
    extra = {"compile": True} if mode == "compiled" else {}
    if mode == "decode_device":
        extra = {"decode": "device", "data": _jpeg_folder(tmp_path / "jpegs")}
    if mode == "resident":  # the data set on the GPU: the crops and the indices too
        extra = {"resident": True}
    cfg = _Cfg(output_dir=str(tmp_path / "run"), **extra)
    compile_ = mode == "compiled"
    with caplog.at_level(logging.INFO):
        train(cfg, _method, _pipeline, recipe="gpu")
    assert seen["steps"] == 8  # 512 images / 64, all of them under the guard from step 2
    assert seen["channels_last"] is True
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["channels_last"] is True and config["mixed_precision"] == "bf16"
    assert config["decode"] == ("device" if mode == "decode_device" else "worker")
    if compile_:
        assert "compiled (mode default): encoder, key_net.module" in caplog.text
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in metrics if "loss" in r)


def test_split_bn_keeps_nchw_by_default(tmp_path, fresh_accelerate):
    @dataclasses.dataclass
    class _Split(_Cfg):
        split_bn: int = 4

    def method(cfg, data):
        from contrastive.methods import MoCo

        return MoCo(encoder=cfg.encoder, version=2, dim=64, mlp_hidden=256, queue_size=1024,
                    split_bn=cfg.split_bn)

    train(_Split(output_dir=str(tmp_path / "run"), data="synthetic:n=128,size=40"), method,
          _pipeline, recipe="gpu")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["channels_last"] is False


def test_the_device_decoder_never_writes_memory_queued_kernels_still_read():
    """torchvision's CUDA decode_jpeg writes from its own stream into blocks the caching
    allocator may have just recycled from the current stream (pytorch/vision PR #9606): with
    kernels still queued there, they would read decoded pixels. ``decode_and_crop`` decodes
    with a side stream current; here kernels queued behind a long sleep read tensors freed
    just before the decode, which must still hold their values."""
    import io

    import numpy as np
    from PIL import Image

    from contrastive.augment import get_pipeline
    from contrastive.augment.device_decode import EncodedCrops, collate, decode_and_crop
    from contrastive.data.decode import EncodedImage

    crops = EncodedCrops(get_pipeline("mocov2", image_size=32).views)
    items, rng = [], np.random.default_rng(0)
    for i in range(16):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (64, 64, 3)).astype("uint8")).save(buf, "JPEG")
        items.append((crops(EncodedImage(buf.getvalue(), f"{i}.jpg")), 0))
    batch = collate(items)[0].pin_memory()
    bad = 0
    for _ in range(20):
        victims = [torch.full((3 * 64 * 64 // 4,), float(i + 1), device="cuda") for i in range(16)]
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)  # keeps the sums below queued while the decoder runs
        sums = torch.stack([v.sum() for v in victims])
        del victims  # freed on the current stream while their sums are still queued
        decode_and_crop(batch, [32, 32], "cuda")
        torch.cuda.synchronize()
        expected = torch.arange(1, 17, device="cuda", dtype=torch.float32) * (3 * 64 * 64 // 4)
        bad += int((sums != expected).sum())
    assert bad == 0


def test_resident_crops_and_knn_search_on_cuda_match_the_cpu():
    """``--resident``'s two device parts: the crops (roi_align on the GPU against the CPU, the
    same boxes: float32 rounding apart, at most 1 grey level) and the kNN monitor's torch search
    (the same neighbours as on the CPU, up to ties in float rounding)."""
    from contrastive.augment.device_crop import random_resized_boxes, resized_crops
    from contrastive.eval.knn import WeightedKNN

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (256, 3, 32, 32), dtype=torch.uint8, generator=g)
    boxes = random_resized_boxes(256, 32, 32, (0.08, 1.0), (3 / 4, 4 / 3), g)
    cpu, gpu = resized_crops(images, boxes, 32), resized_crops(images.cuda(), boxes, 32).cpu()
    assert (cpu.int() - gpu.int()).abs().max().item() <= 1
    bank, queries = torch.randn(5000, 128, generator=g), torch.randn(500, 128, generator=g)
    labels = torch.randint(0, 10, (5000,), generator=g)
    _, i_cpu = WeightedKNN(bank, labels, backend="torch").search(queries, 200)
    _, i_gpu = WeightedKNN(bank.cuda(), labels.cuda(), backend="torch").search(queries.cuda(), 200)
    assert torch.equal(i_cpu.sort(1).values, i_gpu.cpu().sort(1).values)
